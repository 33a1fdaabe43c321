//! The lines of a job whose ranks gpupilot starts itself (`launcher = "ranks"`): each rank's
//! output is read from a pipe of its own and written to the run's log one whole line at a
//! time, prefixed with the rank that wrote it, as torchrun does: `[rank1]: {"step": 50}`.
//!
//! This module holds that format and nothing that does I/O: [`rank_prefix`] writes it,
//! [`split_rank`] reads it back (the metrics parser), [`LineJoiner`] turns a rank's bytes into
//! whole prefixed lines with bounded memory (the launcher), and [`RankFilter`] keeps one
//! rank's lines of a log read in chunks (`gpupilot logs --rank N`).

use std::time::{Duration, Instant};

/// The longest line written whole; a longer one (or output with no newline for that long) is
/// cut there, each piece a line of its own with its rank's prefix.
pub const MAX_LINE: usize = 32 * 1024;

/// How long the start of a line without its newline is held before it is written anyway (a
/// progress bar redrawn with `\r`, a prompt), so that `logs -f` shows it.
pub const HOLD_FOR: Duration = Duration::from_secs(1);

/// `[rankN]: `, what starts every line rank `rank` wrote.
pub fn rank_prefix(rank: u32) -> String {
    format!("[rank{rank}]: ")
}

/// A line of a ranks job as (the rank that wrote it, its text); a line without the prefix (the
/// launcher's own, or any other run's) is (None, the whole line).
pub fn split_rank(line: &str) -> (Option<u32>, &str) {
    match rank_between(line, "[rank", "]: ") {
        Some((rank, text)) => (Some(rank), text),
        None => (None, line),
    }
}

/// `line` as (rank, text) where it starts with `open`, the rank's digits, then `close`.
pub fn rank_between<'a>(line: &'a str, open: &str, close: &str) -> Option<(u32, &'a str)> {
    let (digits, text) = line.strip_prefix(open)?.split_once(close)?;
    let ok = !digits.is_empty() && digits.len() <= 10 && digits.bytes().all(|b| b.is_ascii_digit());
    Some((digits.parse::<u32>().ok().filter(|_| ok)?, text))
}

/// One rank's output stream (stdout or stderr) made into whole prefixed lines. Holds at most
/// [`MAX_LINE`] bytes of a line, and the start of a line for at most [`HOLD_FOR`].
#[derive(Debug)]
pub struct LineJoiner {
    prefix: Vec<u8>,
    held: Vec<u8>,
    /// When the held bytes started coming.
    since: Option<Instant>,
    /// The line being written (prefix, text, newline): one `emit` per line.
    record: Vec<u8>,
}

impl LineJoiner {
    pub fn new(rank: u32) -> LineJoiner {
        LineJoiner {
            prefix: rank_prefix(rank).into_bytes(),
            held: Vec::new(),
            since: None,
            record: Vec::new(),
        }
    }

    /// Take bytes the rank wrote; `emit` gets each line completed by them, whole.
    pub fn push(&mut self, mut data: &[u8], now: Instant, emit: &mut dyn FnMut(&[u8])) {
        while !data.is_empty() {
            let room = MAX_LINE - self.held.len();
            match data.iter().position(|&b| b == b'\n') {
                Some(i) if i <= room => {
                    self.held.extend_from_slice(&data[..i]);
                    self.emit_held(emit);
                    data = &data[i + 1..];
                }
                _ if data.len() <= room => {
                    if self.held.is_empty() {
                        self.since = Some(now);
                    }
                    self.held.extend_from_slice(data);
                    data = &[];
                }
                _ => {
                    // Too long for one line: cut, but not inside a UTF-8 character.
                    let take = char_boundary(&data[..=room]).min(room);
                    let take = if take == 0 && self.held.is_empty() {
                        room
                    } else {
                        take
                    };
                    self.held.extend_from_slice(&data[..take]);
                    self.emit_held(emit);
                    data = &data[take..];
                }
            }
        }
    }

