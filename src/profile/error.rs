//! Profile errors: every problem names the file, line and column it comes from.
//!
//! The first line of each message is `FILE:LINE:COL: what is wrong`, the form editors and
//! `grep` understand; the offending source line and a caret follow, as rustc shows them.

use std::fmt;
use std::ops::Range;
use std::path::PathBuf;

/// One problem at one place in one profile file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// The file as the user named it (or `<shipped>/NAME.toml` for an embedded profile).
    pub path: String,
    /// 1-based line and column (in characters), when the problem has a place.
    pub line: Option<usize>,
    pub col: Option<usize>,
    pub message: String,
    /// The source line and a caret under the offending text, when known.
    pub snippet: Option<String>,
}

impl Diagnostic {
    /// A problem at a byte span of `text`.
    pub(crate) fn at(path: &str, text: &str, span: Option<Range<usize>>, message: String) -> Self {
        let Some(span) = span else {
            return Diagnostic {
                path: path.to_string(),
                line: None,
                col: None,
                message,
                snippet: None,
            };
        };
        let start = floor_char_boundary(text, span.start.min(text.len()));
        let end = floor_char_boundary(text, span.end.clamp(start, text.len()));
        let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
        let line_end = text[start..].find('\n').map_or(text.len(), |i| start + i);
        let line = text[..start].matches('\n').count() + 1;
        let col = text[line_start..start].chars().count() + 1;
        let source_line = text[line_start..line_end].trim_end_matches('\r');
        let width = text[start..end.min(line_end)].chars().count().max(1);
        let gutter = line.to_string().len();
        let snippet = format!(
            "{:gutter$} |\n{line} | {source_line}\n{:gutter$} | {}{}",
            "",
            "",
            " ".repeat(col - 1),
            "^".repeat(width),
        );
        Diagnostic {
            path: path.to_string(),
            line: Some(line),
            col: Some(col),
            message,
            snippet: Some(snippet),
        }
    }

    /// `FILE:LINE:COL` (or just `FILE`).
    pub fn location(&self) -> String {
        match (self.line, self.col) {
            (Some(l), Some(c)) => format!("{}:{l}:{c}", self.path),
            _ => self.path.clone(),
        }
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.location(), self.message)?;
        if let Some(snippet) = &self.snippet {
            write!(f, "\n{snippet}")?;
        }
        Ok(())
    }
}

/// Why a profile could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// The file (or a file it extends) could not be read.
    /// The reason is in the message and not a `source`, so that a chain (`{:#}`) does not
    /// say it twice.
    #[error("{}: cannot read the profile: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    /// Not valid TOML, an unknown key, or a value of the wrong type.
    #[error("{0}")]
    Parse(Diagnostic),
    /// `extends` names a profile that is not found, or the chain loops.
    #[error("{0}")]
    Extends(Diagnostic),
    /// Well-formed, but the values do not make a runnable profile (all problems, in file order).
    #[error("{}", list(.0))]
    Invalid(Vec<Diagnostic>),
}

impl ProfileError {
    /// Every diagnostic this error carries (empty for a read error).
    pub fn diagnostics(&self) -> Vec<&Diagnostic> {
        match self {
            ProfileError::Read { .. } => Vec::new(),
            ProfileError::Parse(d) | ProfileError::Extends(d) => vec![d],
            ProfileError::Invalid(ds) => ds.iter().collect(),
        }
    }
}

fn list(ds: &[Diagnostic]) -> String {
    ds.iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_and_column_count_characters() {
        let text = "a = 1\n# é\nbad = 2\n";
        let start = text.find("bad").unwrap();
        let d = Diagnostic::at("f.toml", text, Some(start..start + 3), "nope".into());
        assert_eq!((d.line, d.col), (Some(3), Some(1)));
        assert_eq!(d.location(), "f.toml:3:1");
        let s = d.to_string();
        assert!(s.starts_with("f.toml:3:1: nope\n"), "{s}");
        assert!(s.contains("3 | bad = 2\n  | ^^^"), "{s}");

        let text = "x = \"é\" y";
        let start = text.find('y').unwrap();
        let d = Diagnostic::at("f.toml", text, Some(start..start + 1), "m".into());
        assert_eq!((d.line, d.col), (Some(1), Some(9)));
    }

    #[test]
    fn no_span_means_file_only() {
        let d = Diagnostic::at("f.toml", "", None, "missing".into());
        assert_eq!(d.to_string(), "f.toml: missing");
    }
}
