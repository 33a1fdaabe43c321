//! A run's output read for metrics: the lines a script prints that are JSON objects, or that
//! match the profile's `[metrics] patterns`, or are a training framework's own log lines (a
//! preset, `metric_presets`), become reports (for scripts that do not use the SDK). A line of a
//! `launcher = "ranks"` job starts with the rank that wrote it (`[rank1]: {"step": 5}`), as does
//! one torchrun prefixes (`[rank1]:`, `[default1]:`): the report is that rank's. Reading is incremental and bounded: at most [`PARSE_CHUNK`] bytes a
//! poll. A `\r` ends a line as a newline does: a progress bar redrawn in place is read at each
//! redraw, not once at the end of its epoch.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use super::metric_presets;
use crate::profile::{MetricsPreset, MetricsSettings};
use crate::protocol::MetricsReport;
use crate::supervisor::rank_lines::{rank_between, split_rank};

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
    while let Some(i) = parser
        .partial
        .iter()
        .position(|&b| b == b'\n' || b == b'\r')
    {
        let line: Vec<u8> = parser.partial.drain(..=i).collect();
        // A "line" that long is not a metrics line, nor is the end of one.
        if !std::mem::take(&mut parser.overlong) && i <= MAX_OUTPUT_LINE && i > 0 {
            lines.push(String::from_utf8_lossy(&line[..i]).into_owned());
        }
    }
    if parser.partial.len() > MAX_OUTPUT_LINE {
        parser.partial.clear();
        parser.overlong = true;
    }
    lines
}

/// What a run's output is read with, and the preset found in it so far.
pub(in crate::daemon) struct OutputRules<'a> {
    pub(in crate::daemon) settings: &'a MetricsSettings,
    pub(in crate::daemon) patterns: &'a [regex::Regex],
    /// The preset the run's lines were found to be, or its profile's once a line matched it.
    pub(in crate::daemon) found: &'a mut Option<MetricsPreset>,
}

impl OutputRules<'_> {
    /// Whether a stream may hold reports at all under these settings.
    pub(in crate::daemon) fn reads_anything(settings: &MetricsSettings) -> bool {
        settings.json || !settings.patterns.is_empty() || settings.preset != MetricsPreset::None
    }

    /// Reports in `lines` of stdout (`plain`: JSON lines, patterns, then the preset) or of
    /// stderr (the preset only: a framework's logger writes there). Returns them with the
    /// preset when these lines were the first its reader took.
    pub(in crate::daemon) fn reports(
        &mut self,
        lines: &[String],
        plain: bool,
    ) -> (Vec<(Option<u32>, MetricsReport)>, Option<MetricsPreset>) {
        let mut out = Vec::new();
        let mut newly = None;
        for line in lines {
            let (rank, text) = match split_rank(line) {
                (None, _) => split_torchrun_rank(line),
                split => split,
            };
            if plain {
                if let Some(r) = parse_line(text, self.settings.json, self.patterns) {
                    out.push((rank, r));
                    continue;
                }
            }
            let read = match (self.settings.preset, *self.found) {
                (MetricsPreset::None, _) => None,
                (MetricsPreset::Auto, None) => metric_presets::detect(text),
                (MetricsPreset::Auto, Some(p)) | (p, _) => {
                    metric_presets::parse(p, text).map(|r| (p, r))
                }
            };
            if let Some((p, r)) = read {
                if self.found.is_none() {
                    *self.found = Some(p);
                    newly = Some(p);
                }
                out.push((rank, r));
            }
        }
        (out, newly)
    }
}