    /// When the held start of a line is due to be written; None when nothing is held.
    pub fn due(&self) -> Option<Instant> {
        self.since.map(|t| t + HOLD_FOR)
    }

    /// Write the held start of a line if it has waited [`HOLD_FOR`] (or at once with `force`:
    /// the rank's stream has ended).
    pub fn flush(&mut self, now: Instant, force: bool, emit: &mut dyn FnMut(&[u8])) {
        if !self.held.is_empty() && (force || self.due().is_some_and(|t| now >= t)) {
            self.emit_held(emit);
        }
    }

    fn emit_held(&mut self, emit: &mut dyn FnMut(&[u8])) {
        self.record.clear();
        self.record.extend_from_slice(&self.prefix);
        self.record.extend_from_slice(&self.held);
        self.record.push(b'\n');
        emit(&self.record);
        self.held.clear();
        self.since = None;
    }
}

/// The longest start of `buf` short of its last byte that does not end inside a UTF-8
/// character (`buf`'s last byte tells whether the one before it ends a character).
fn char_boundary(buf: &[u8]) -> usize {
    // Cut before the last byte that starts a character (not a continuation byte).
    let mut i = buf.len().saturating_sub(1);
    for _ in 0..4 {
        if i == 0 || buf[i] & 0xC0 != 0x80 {
            return i;
        }
        i -= 1;
    }
    buf.len().saturating_sub(1)
}

/// Keeps one rank's lines of a log read in chunks, dropping every other line (other ranks',
/// the launcher's). Holds at most a prefix's length of a line while it decides.
#[derive(Debug)]
pub struct RankFilter {
    want: Vec<u8>,
    /// The start of the current line, until it is long enough to decide.
    head: Vec<u8>,
    state: Keep,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Keep {
    Undecided,
    Yes,
    No,
}

impl RankFilter {
    pub fn new(rank: u32) -> RankFilter {
        RankFilter {
            want: rank_prefix(rank).into_bytes(),
            head: Vec::new(),
            state: Keep::Undecided,
        }
    }

