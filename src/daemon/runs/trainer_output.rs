//! A run's output read for metrics: the lines a script prints that are JSON objects, or that
//! match the profile's `[metrics] patterns`, become reports (for scripts that do not use the
//! SDK). A line of a `launcher = "ranks"` job starts with the rank that wrote it
//! (`[rank1]: {"step": 5}`): the report is that rank's. Reading is incremental and bounded: at most [`PARSE_CHUNK`] bytes a poll.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use crate::protocol::MetricsReport;
use crate::supervisor::rank_lines::split_rank;

/// A run's output read for metrics per poll, at most.
const PARSE_CHUNK: u64 = 256 * 1024;
/// The longest line read as metrics; a longer one is passed over, up to its newline.
const MAX_OUTPUT_LINE: usize = 64 * 1024;

/// Reading metrics from a run's stdout.
#[derive(Default)]
pub(in crate::daemon) struct OutputParser {
    pub(in crate::daemon) offset: u64,
    pub(in crate::daemon) partial: Vec<u8>,
    /// The line being read is longer than [`MAX_OUTPUT_LINE`]: what is left of it, up to its
    /// newline, is passed over.
    pub(in crate::daemon) overlong: bool,
    pub(in crate::daemon) patterns: Option<Vec<regex::Regex>>,
}

/// Complete lines appended to `path` since the parser's offset (at most [`PARSE_CHUNK`] bytes
/// a call; a line cut at the end waits for its newline).
pub(in crate::daemon) fn read_new_lines(path: &Path, parser: &mut OutputParser) -> Vec<String> {
    // A stat every poll; the file is opened only when it has grown.
    let len = std::fs::metadata(path).map_or(0, |m| m.len());
    if len < parser.offset {
        // Truncated or replaced: start again.
        parser.offset = 0;
        parser.partial.clear();
        parser.overlong = false;
    }
    if len == parser.offset {
        return Vec::new();
    }
    // The run's own output file: a link or a FIFO in its place is not read.
    let Ok(mut f) = crate::config::safe_fs::open_regular(path) else {
        return Vec::new();
    };
    if f.seek(SeekFrom::Start(parser.offset)).is_err() {
        return Vec::new();
    }
    let mut buf = Vec::new();
    let n = f
        .take(PARSE_CHUNK)
        .read_to_end(&mut buf)
        .unwrap_or_default();
    parser.offset += n as u64;
    parser.partial.extend_from_slice(&buf[..n]);
    let mut lines = Vec::new();
    while let Some(i) = parser.partial.iter().position(|&b| b == b'\n') {
        let line: Vec<u8> = parser.partial.drain(..=i).collect();
        // A "line" that long is not a metrics line, nor is the end of one.
        if !std::mem::take(&mut parser.overlong) && i <= MAX_OUTPUT_LINE {
            lines.push(String::from_utf8_lossy(&line[..i]).into_owned());
        }
    }
    if parser.partial.len() > MAX_OUTPUT_LINE {
        parser.partial.clear();
        parser.overlong = true;
    }
    lines
}

/// One line of output as (the rank that wrote it, if it says, its report): the rank's prefix
/// ([`split_rank`]) is taken off before the line is read by [`parse_line`].
pub fn parse_rank_line(
    line: &str,
    json: bool,
    patterns: &[regex::Regex],
) -> Option<(Option<u32>, MetricsReport)> {
    let (rank, text) = split_rank(line);
    parse_line(text, json, patterns).map(|r| (rank, r))
}

/// One line of output as a metrics report: a JSON object (known names to their fields, other
/// numbers to `extra`), else the first pattern that matches (named groups the same way).
pub fn parse_line(line: &str, json: bool, patterns: &[regex::Regex]) -> Option<MetricsReport> {
    let trimmed = line.trim();
    if json && trimmed.starts_with('{') {
        if let Ok(serde_json::Value::Object(map)) = serde_json::from_str(trimmed) {
            let mut r = MetricsReport::default();
            for (k, v) in &map {
                if let Some(x) = v.as_f64() {
                    set_field(&mut r, k, x);
                }
            }
            return (!r.is_empty()).then_some(r);
        }
    }
    for re in patterns {
        if let Some(caps) = re.captures(line) {
            let mut r = MetricsReport::default();
            for name in re.capture_names().flatten() {
                if let Some(x) = caps.name(name).and_then(|m| m.as_str().parse::<f64>().ok()) {
                    set_field(&mut r, name, x);
                }
            }
            if !r.is_empty() {
                return Some(r);
            }
        }
    }
    None
}

