//! A run's log as the console holds it: complete lines in a bounded ring, numbered from the
//! first line read (numbers stay put when old lines are dropped), plus the line still being
//! written. Lines are cleaned for a terminal when they come in, never in render: a progress
//! bar's carriage returns keep only what a terminal would show last, colour escapes go, tabs
//! become spaces.

use std::collections::VecDeque;

/// Lines kept per stream; older ones are dropped.
pub const MAX_LINES: usize = 10_000;

/// One stream of a run's log. See the module doc.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogBuffer {
    lines: VecDeque<String>,
    /// Number of `lines[0]`.
    first: u64,
    /// The last line, not ended by a newline yet (raw: cleaned when shown whole).
    partial: String,
    /// Earlier output exists that is not held: the tail started mid-file, or lines were
    /// dropped.
    pub truncated: bool,
}

impl LogBuffer {
    /// A buffer starting with `data`. When `from_start` is false the data starts mid-file, so
    /// its first line is cut and dropped.
    pub fn tail(data: &str, from_start: bool) -> LogBuffer {
        let mut b = LogBuffer {
            truncated: !from_start,
            ..LogBuffer::default()
        };
        let data = if from_start {
            data
        } else {
            data.split_once('\n').map_or("", |(_, rest)| rest)
        };
        b.push_str(data);
        b
    }

    /// Append output as it came.
    pub fn push_str(&mut self, data: &str) {
        let mut rest = data;
        while let Some((line, more)) = rest.split_once('\n') {
            self.partial.push_str(line);
            let whole = std::mem::take(&mut self.partial);
            self.lines.push_back(clean(&whole));
            rest = more;
        }
        self.partial.push_str(rest);
        while self.lines.len() > MAX_LINES {
            self.lines.pop_front();
            self.first += 1;
            self.truncated = true;
        }
    }

    /// Number of the first line held.
    pub fn start(&self) -> u64 {
        self.first
    }

    /// One past the number of the last line (the unfinished one included).
    pub fn end(&self) -> u64 {
        self.first + self.lines.len() as u64 + u64::from(!self.partial.is_empty())
    }

    pub fn is_empty(&self) -> bool {
        self.end() == self.first
    }

    /// Line `n`, cleaned; None outside [`start`, `end`).
    pub fn line(&self, n: u64) -> Option<std::borrow::Cow<'_, str>> {
        let i = usize::try_from(n.checked_sub(self.first)?).ok()?;
        match self.lines.get(i) {
            Some(l) => Some(l.as_str().into()),
            None if i == self.lines.len() && !self.partial.is_empty() => {
                Some(clean(&self.partial).into())
            }
            None => None,
        }
    }

    /// The nearest line holding `query` from line `from` (included) going forward (to newer
    /// lines) or backward, wrapping around once.
    pub fn find(&self, query: &str, from: u64, forward: bool) -> Option<u64> {
        let (start, end) = (self.start(), self.end());
        if query.is_empty() || start == end {
            return None;
        }
        let n = end - start;
        let from = from.clamp(start, end - 1) - start;
        (0..n)
            .map(|k| {
                if forward {
                    (from + k) % n
                } else {
                    (from + n - k) % n
                }
            })
            .map(|i| start + i)
            .find(|&i| self.line(i).is_some_and(|l| !matches(&l, query).is_empty()))
    }
}

/// Byte ranges of `query` in `line`. Smart case: a query without capitals ignores case (ASCII).
pub fn matches(line: &str, query: &str) -> Vec<(usize, usize)> {
    if query.is_empty() {
        return Vec::new();
    }
    let folded;
    let (hay, needle) = if query.chars().any(char::is_uppercase) {
        (line, query)
    } else {
        folded = (line.to_ascii_lowercase(), query.to_ascii_lowercase());
        (folded.0.as_str(), folded.1.as_str())
    };
    hay.match_indices(needle)
        .map(|(at, m)| (at, at + m.len()))
        .collect()
}

