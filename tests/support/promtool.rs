//! `promtool check metrics` on an exporter page, held to dcgm-exporter's own lints.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

/// `promtool check metrics` on `body`: clean, or (exit status 3, lint problems) nothing but the
/// lints that dcgm-exporter's own page draws and that the exporter keeps for compatibility —
/// the camelCase label `modelName`, dcgm-exporter's counters (`DCGM_FI_*`) without the `_total`
/// suffix, and its `DCGM_FI_DEV_PCIE_REPLAY_COUNTER`, a counter named COUNTER. Any other
/// problem fails.
pub fn promtool_accepts(promtool: &Path, body: &str) {
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The family a lint names carries `modelName` (the page's one camelCase label).
    let has_model_name = |l: &str| {
        let family = format!("{}{{", l.split(' ').next().unwrap_or_default());
        body.lines()
            .any(|s| s.starts_with(&family) && s.contains(",modelName=\""))
    };
    let dcgm_lint = |l: &str| {
        (l.ends_with(" label names should be written in 'snake_case' not 'camelCase'")
            && has_model_name(l))
            || (l.starts_with("DCGM_FI_")
                && l.ends_with(" counter metrics should have \"_total\" suffix"))
            // dcgm-exporter's own name for the replay counter ends in COUNTER.
            || l.starts_with("DCGM_FI_DEV_PCIE_REPLAY_COUNTER ")
                && l.ends_with(" metric name should not include type 'counter'")
    };
    let other: Vec<&str> = said
        .lines()
        .filter(|l| !l.trim().is_empty() && !dcgm_lint(l))
        .collect();
    assert!(
        (out.status.success() || out.status.code() == Some(3)) && other.is_empty(),
        "promtool check metrics failed ({}):\n{said}\n--- page ---\n{body}",
        out.status,
    );
}
