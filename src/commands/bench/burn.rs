//! `gpupilot bench burn`: parse, run the burn service (`control::bench::burn`) through the
//! daemon, draw the bench view while it runs (on a terminal, without `--json`), then print the
//! verdict as a table or JSON.

use std::io::IsTerminal as _;
use std::process::ExitCode;

use ratatui::backend::CrosstermBackend;
use ratatui::{Terminal, TerminalOptions, Viewport};

use crate::cli::{BurnArgs, GlobalArgs};
use crate::control::bench::burn::{self, BurnConfig, BurnProgress, BurnResult};
use crate::control::bench::{Label, Workload};
use crate::control::tuner::session::stop_flag;
use crate::tui::views::bench::BenchView;
use crate::units::format_duration;

use super::setup;

/// `gpupilot bench burn …`.
pub fn burn(g: &GlobalArgs, args: &BurnArgs) -> anyhow::Result<ExitCode> {
    setup::exit_2_on_usage(run(g, args))
}

fn run(g: &GlobalArgs, args: &BurnArgs) -> anyhow::Result<ExitCode> {
    let (mut loads, mut node, paths) = setup::open(g, "burn")?;
    let cfg = BurnConfig {
        gpus: args.gpu.clone(),
        duration_s: args.duration.as_secs_f64(),
        workload: Workload::Gemm,
        poll_s: 1.0,
    };
    let stop = stop_flag();
    let mut live = (!args.json && std::io::stdout().is_terminal())
        .then(|| Live::open(g, &paths))
        .flatten();
    if live.is_none() && !args.json {
        eprintln!(
            "gpupilot: burning for {}; Ctrl-C stops it",
            format_duration(cfg.duration_s)
        );
    }
    let result = burn::run(&mut node, loads.as_mut(), &cfg, &stop, &mut |p| {
        if let Some(l) = &mut live {
            l.draw(p);
        }
    });
    drop(live);
    let result = result?;
    if args.json {
        super::super::out(&(serde_json::to_string_pretty(&result)? + "\n"))?;
    } else {
        super::super::out(&table(&result))?;
    }
    if result.stopped {
        eprintln!("gpupilot: burn stopped before its end; the verdict covers what ran");
        return Ok(ExitCode::FAILURE);
    }
    Ok(if result.gpus.iter().any(|v| v.slow.is_some()) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// The bench view drawn below the prompt while the burn runs.
struct Live {
    term: Terminal<CrosstermBackend<std::io::Stdout>>,
    theme: crate::tui::theme::Theme,
}

impl Live {
    fn open(g: &GlobalArgs, paths: &crate::config::Paths) -> Option<Live> {
        let rows = crossterm::terminal::size().map_or(24, |(_, h)| h);
        let height = rows.saturating_sub(2).clamp(12, 30);
        let term = Terminal::with_options(
            CrosstermBackend::new(std::io::stdout()),
            TerminalOptions {
                viewport: Viewport::Inline(height),
            },
        )
        .ok()?;
        let name = g.theme.clone().unwrap_or_else(|| "dark".into());
        let (theme, _) = crate::tui::theme::load(&name, &paths.config.join("themes"));
        Some(Live { term, theme })
    }

    fn draw(&mut self, p: &BurnProgress) {
        let view = BenchView {
            progress: p,
            theme: &self.theme,
        };
        let _ = self.term.draw(|f| f.render_widget(&view, f.area()));
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        // Leave the last frame on screen and go on below it.
        println!();
    }
}

/// The verdict for people: a row a GPU, then the GPUs named as slow and why.
pub fn table(r: &BurnResult) -> String {
    let u = r.unit;
    let simulated = r.label == Label::Simulated;
    let mut out = format!(
        "bench burn · {} · {} · {}{}\n",
        r.workload.as_str(),
        format_duration(r.duration_s),
        r.label.as_str(),
        if simulated {
            ": figures of gpusim's model, not of hardware"
        } else {
            ""
        }
    );
    out += &format!(
        "steady = the last {:.0} % of the burn\n",
        burn::STEADY_SHARE * 100.0
    );
    out += &format!(
        "{:>4}  {:<22}  {:>15}  {:>6}  {:>9}  {:>6}  {:>10}  {:>10}\n",
        "GPU", "model", "steady rate", "temp", "clock", "power", "thermal at", "power at"
    );
    let at = |t: Option<f64>| t.map_or("never".into(), format_duration);
    for v in &r.gpus {
        let s = &v.steady;
        let name: String = v
            .name
            .as_deref()
            .unwrap_or("N/A")
            .chars()
            .take(22)
            .collect();
        out += &format!(
            "{:>4}  {name:<22}  {:>15}  {:>6}  {:>9}  {:>6}  {:>10}  {:>10}\n",
            v.gpu,
            u.rate(s.throughput_per_s),
            s.temperature_c
                .map_or("N/A".into(), |t| format!("{t:.0} °C")),
            s.sm_clock_mhz
                .map_or("N/A".into(), |c| format!("{c:.0} MHz")),
            s.power_w.map_or("N/A".into(), |p| format!("{p:.0} W")),
            at(v.thermal_slowdown_at_s),
            at(v.power_slowdown_at_s),
        );
    }
    let slow: Vec<_> = r.gpus.iter().filter(|v| v.slow.is_some()).collect();
    if slow.is_empty() && r.gpus.len() > 1 {
        out += &format!(
            "no GPU is {:.0} % or more below the median of its siblings\n",
            burn::SLOW_SHARE * 100.0
        );
    }
    for v in slow {
        if let Some(s) = &v.slow {
            out += &format!(
                "GPU {} is {:.0} % below the median of its siblings{}: {}\n",
                v.gpu,
                s.below_median_pct,
                if simulated { " (simulated)" } else { "" },
                s.cause
            );
        }
    }
    out
}
