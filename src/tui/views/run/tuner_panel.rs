//! The energy tuner's panel in the Run view, above the log while the console's tuner
//! works on the run shown (and after, until `t` closes it): the cap under test with how far
//! through its warm-up or measured window, the cost curve so far as a table with a bar per cap,
//! then the best cap and the saving, or why it stopped. Also the tuner's part of the console
//! state ([`TunerUi`]: the search shown, the footer's question); what `t` and the feed's reports
//! do to it is in `app/tuner.rs`.

use crate::control::tuner::{Phase, Progress, Unit, Window};
use crate::tui::feed::daemon::{TunerEnd, TunerEvent};
use crate::tui::theme::Theme;
use crate::tui::widgets::bar;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Padding, Paragraph, Widget, Wrap};

/// A y/n question in the footer about the tuner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TuneAsk {
    /// Start a search on this run.
    Start(String),
    /// Stop the search running on this run.
    Stop(String),
}

/// The search the console started, as shown.
#[derive(Debug, Clone, PartialEq)]
pub struct TunerShown {
    pub run: String,
    pub gpus: Vec<u32>,
    pub plan: Vec<f64>,
    pub window: Option<Window>,
    pub eta: Option<f64>,
    pub progress: Option<Progress>,
    /// None while it runs.
    pub end: Option<TunerEnd>,
    /// A stop was asked for and not yet carried out.
    pub stopping: bool,
}

impl TunerShown {
    /// A search asked for on `run`, before its thread reports.
    pub fn starting(run: &str) -> TunerShown {
        TunerShown {
            run: run.to_string(),
            gpus: Vec::new(),
            plan: Vec::new(),
            window: None,
            eta: None,
            progress: None,
            end: None,
            stopping: false,
        }
    }

    pub fn running(&self) -> bool {
        self.end.is_none()
    }
}

/// The tuner's part of the console state.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TunerUi {
    pub ask: Option<TuneAsk>,
    pub shown: Option<TunerShown>,
}

impl TunerUi {
    /// Take in the tuner's report.
    pub fn on_event(&mut self, e: &TunerEvent) {
        let run = match e {
            TunerEvent::Started { run, .. }
            | TunerEvent::Progress { run, .. }
            | TunerEvent::Ended { run, .. } => run,
        };
        let shown = match &mut self.shown {
            Some(s) if &s.run == run => s,
            // A report about a search this console state did not start (a reconnect): show it.
            slot => slot.insert(TunerShown::starting(run)),
        };
        match e {
            TunerEvent::Started {
                gpus,
                plan,
                window,
                eta,
                ..
            } => {
                shown.gpus = gpus.clone();
                shown.plan = plan.clone();
                shown.window = Some(*window);
                shown.eta = Some(*eta);
            }
            TunerEvent::Progress { progress, .. } => shown.progress = Some(progress.clone()),
            TunerEvent::Ended { end, .. } => {
                if let TunerEnd::Done { result, .. } = end {
                    let p = shown.progress.get_or_insert_with(|| Progress {
                        phase: crate::control::tuner::Phase::Done,
                        cap_w: None,
                        index: 0,
                        planned: result.planned,
                        fraction: 1.0,
                        curve: Vec::new(),
                        best_cap_w: None,
                        batch: None,
                        knob: result.knob,
                    });
                    p.curve = result.curve.clone();
                    p.best_cap_w = Some(result.best.cap_w);
                }
                shown.end = Some(end.clone());
                shown.stopping = false;
            }
        }
    }

    /// The tuner shown with run `id`, if any.
    pub fn of(&self, id: &str) -> Option<&TunerShown> {
        self.shown.as_ref().filter(|s| s.run == id)
    }
}

/// The footer's question.
pub fn question(ask: &TuneAsk) -> (String, &'static str) {
    match ask {
        TuneAsk::Start(run) => (
            format!(" Tune run {run}'s power cap for energy? "),
            " starts it (it stops if the console quits) · any other key: no",
        ),
        TuneAsk::Stop(run) => (
            format!(" Stop the tuner on run {run}? "),
            " stops it and puts the starting caps back · any other key: no",
        ),
    }
}