/// What a terminal would show of one line: the text after the last carriage return (a
/// progress bar redrawn in place), without escape sequences, tabs expanded to 8 columns,
/// other control characters dropped.
pub fn clean(raw: &str) -> String {
    let raw = raw.strip_suffix('\r').unwrap_or(raw);
    let shown = raw.rsplit('\r').next().unwrap_or(raw);
    let mut out = String::with_capacity(shown.len());
    let mut chars = shown.chars().peekable();
    let mut col = 0;
    while let Some(c) = chars.next() {
        match c {
            '\x1b' => match chars.next() {
                // CSI: parameters, then one final byte in @..~.
                Some('[') => {
                    for c in chars.by_ref() {
                        if ('@'..='~').contains(&c) {
                            break;
                        }
                    }
                }
                // OSC (a terminal title, a hyperlink): up to BEL or ESC \.
                Some(']') => {
                    while let Some(c) = chars.next() {
                        if c == '\x07' || (c == '\x1b' && chars.next_if_eq(&'\\').is_some()) {
                            break;
                        }
                    }
                }
                _ => {}
            },
            '\t' => {
                let n = 8 - col % 8;
                out.extend(std::iter::repeat_n(' ', n));
                col += n;
            }
            c if c.is_control() => {}
            c => {
                out.push(c);
                col += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_split_across_chunks_and_keep_their_numbers() {
        let mut b = LogBuffer::tail("ab", true);
        assert_eq!((b.start(), b.end()), (0, 1));
        assert_eq!(
            b.line(0).as_deref(),
            Some("ab"),
            "the unfinished line shows"
        );
        b.push_str("c\nde");
        b.push_str("f\n");
        assert_eq!(b.line(0).as_deref(), Some("abc"));
        assert_eq!(b.line(1).as_deref(), Some("def"));
        assert_eq!(b.end(), 2);
        for i in 0..MAX_LINES + 5 {
            b.push_str(&format!("{i}\n"));
        }
        assert_eq!(b.start(), 7, "the oldest lines went");
        assert!(b.truncated);
        assert_eq!(b.line(b.end() - 1).as_deref(), Some("10004"));
        assert_eq!(b.line(3), None);
    }

    #[test]
    fn a_tail_from_mid_file_drops_the_cut_line() {
        let b = LogBuffer::tail("ep 3\nstep 4\nstep 5\n", false);
        assert_eq!(b.line(0).as_deref(), Some("step 4"));
        assert_eq!(b.end(), 2);
        assert!(b.truncated);
    }

    #[test]
    fn terminal_noise_is_cleaned() {
        assert_eq!(clean("epoch 1:  10%\repoch 1:  50%\r"), "epoch 1:  50%");
        assert_eq!(clean("\x1b[32mok\x1b[0m done"), "ok done");
        assert_eq!(clean("\x1b]0;title\x07text"), "text");
        assert_eq!(clean("a\tb"), "a       b");
        assert_eq!(clean("bell\x07"), "bell");
    }

    #[test]
    fn search_is_smart_case_and_wraps() {
        let mut b = LogBuffer::default();
        b.push_str("loss 3.1\nstep\nLoss 2.0\nstep\nloss 1.2\n");
        assert_eq!(matches("Loss 2.0 loss", "loss"), [(0, 4), (9, 13)]);
        assert_eq!(matches("Loss 2.0 loss", "Loss"), [(0, 4)]);
        assert_eq!(b.find("loss", 1, true), Some(2));
        assert_eq!(b.find("loss", 3, true), Some(4));
        assert_eq!(b.find("loss", 4, true), Some(4), "from is included");
        assert_eq!(b.find("loss", 3, false), Some(2));
        assert_eq!(b.find("loss", 0, false), Some(0));
        assert_eq!(b.find("Loss", 3, true), Some(2), "wraps around");
        assert_eq!(b.find("nope", 0, true), None);
        assert_eq!(b.find("", 0, true), None);
    }
}