/// torchrun's own prefix of a rank's lines (`--tee`, `--role`): `[rank3]:` or `[default3]:`
/// right before the text, where gpupilot's launcher writes `[rank3]: `.
fn split_torchrun_rank(line: &str) -> (Option<u32>, &str) {
    match ["[rank", "[default"]
        .iter()
        .find_map(|open| rank_between(line, open, "]:"))
    {
        Some((rank, text)) => (Some(rank), text),
        None => (None, line),
    }
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
        let settings = MetricsSettings::default();
        let mut found = None;
        let mut rules = OutputRules {
            settings: &settings,
            patterns: &re,
            found: &mut found,
        };
        let mut one = |line: &str| {
            let (mut reports, _) = rules.reports(&[line.to_string()], true);
            assert!(reports.len() <= 1);
            reports.pop()
        };
        let (rank, r) = one(r#"[rank3]: {"step": 50, "bs": 64}"#).unwrap();
        assert_eq!(
            (rank, r.step, r.extra.get("bs")),
            (Some(3), Some(50), Some(&64.0))
        );
        // Patterns anchored at the start of the script's line still match.
        let (rank, r) = one("[rank0]: step 7 loss 1").unwrap();
        assert_eq!((rank, r.step), (Some(0), Some(7)));
        let (rank, r) = one(r#"{"step": 9}"#).unwrap();
        assert_eq!((rank, r.step), (None, Some(9)));
        assert!(one("[rank1]: nothing").is_none());
        // torchrun's prefix, with no space.
        let (rank, r) = one(r#"[default2]:{"step": 4}"#).unwrap();
        assert_eq!((rank, r.step), (Some(2), Some(4)));
        let (rank, r) = one(r#"[rank12]:{"step": 5}"#).unwrap();
        assert_eq!((rank, r.step), (Some(12), Some(5)));
        assert!(
            one(r#"[rankx]:{"step": 5}"#).is_none(),
            "not a rank's prefix"
        );
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
        // A progress bar redrawn in place: each redraw is a line, empty ones none.
        f.write_all(b"bar 1\rbar 2\r\ne\n").unwrap();
        assert_eq!(read_new_lines(&path, &mut p), ["bar 1", "bar 2", "e"]);
    }

    /// JSON and patterns first; then, with `auto`, the first framework that reads a line, and
    /// only that one from then on.
    #[test]
    fn presets_are_found_once_and_kept() {
        let settings = MetricsSettings::default();
        let mut found = None;
        let mut rules = OutputRules {
            settings: &settings,
            patterns: &[],
            found: &mut found,
        };
        let lines: Vec<String> = [
            "loading",
            r#"{"step": 1}"#,
            "{'loss': 0.69, 'learning_rate': 5e-05, 'epoch': 0.5}",
            "step:  2  loss:  1.0000  memory: 1.00GiB(2.00%)  tps: 10  mfu: 0.10%",
            "[rank1]: {'loss': 0.68, 'learning_rate': 4e-05, 'epoch': 1.0}",
        ]
        .map(String::from)
        .to_vec();
        let (reports, newly) = rules.reports(&lines, true);
        assert_eq!(newly, Some(MetricsPreset::Transformers));
        let got: Vec<(Option<u32>, Option<u64>, Option<f64>)> =
            reports.iter().map(|(k, r)| (*k, r.step, r.loss)).collect();
        assert_eq!(
            got,
            [
                (None, Some(1), None),
                (None, None, Some(0.69)),
                (Some(1), None, Some(0.68))
            ],
            "the torchtitan line is not read once the run is found to be a Trainer's"
        );
        let (_, newly) = rules.reports(&lines[2..3], false);
        assert_eq!(newly, None, "found once");
        // stderr: the preset only, no JSON.
        let mut found = None;
        let mut rules = OutputRules {
            settings: &settings,
            patterns: &[],
            found: &mut found,
        };
        let (reports, _) = rules.reports(&lines[1..2], false);
        assert!(reports.is_empty());
        // A profile's preset is the only one tried; `none` tries none.
        for (preset, expect) in [
            (MetricsPreset::Torchtitan, Some(2)),
            (MetricsPreset::Lightning, None),
            (MetricsPreset::None, None),
        ] {
            let settings = MetricsSettings {
                json: false,
                preset,
                ..MetricsSettings::default()
            };
            let mut found = None;
            let mut rules = OutputRules {
                settings: &settings,
                patterns: &[],
                found: &mut found,
            };
            let (reports, newly) = rules.reports(&lines, true);
            assert_eq!(
                reports.first().and_then(|(_, r)| r.step),
                expect,
                "{preset:?}"
            );
            assert_eq!(newly.is_some(), expect.is_some());
        }
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
