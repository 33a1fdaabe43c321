//! Finding profile files and following `extends`.
//!
//! `extends = "base"` looks for `base.toml` in the extending file's own directory, then in each
//! extra search directory (the user's `$CONFIG/profiles`, when the caller adds it), then among
//! the profiles shipped inside the binary. A file never finds itself, so
//! `~/.config/gpupilot/profiles/base.toml` may say `extends = "base"` to adjust the shipped one.
//! A name with a `/` is a path relative to the extending file's directory. Loops are refused.

use std::path::{Path, PathBuf};

use super::error::{Diagnostic, ProfileError};
use super::raw::{self, At, RawProfile};
use super::{Profile, validate};

/// The profiles shipped with gpupilot (`profiles/*.toml`), by name: what `extends` falls back
/// to, and examples users copy.
pub const SHIPPED: &[(&str, &str)] = &[
    ("base", include_str!("../../profiles/base.toml")),
    (
        "train-simple",
        include_str!("../../profiles/train-simple.toml"),
    ),
    (
        "train-resilient",
        include_str!("../../profiles/train-resilient.toml"),
    ),
    (
        "torchrun-8gpu",
        include_str!("../../profiles/torchrun-8gpu.toml"),
    ),
    (
        "shell-pipeline",
        include_str!("../../profiles/shell-pipeline.toml"),
    ),
    ("ranks-4", include_str!("../../profiles/ranks-4.toml")),
];

/// Longest `extends` chain followed before giving up (a chain this long is a mistake).
const MAX_DEPTH: usize = 16;

/// One file taking part in a load.
#[derive(Debug)]
pub(crate) struct SourceFile {
    /// How messages name it: the path as given, or `<shipped>/NAME.toml`.
    pub display: String,
    pub text: String,
    /// Its directory, absolute (None for shipped or in-memory text).
    pub dir: Option<PathBuf>,
    /// Identity for cycle detection: the canonical path, or the display name.
    key: String,
    /// File stem: the profile's default name.
    pub stem: String,
    shipped: bool,
}

impl SourceFile {
    fn shipped(name: &str, text: &str) -> SourceFile {
        SourceFile {
            display: format!("<shipped>/{name}.toml"),
            text: text.to_string(),
            dir: None,
            key: format!("<shipped>/{name}.toml"),
            stem: name.to_string(),
            shipped: true,
        }
    }

    fn read(path: &Path, display: String) -> Result<SourceFile, ProfileError> {
        let read_err = |error| ProfileError::Read {
            path: path.to_path_buf(),
            error,
        };
        let text = read_text(path).map_err(read_err)?;
        let abs = std::path::absolute(path).map_err(read_err)?;
        let key = std::fs::canonicalize(path)
            .unwrap_or_else(|_| abs.clone())
            .display()
            .to_string();
        Ok(SourceFile {
            display,
            text,
            dir: abs.parent().map(Path::to_path_buf),
            key,
            stem: path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default(),
            shipped: false,
        })
    }

    /// A diagnostic at a span of this file.
    pub fn diag(&self, span: Option<std::ops::Range<usize>>, message: String) -> Diagnostic {
        Diagnostic::at(&self.display, &self.text, span, message)
    }
}

/// The most a profile file may hold: far more than any profile needs.
pub const MAX_PROFILE_BYTES: u64 = 1 << 20;

/// A profile file's text: a regular file of at most [`MAX_PROFILE_BYTES`]. Opened without
/// blocking, so that a named pipe is refused at once instead of waiting for a writer.
fn read_text(path: &Path) -> std::io::Result<String> {
    use std::io::{Error, ErrorKind, Read as _};
    use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)?;
    let kind = file.metadata()?.file_type();
    let what = if kind.is_file() {
        None
    } else if kind.is_dir() {
        Some("a directory")
    } else if kind.is_fifo() {
        Some("a named pipe")
    } else if kind.is_socket() {
        Some("a socket")
    } else {
        Some("a device")
    };
    if let Some(what) = what {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("it is {what}, not a regular file: give a profile's .toml file"),
        ));
    }
    let mut text = String::new();
    file.take(MAX_PROFILE_BYTES + 1).read_to_string(&mut text)?;
    if text.len() as u64 > MAX_PROFILE_BYTES {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "it is larger than {} MiB, which no profile needs",
                MAX_PROFILE_BYTES >> 20
            ),
        ));
    }
    Ok(text)
}

/// Loads profiles; holds where `extends` looks besides the extending file's directory.
#[derive(Debug, Clone, Default)]
pub struct Loader {
    search_dirs: Vec<PathBuf>,
}

impl Loader {
    /// A loader that looks in the extending file's directory, then the shipped profiles.
    pub fn new() -> Loader {
        Loader::default()
    }

    /// Also look in `dir` (after the extending file's directory, before the shipped profiles).
    pub fn with_search_dir(mut self, dir: impl Into<PathBuf>) -> Loader {
        self.search_dirs.push(dir.into());
        self
    }

