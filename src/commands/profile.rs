//! `gpupilot profile check FILE`: load a profile the way `run` does and say what would run, or
//! every problem with its `FILE:LINE:COL`.

use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;

use super::out;
use super::runs::profile_loader;
use crate::config::Paths;
use crate::profile::{GpuSelection, Knob, Launcher, Profile, RestartMode, ThermalTarget};

/// Check `file`: the summary on stdout and exit 0, or the errors on stderr and exit 1.
pub fn check(file: &Path) -> anyhow::Result<ExitCode> {
    match profile_loader(&Paths::from_env()).load(file) {
        Ok(p) => {
            out(&summary(file, &p))?;
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            super::err_line(&e.to_string());
            Ok(ExitCode::FAILURE)
        }
    }
}

/// What a checked profile will run, in a few aligned lines.
pub fn summary(file: &Path, p: &Profile) -> String {
    let mut s = format!("{}: ok\n", file.display());
    let mut row = |k: &str, v: String| {
        let _ = writeln!(s, "  {k:<12} {v}");
    };
    row("name", p.name.clone());
    if let Some(d) = &p.description {
        row("description", d.clone());
    }
    row("command", crate::text::printable(&p.run.command.display()));
    row(
        "cwd",
        p.run
            .cwd
            .as_ref()
            .map_or("the caller's directory".into(), |c| c.display().to_string()),
    );
    row(
        "gpus",
        match &p.run.gpus {
            GpuSelection::Inherit => "the caller's CUDA_VISIBLE_DEVICES".into(),
            GpuSelection::All => "all".into(),
            GpuSelection::List(l) if l.is_empty() => "none (CUDA_VISIBLE_DEVICES=)".into(),
            GpuSelection::List(l) => l.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
        },
    );
    if !p.run.env.is_empty() {
        let env: Vec<String> = p.run.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        row("env", env.join(" "));
    }
    row(
        "launcher",
        match &p.run.launcher {
            Launcher::Local => "local".into(),
            Launcher::Torchrun(t) => format!(
                "torchrun, {} per node × {} node{}{}",
                t.nproc_per_node,
                t.nnodes,
                if t.nnodes == 1 { "" } else { "s" },
                if t.standalone { ", standalone" } else { "" }
            ),
            Launcher::Ranks(r) => format!(
                "{} local rank{} with torchrun's environment, master {}",
                r.nproc,
                if r.nproc == 1 { "" } else { "s" },
                match r.master_port {
                    Some(port) => format!("{}:{port}", r.master_addr),
                    None => format!("{} (a free port at each start)", r.master_addr),
                }
            ),
            Launcher::Slurm(s) => format!(
                "slurm, {} node{} × {} GPU{}{}",
                s.nodes,
                if s.nodes == 1 { "" } else { "s" },
                s.gpus_per_node,
                if s.gpus_per_node == 1 { "" } else { "s" },
                s.partition
                    .as_deref()
                    .map(|p| format!(", partition {p}"))
                    .unwrap_or_default()
            ),
        },
    );
    let r = &p.run.restart;
    row(
        "restart",
        match r.mode {
            RestartMode::Never => "never".into(),
            mode => format!(
                "{}, at most {} times, after {} s (×{} each time, at most {} s)",
                if mode == RestartMode::Always {
                    "always"
                } else {
                    "on failure"
                },
                r.max_restarts,
                r.backoff_s,
                r.backoff_factor,
                r.backoff_max_s
            ),
        },
    );
    let knob = |name: &str, k: &Option<Knob>| {
        k.map(|k| {
            let range = match k.max {
                Some(max) => format!("{}..={max}", k.min),
                None => format!("{}..", k.min),
            };
            format!("{name} {} ({range})", k.initial)
        })
    };
    let knobs: Vec<String> = [
        knob("batch_size", &p.knobs.batch_size),
        knob("prefetch", &p.knobs.prefetch),
    ]
    .into_iter()
    .flatten()
    .collect();
    if !knobs.is_empty() {
        row("knobs", knobs.join(", "));
    }
    let m = &p.metrics;
    if !m.json || !m.patterns.is_empty() {
        row(
            "metrics",
            format!("JSON lines: {}", if m.json { "yes" } else { "no" }),
        );
        for pattern in &m.patterns {
            row("", format!("pattern {}", crate::text::printable(pattern)));
        }
    }
    if m.preset != crate::profile::MetricsPreset::Auto {
        row("metrics preset", m.preset.as_str().to_string());
    }
    if let Some(cap) = p.power.cap_w {
        row("power cap", format!("{cap} W"));
    }
    match p.thermal.target {
        Some(ThermalTarget::Celsius(c)) => row("thermal", format!("hold {c} °C")),
        Some(ThermalTarget::BelowSlowdown(m)) => {
            row("thermal", format!("hold {m} °C below slowdown"))
        }
        None => {}
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_lists_metric_patterns_and_escapes_control_characters() {
        let text = "name = \"p\"\n[run]\ncommand = [\"sh\", \"-c\", \"sleep 1\\necho \\u001b[2Jhi\"]\n\
                    [metrics]\njson = false\npatterns = ['loss=(?P<loss>[0-9.]+)', 'step (?P<step>\\d+)']\n";
        let p = crate::profile::parse_str("p.toml", text).unwrap();
        let s = summary(Path::new("p.toml"), &p);
        assert!(s.contains("\n  metrics      JSON lines: no\n"), "{s}");
        assert!(
            s.contains("\n               pattern loss=(?P<loss>[0-9.]+)\n"),
            "{s}"
        );
        assert!(s.contains("pattern step (?P<step>\\d+)"), "{s}");
        let command = s.lines().find(|l| l.contains("command")).unwrap();
        assert!(command.contains("sleep 1\\necho \\x1b[2Jhi"), "{s}");
        assert!(!s.contains('\u{1b}'), "{s}");
    }
}