/// Width of the bar drawn for each cap's cost.
const COST_BAR: usize = 20;

/// The panel's lines (without its border).
pub fn lines(t: &Theme, s: &TunerShown) -> Vec<Line<'static>> {
    let dim = |x: String| Span::styled(x, t.dim);
    let mut out = Vec::new();
    let mut about = Vec::new();
    if !s.gpus.is_empty() {
        let gpus: Vec<String> = s.gpus.iter().map(u32::to_string).collect();
        about.push(format!("GPU {}", gpus.join(",")));
    }
    if let Some(w) = s.window {
        let unit = match w.unit {
            Unit::Steps => "steps",
            Unit::Seconds => "s",
        };
        about.push(format!("{} + {} {unit} per cap", w.warmup, w.measure));
    }
    if let Some(eta) = s.eta {
        about.push(format!("eta {eta}"));
    }
    if !s.plan.is_empty() {
        about.push(format!("{} caps planned", s.plan.len()));
    }
    // Where it stands.
    match (&s.progress, &s.end) {
        (_, Some(_)) => {}
        (None, None) if s.plan.is_empty() => out.push(Line::from(dim(
            "starting: reading the run's GPUs and power limits from the daemon…".into(),
        ))),
        (None, None) => out.push(Line::from(dim(
            "waiting for the run's first metrics report…".into(),
        ))),
        (Some(p), None) => {
            let phase = match p.phase {
                Phase::NotStarted => "waiting",
                Phase::WarmUp => "warming up",
                Phase::Measure => "measuring",
                Phase::Done => "done",
                Phase::Cancelled => "cancelled",
            };
            let mut spans = vec![Span::styled("cap ", t.dim)];
            match p.cap_w {
                Some(w) => {
                    spans.push(Span::styled(format!("{w:.0} W"), t.title));
                    spans.push(dim(format!(" [{}/{}] ", p.index + 1, p.planned)));
                }
                None => spans.push(Span::raw("- ")),
            }
            if let Some(b) = p.batch.as_ref().and_then(|b| b.current) {
                spans.push(Span::styled(format!("batch {b} "), t.title));
            }
            spans.push(Span::raw(format!("{phase} ")));
            spans.extend(bar(Some(p.fraction), 16, t.power, t.gauge_empty));
            spans.push(Span::raw(format!(" {:>3.0}%", 100.0 * p.fraction)));
            if s.stopping {
                spans.push(Span::styled("  stopping: caps go back…", t.warn));
            }
            out.push(Line::from(spans));
        }
    }
    if !about.is_empty() {
        out.push(Line::from(dim(about.join(" · "))));
    }
    if let Some(b) = s.progress.as_ref().and_then(|p| p.batch.as_ref()) {
        let planned: Vec<String> = b.planned.iter().map(u32::to_string).collect();
        out.push(Line::from(dim(format!(
            "batch size searched too, from {} ({}){}",
            b.start,
            planned.join(", "),
            b.oom.map_or(String::new(), |o| format!(
                " · batch {o} ran out of memory: avoided"
            ))
        ))));
        out.push(Line::styled(
            format!("warning: {}", crate::control::tuner::joint::BATCH_WARNING),
            t.warn,
        ));
    }
    // The curve so far.
    let curve = s.progress.as_ref().map_or(&[][..], |p| p.curve.as_slice());
    let best = s.progress.as_ref().and_then(|p| p.best_cap_w);
    if !curve.is_empty() {
        out.push(Line::from(dim(format!(
            "{:>6} {:>9} {:>9} {:>7} {:>10}  (Zeus's cost per sample, J)",
            "cap W", "J/sample", "ms/sample", "mean W", "cost"
        ))));
        let lo = curve.iter().map(|c| c.cost).fold(f64::INFINITY, f64::min);
        let hi = curve
            .iter()
            .map(|c| c.cost)
            .fold(f64::NEG_INFINITY, f64::max);
        for c in curve {
            // The bar spans the curve's range, with a sliver for the lowest.
            let ratio = if hi > lo {
                0.05 + 0.95 * (c.cost - lo) / (hi - lo)
            } else {
                0.5
            };
            let is_best = best.is_some_and(|b| (b - c.cap_w).abs() < 0.5)
                && (c.batch.is_none() || c.cost <= lo);
            let mut spans = Vec::new();
            if let Some(b) = c.batch {
                spans.push(Span::styled(format!("b{b:<5}"), t.dim));
            }
            spans.push(Span::raw(format!(
                "{:>6.0} {:>9.3} {:>9.3} {:>7.0} {:>10.3}  ",
                c.cap_w,
                c.energy_per_sample_j,
                1000.0 * c.time_per_sample_s,
                c.avg_power_w,
                c.cost
            )));
            spans.extend(bar(
                Some(ratio),
                COST_BAR,
                if is_best { t.ok } else { t.util },
                t.gauge_empty,
            ));
            if is_best {
                spans.push(Span::styled(" ← best", t.ok));
            }
            out.push(Line::from(spans));
        }
    }
    match &s.end {
        None => {}
        Some(TunerEnd::Done { result, saved }) => {
            out.push(Line::styled(result.summary(), t.ok));
            if let Some(line) = crate::control::tuner::record::saving_line(result, None) {
                out.push(Line::from(dim(line)));
            }
            out.push(Line::from(dim(format!(
                "for the profile: {}",
                crate::control::tuner::record::suggestion(result)
                    .lines()
                    .skip(2)
                    .filter(|l| !l.is_empty())
                    .collect::<Vec<_>>()
                    .join(" ")
            ))));
            out.push(Line::from(dim(match saved {
                Ok(p) => format!("set on the run's GPUs · saved to {p}"),
                Err(e) => format!("set on the run's GPUs · not saved: {e}"),
            })));
        }
        Some(TunerEnd::Cancelled { why, restored }) => match restored {
            Ok(()) => out.push(Line::styled(
                format!("stopped ({why}): every GPU of the run is back at its starting cap"),
                t.warn,
            )),
            Err(e) => out.push(Line::styled(
                format!(
                    "stopped ({why}); putting the starting caps back failed: {e} (check with \
                     `gpupilot power`)"
                ),
                t.crit,
            )),
        },
        Some(TunerEnd::Failed(e)) => out.push(Line::styled(e.clone(), t.crit)),
    }
    out
}