    /// Load and check the profile file at `path`.
    pub fn load(&self, path: &Path) -> Result<Profile, ProfileError> {
        let root = SourceFile::read(path, path.display().to_string())?;
        self.resolve(root, Some(path))
    }

    /// Load and check profile text that has no file; `display` names it in messages.
    pub fn load_str(&self, display: &str, text: &str) -> Result<Profile, ProfileError> {
        let stem = Path::new(display)
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let root = SourceFile {
            display: display.to_string(),
            text: text.to_string(),
            dir: None,
            key: format!("<text>/{display}"),
            stem,
            shipped: false,
        };
        self.resolve(root, None)
    }

    /// Load a shipped profile by name (`"train-simple"`).
    pub fn load_shipped(&self, name: &str) -> Option<Result<Profile, ProfileError>> {
        let (name, text) = SHIPPED.iter().find(|(n, _)| *n == name)?;
        Some(self.resolve(SourceFile::shipped(name, text), None))
    }

    fn resolve(&self, root: SourceFile, path: Option<&Path>) -> Result<Profile, ProfileError> {
        let mut files = vec![root];
        let mut merged = parse(&files[0], 0)?;
        let mut pending = merged.extends.take();
        while let Some(ext) = pending {
            let requester = files.len() - 1;
            if files.len() > MAX_DEPTH {
                return Err(ProfileError::Extends(files[requester].diag(
                    Some(ext.span),
                    format!("extends chain longer than {MAX_DEPTH} files; is it meant to be?"),
                )));
            }
            let parent = self.find(&ext, &files[requester])?;
            if files.iter().any(|f| f.key == parent.key) {
                let chain: Vec<&str> = files
                    .iter()
                    .map(|f| f.display.as_str())
                    .chain([parent.display.as_str()])
                    .collect();
                return Err(ProfileError::Extends(files[requester].diag(
                    Some(ext.span),
                    format!(
                        "extends cycle: {}; a profile cannot extend itself, even indirectly",
                        chain.join(" → ")
                    ),
                )));
            }
            files.push(parent);
            let index = files.len() - 1;
            let mut parent_raw = parse(&files[index], index)?;
            pending = parent_raw.extends.take();
            merged = merged.merge_over(parent_raw);
        }
        validate::resolve(merged, &files, path)
    }

    /// The file `extends = NAME` in `requester` refers to.
    fn find(&self, ext: &At<String>, requester: &SourceFile) -> Result<SourceFile, ProfileError> {
        let name = ext.value.as_str();
        let not_found = |message: String| {
            ProfileError::Extends(requester.diag(Some(ext.span.clone()), message))
        };
        if name.trim().is_empty() {
            return Err(not_found(
                "extends is empty: name a profile, like extends = \"base\"".into(),
            ));
        }
        let file_name = if name.ends_with(".toml") {
            name.to_string()
        } else {
            format!("{name}.toml")
        };
        let is_path = name.contains('/');
        let mut dirs: Vec<PathBuf> = Vec::new();
        if !requester.shipped {
            dirs.extend(requester.dir.clone());
            if !is_path {
                dirs.extend(self.search_dirs.iter().cloned());
            }
        }
        let mut looked = Vec::new();
        for dir in &dirs {
            let candidate = dir.join(&file_name);
            looked.push(dir.display().to_string());
            if !candidate.is_file() {
                continue;
            }
            let display = match &requester.dir {
                // Name it as the user would: relative to the extending file's own path.
                Some(d) if d == dir => Path::new(&requester.display)
                    .parent()
                    .map(|p| p.join(&file_name))
                    .unwrap_or_else(|| PathBuf::from(&file_name))
                    .display()
                    .to_string(),
                _ => candidate.display().to_string(),
            };
            let file = SourceFile::read(&candidate, display)?;
            if file.key != requester.key {
                return Ok(file);
            }
        }
        if !is_path {
            let stem = file_name.trim_end_matches(".toml");
            if let Some((n, text)) = SHIPPED.iter().find(|(n, _)| *n == stem) {
                let file = SourceFile::shipped(n, text);
                if file.key != requester.key {
                    return Ok(file);
                }
            }
        }
        let shipped: Vec<&str> = SHIPPED.iter().map(|(n, _)| *n).collect();
        let mut places = looked;
        if !is_path {
            places.push(format!("the shipped profiles ({})", shipped.join(", ")));
        }
        Err(not_found(format!(
            "extends = \"{name}\": no {file_name} in {}",
            places.join(", ")
        )))
    }
}

fn parse(file: &SourceFile, index: usize) -> Result<RawProfile, ProfileError> {
    raw::parse_file(&file.text, index).map_err(|e| {
        let message = e.message().trim_end().replace('\n', "; ");
        ProfileError::Parse(file.diag(e.span(), message))
    })
}
