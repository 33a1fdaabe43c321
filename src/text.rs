//! Text that someone else wrote, made safe to show: process names, commands, run names, user
//! names, hook output, GPU names, reasons given with a request, anything a peer or a file
//! supplies. A leaf: it imports nothing of the crate, so every layer that writes to a terminal
//! or to a line-oriented log (the command line, the daemon's log, the console) uses it.
//!
//! A terminal obeys what it is sent: `ESC [2J` clears an operator's screen, a newline forges a
//! line of its own in a table or a log, a bidi override shows text in another order than it
//! runs. [`printable`] shows each of those as an escape that reads as what it is, and nothing
//! else changes: a plain name stays as it was.

/// The most characters [`printable`] returns: a table cell or one log line never needs more,
/// and a hostile peer's megabyte of text stays out of the daemon's log.
pub const MAX_CHARS: usize = 4096;

/// `text` as a terminal or a line of a log can show it: newline, carriage return and tab as
/// `\n`, `\r`, `\t`; every other control character (C0, DEL, C1; ESC among them) as `\xNN`;
/// characters that reorder or hide text (bidi marks, embeddings, overrides and isolates,
/// line and paragraph separators, zero-width space, byte order mark) as `\u{NNNN}`. Longer
/// than [`MAX_CHARS`] once escaped, it is cut at a whole character or escape and ends in `…`.
///
/// A backslash is left as it is, so applying `printable` twice changes nothing more than
/// once: a writer may escape text another layer already escaped.
pub fn printable(text: &str) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(text.len());
    // The output's length in characters, and where to cut it (the last whole piece after
    // which a `…` still fits) should it grow past the limit.
    let mut chars = 0;
    let mut cut = None;
    let mut piece = String::new();
    for c in text.chars() {
        piece.clear();
        match c {
            '\n' => piece.push_str("\\n"),
            '\r' => piece.push_str("\\r"),
            '\t' => piece.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(piece, "\\x{:02x}", u32::from(c));
            }
            c if hides_or_reorders(c) => {
                let _ = write!(piece, "\\u{{{:x}}}", u32::from(c));
            }
            c => piece.push(c),
        }
        let n = piece.chars().count();
        if cut.is_none() && chars + n > MAX_CHARS - 1 {
            cut = Some(out.len());
        }
        chars += n;
        if chars > MAX_CHARS {
            out.truncate(cut.unwrap_or(0));
            out.push('…');
            return out;
        }
        out.push_str(&piece);
    }
    out
}

/// Characters a terminal draws as nothing, or that change the order of what follows them.
fn hides_or_reorders(c: char) -> bool {
    matches!(
        c,
        '\u{061c}'                  // Arabic letter mark
        | '\u{200b}'                // zero-width space
        | '\u{200e}' | '\u{200f}'   // left-to-right and right-to-left marks
        | '\u{2028}' | '\u{2029}'   // line and paragraph separators
        | '\u{202a}'..='\u{202e}'   // embeddings, pop, overrides
        | '\u{2066}'..='\u{2069}'   // isolates, pop
        | '\u{feff}' // byte order mark
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_shown_escaped() {
        assert_eq!(
            printable("a\nb\tc\r\u{1b}[2J\u{7f}é\u{0}\u{85}"),
            "a\\nb\\tc\\r\\x1b[2J\\x7fé\\x00\\x85"
        );
        assert_eq!(printable("plain -x 'y'"), "plain -x 'y'");
    }

    #[test]
    fn a_hostile_process_name_stays_on_its_line() {
        assert_eq!(
            printable("gp\u{1b}[2J\nFAKE"),
            "gp\\x1b[2J\\nFAKE",
            "the screen is not cleared and no line is forged"
        );
    }

    #[test]
    fn text_that_reorders_or_hides_is_shown() {
        assert_eq!(
            printable("run\u{202e}txt.exe\u{2066}\u{200b}\u{feff}\u{2028}"),
            "run\\u{202e}txt.exe\\u{2066}\\u{200b}\\u{feff}\\u{2028}"
        );
        // Joiners build emoji and some scripts: they stay.
        assert_eq!(printable("👩\u{200d}🔬 é 日本"), "👩\u{200d}🔬 é 日本");
    }

    #[test]
    fn escaping_twice_is_escaping_once() {
        for s in [
            "gp\u{1b}[2J\nFAKE",
            "a\\nb",
            "x\u{202e}y",
            &"\n".repeat(3000),
        ] {
            let once = printable(s);
            assert_eq!(printable(&once), once, "{s:?}");
        }
    }

    #[test]
    fn long_text_is_cut_at_a_whole_escape() {
        let fits = "x".repeat(MAX_CHARS);
        assert_eq!(printable(&fits), fits, "exactly the limit is kept whole");
        let long = format!("{}\n", "x".repeat(MAX_CHARS - 1));
        // `\n` would take two places where one is left: it goes, and `…` takes the place.
        assert_eq!(printable(&long), format!("{}…", "x".repeat(MAX_CHARS - 1)));
        let out = printable(&"\u{1b}".repeat(10_000));
        assert_eq!(out.chars().count(), (MAX_CHARS - 1) / 4 * 4 + 1);
        assert!(out.ends_with("\\x1b…"), "{}", &out[out.len() - 12..]);
    }
}