fn set_field(r: &mut MetricsReport, name: &str, x: f64) {
    if !x.is_finite() {
        return;
    }
    let whole = |x: f64| (x >= 0.0 && x.fract() == 0.0).then_some(x as u64);
    match name {
        "step" | "global_step" | "iteration" => r.step = whole(x),
        "epoch" => r.epoch = whole(x),
        "loss" | "train_loss" => r.loss = Some(x),
        "samples_per_s" | "samples_per_sec" | "throughput" => r.samples_per_s = Some(x),
        "step_time_s" | "step_time" => r.step_time_s = Some(x),
        "data_wait_s" | "data_time" | "data_wait" => r.data_wait_s = Some(x),
        "batch_size" => r.batch_size = whole(x).map(|v| v as i64),
        "prefetch" | "prefetch_factor" => r.prefetch = whole(x).map(|v| v as i64),
        "samples" | "samples_seen" => r.samples = whole(x),
        other => {
            r.extra.insert(other.to_string(), x);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs::OpenOptions;
    use std::io::Write;

    use super::*;

    #[test]
    fn json_lines_and_patterns_become_reports() {
        let r = parse_line(
            r#"{"step": 12, "loss": 0.5, "lr": 0.001, "name": "x"}"#,
            true,
            &[],
        )
        .unwrap();
        assert_eq!(r.step, Some(12));
        assert_eq!(r.loss, Some(0.5));
        assert_eq!(r.extra.get("lr"), Some(&0.001));
        assert_eq!(r.extra.len(), 1, "strings are not metrics");
        assert!(parse_line(r#"{"step": 12}"#, false, &[]).is_none());
        let re = [regex::Regex::new(r"step (?P<step>\d+) loss=(?P<loss>[0-9.]+)").unwrap()];
        let r = parse_line("epoch 1 step 40 loss=2.25 lr=0.1", true, &re).unwrap();
        assert_eq!((r.step, r.loss), (Some(40), Some(2.25)));
        assert!(parse_line("nothing to see", true, &re).is_none());
        assert!(parse_line("{not json", true, &re).is_none());
    }

    #[test]
    fn a_ranks_line_is_its_ranks_report() {
        let re = [regex::Regex::new(r"^step (?P<step>\d+)").unwrap()];
        let (rank, r) = parse_rank_line(r#"[rank3]: {"step": 50, "bs": 64}"#, true, &re).unwrap();
        assert_eq!(
            (rank, r.step, r.extra.get("bs")),
            (Some(3), Some(50), Some(&64.0))
        );
        // Patterns anchored at the start of the script's line still match.
        let (rank, r) = parse_rank_line("[rank0]: step 7 loss 1", true, &re).unwrap();
        assert_eq!((rank, r.step), (Some(0), Some(7)));
        let (rank, r) = parse_rank_line(r#"{"step": 9}"#, true, &re).unwrap();
        assert_eq!((rank, r.step), (None, Some(9)));
        assert!(parse_rank_line("[rank1]: nothing", true, &re).is_none());
    }

    #[test]
    fn lines_are_read_whole_and_once() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("stdout.log");
        let mut p = OutputParser::default();
        std::fs::write(&path, "a\nb").unwrap();
        assert_eq!(read_new_lines(&path, &mut p), ["a"]);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"c\nd\n").unwrap();
        assert_eq!(read_new_lines(&path, &mut p), ["bc", "d"]);
        assert!(read_new_lines(&path, &mut p).is_empty());
    }

    /// A line over the bound is passed over whole, even when it ends polls later: its end is
    /// not read as a line of its own.
    #[test]
    fn a_long_line_is_passed_over_to_its_end() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("stdout.log");
        let mut p = OutputParser::default();
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(b"a\n").unwrap();
        f.write_all(&vec![b'x'; PARSE_CHUNK as usize]).unwrap();
        assert_eq!(read_new_lines(&path, &mut p), ["a"]);
        assert!(p.overlong && p.partial.is_empty());
        f.write_all(br#"x {"step": 7}"#).unwrap();
        f.write_all(b"\n{\"step\": 8}\n").unwrap();
        assert_eq!(read_new_lines(&path, &mut p), [r#"{"step": 8}"#]);
        // Within one poll too.
        let long = "y".repeat(MAX_OUTPUT_LINE + 1);
        f.write_all(format!("{long}\nb\n").as_bytes()).unwrap();
        assert_eq!(read_new_lines(&path, &mut p), ["b"]);
    }
}