/// Rows the panel takes at the top of the log's `area`: its lines (wrapped to the width) and
/// border, leaving the log at least three rows.
pub fn height(t: &Theme, s: &TunerShown, area: Rect) -> u16 {
    let inner_w = area.width.saturating_sub(4).max(1) as usize;
    let rows: usize = lines(t, s)
        .iter()
        .map(|l| l.width().max(1).div_ceil(inner_w))
        .sum();
    (rows as u16 + 2).min(area.height.saturating_sub(3))
}

/// Draw the panel in `area` (see [`height`]). A panel too short keeps its first two lines
/// and the newest caps.
pub fn render(t: &Theme, s: &TunerShown, area: Rect, buf: &mut Buffer) {
    let text = lines(t, s);
    let h = area.height;
    let panel = area;
    Clear.render(panel, buf);
    let keys = if s.running() {
        " t: stop (caps go back) "
    } else {
        " t: close "
    };
    let block = Block::bordered()
        .border_style(t.border_selected)
        .title(Span::styled(" Energy tuner ", t.title))
        .title(Line::styled(keys, t.dim).right_aligned())
        .padding(Padding::horizontal(1))
        .style(t.text);
    let inner_h = h.saturating_sub(2) as usize;
    let scroll = text.len().saturating_sub(inner_h);
    let header = 2.min(text.len());
    let text = if scroll > 0 && text.len() > header + scroll {
        let mut kept: Vec<Line> = text[..header].to_vec();
        kept.extend(text[header + scroll..].iter().cloned());
        kept
    } else {
        text
    };
    Paragraph::new(text)
        .block(block)
        .wrap(Wrap { trim: false })
        .render(panel, buf);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::tuner::{CapPoint, TuneResult};

    fn point(cap_w: f64, cost: f64) -> CapPoint {
        CapPoint {
            se_pct: None,
            cap_w,
            batch: None,
            energy_j: 100.0,
            samples: 10.0,
            seconds: 1.0,
            energy_per_sample_j: 10.0,
            time_per_sample_s: 0.1,
            avg_power_w: 100.0,
            cost,
        }
    }

    fn progress(curve: Vec<CapPoint>) -> Progress {
        Progress {
            phase: Phase::Measure,
            cap_w: Some(650.0),
            index: 2,
            planned: 5,
            fraction: 0.5,
            curve,
            best_cap_w: Some(700.0),
            batch: None,
            knob: Default::default(),
        }
    }

    #[test]
    fn reports_build_up_what_the_panel_shows() {
        let mut ui = TunerUi {
            shown: Some(TunerShown::starting("r")),
            ..TunerUi::default()
        };
        ui.on_event(&TunerEvent::Started {
            run: "r".into(),
            gpus: vec![0, 1],
            plan: vec![700.0, 675.0],
            window: Window::DEFAULT_STEPS,
            eta: 0.5,
        });
        ui.on_event(&TunerEvent::Progress {
            run: "r".into(),
            progress: progress(vec![point(700.0, 3.0)]),
        });
        let s = ui.of("r").expect("shown");
        assert!(s.running());
        assert_eq!((s.gpus.as_slice(), s.plan.len()), (&[0, 1][..], 2));
        assert_eq!(s.progress.as_ref().unwrap().curve.len(), 1);
        assert!(ui.of("other").is_none());

        // The result's curve is the final one, and its best cap is marked.
        let mut result = TuneResult {
            confidence: None,
            saving_uncertainty_pct: None,
            knob: Default::default(),
            other: None,
            eta: 0.5,
            max_power_w: 1400.0,
            window: Window::DEFAULT_STEPS,
            start_w: 700.0,
            default_w: 700.0,
            best: point(675.0, 2.0),
            default: Some(point(700.0, 3.0)),
            curve: vec![point(700.0, 3.0), point(675.0, 2.0)],
            energy_saving_pct: Some(5.0),
            time_change_pct: Some(1.0),
            cost_saving_pct: Some(33.0),
            stopped_early: false,
            strategy: crate::control::tuner::Strategy::Golden,
            planned: 2,
            duration_s: 60.0,
            batch: None,
        };
        result.best.cap_w = 675.0;
        ui.on_event(&TunerEvent::Ended {
            run: "r".into(),
            end: TunerEnd::Done {
                result: Box::new(result),
                saved: Ok("/x/tune-energy.json".into()),
            },
        });
        let s = ui.of("r").unwrap();
        assert!(!s.running());
        let p = s.progress.as_ref().unwrap();
        assert_eq!((p.curve.len(), p.best_cap_w), (2, Some(675.0)));
    }

    #[test]
    fn a_report_about_another_run_replaces_what_is_shown() {
        let mut ui = TunerUi {
            shown: Some(TunerShown::starting("a")),
            ..TunerUi::default()
        };
        ui.on_event(&TunerEvent::Ended {
            run: "b".into(),
            end: TunerEnd::Failed("no metrics".into()),
        });
        assert!(ui.of("a").is_none());
        assert_eq!(
            ui.of("b").and_then(|s| s.end.clone()),
            Some(TunerEnd::Failed("no metrics".into()))
        );
    }
}