    /// The part of `text` (the log's next chunk) on the rank's lines.
    pub fn feed(&mut self, text: &str) -> String {
        let mut out = Vec::new();
        let mut data = text.as_bytes();
        while !data.is_empty() {
            let end = data.iter().position(|&b| b == b'\n');
            let piece = &data[..end.map_or(data.len(), |i| i + 1)];
            data = &data[piece.len()..];
            if self.state == Keep::Undecided {
                let need = self.want.len() - self.head.len();
                let look = &piece[..need.min(piece.len())];
                self.head.extend_from_slice(look);
                if self.head.len() == self.want.len() {
                    self.state = if self.head == self.want {
                        out.extend_from_slice(&self.head);
                        Keep::Yes
                    } else {
                        Keep::No
                    };
                    self.head.clear();
                    if self.state == Keep::Yes {
                        out.extend_from_slice(&piece[look.len()..]);
                    }
                } else if end.is_some() {
                    // A line shorter than the prefix.
                    self.head.clear();
                }
            } else if self.state == Keep::Yes {
                out.extend_from_slice(piece);
            }
            if end.is_some() {
                self.state = Keep::Undecided;
                self.head.clear();
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn joined(j: &mut LineJoiner, data: &[u8], now: Instant) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        j.push(data, now, &mut |l| got.push(l.to_vec()));
        got
    }

    #[test]
    fn a_prefix_is_written_and_read_back() {
        assert_eq!(rank_prefix(3), "[rank3]: ");
        assert_eq!(
            split_rank(r#"[rank12]: {"step": 5}"#),
            (Some(12), r#"{"step": 5}"#)
        );
        assert_eq!(split_rank("[rank0]: "), (Some(0), ""));
        for not in [
            "plain line",
            "[rank]: x",
            "[rankx]: x",
            "[rank1] x",
            "[rank-1]: x",
            "[rank99999999999]: x",
            " [rank1]: x",
        ] {
            assert_eq!(split_rank(not), (None, not), "{not}");
        }
    }

    /// A line written in pieces (text, then its newline, as Python does unbuffered) comes out
    /// as one record with the prefix.
    #[test]
    fn pieces_become_whole_lines() {
        let t = Instant::now();
        let mut j = LineJoiner::new(1);
        assert!(joined(&mut j, br#"{"step": 50}"#, t).is_empty());
        assert_eq!(j.due(), Some(t + HOLD_FOR));
        assert_eq!(
            joined(&mut j, b"\na\n\nb", t),
            [
                b"[rank1]: {\"step\": 50}\n".to_vec(),
                b"[rank1]: a\n".to_vec(),
                b"[rank1]: \n".to_vec()
            ]
        );
        // "b" waits for its newline, but not for ever.
        let mut got = Vec::new();
        j.flush(t + HOLD_FOR / 2, false, &mut |l| got.push(l.to_vec()));
        assert!(got.is_empty());
        j.flush(t + HOLD_FOR, false, &mut |l| got.push(l.to_vec()));
        assert_eq!(got, [b"[rank1]: b\n".to_vec()]);
        assert_eq!(j.due(), None);
        j.flush(t, true, &mut |l| got.push(l.to_vec()));
        assert_eq!(got.len(), 1, "nothing held, nothing written");
    }

    #[test]
    fn a_long_line_is_cut_at_the_bound_and_never_inside_a_character() {
        let t = Instant::now();
        let mut j = LineJoiner::new(0);
        let mut data = vec![b'x'; MAX_LINE - 1];
        data.extend_from_slice("€".as_bytes()); // 3 bytes across the bound
        data.extend_from_slice(b"tail\n");
        let got = joined(&mut j, &data, t);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].len(), "[rank0]: ".len() + MAX_LINE - 1 + 1);
        assert_eq!(got[1], "[rank0]: €tail\n".as_bytes());
        // Output with no newline at all: memory stays bounded, pieces of MAX_LINE.
        let got = joined(&mut j, &vec![b'y'; 3 * MAX_LINE + 5], t);
        assert_eq!(got.len(), 3);
        assert!(
            got.iter()
                .all(|l| l.len() == "[rank0]: ".len() + MAX_LINE + 1)
        );
        let mut rest = Vec::new();
        j.flush(t, true, &mut |l| rest.push(l.to_vec()));
        assert_eq!(rest, [b"[rank0]: yyyyy\n".to_vec()]);
    }

    #[test]
    fn a_filter_keeps_one_ranks_lines_across_any_chunking() {
        let log = "[rank0]: a\n[rank1]: b €\ngpupilot ranks: rank 1 exited\n[rank10]: c\n\n[rank1]: \n[rank1]: {\"step\": 1}\nx\n[rank1]: cut";
        let want = "[rank1]: b €\n[rank1]: \n[rank1]: {\"step\": 1}\n[rank1]: cut";
        let chars: Vec<usize> = log.char_indices().map(|(i, _)| i).collect();
        for size in [1, 2, 3, 7, 9, 10, 64, 1000] {
            let mut f = RankFilter::new(1);
            let mut got = String::new();
            let mut at = 0;
            while at < log.len() {
                // Chunks end on character boundaries, as the daemon sends them.
                let end = chars
                    .iter()
                    .copied()
                    .find(|&i| i >= at + size)
                    .unwrap_or(log.len());
                got.push_str(&f.feed(&log[at..end]));
                at = end;
            }
            assert_eq!(got, want, "chunks of {size}");
        }
        assert_eq!(RankFilter::new(10).feed(log), "[rank10]: c\n");
        assert_eq!(RankFilter::new(2).feed(log), "");
    }
}
