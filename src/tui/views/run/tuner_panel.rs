//! The energy tuner's panel in the Run view, above the log while the console's tuner
//! works on the run shown (and after, until `t` closes it): the cap under test with how far
//! through its warm-up or measured window, the cost curve so far as a table with a bar per cap,
//! then the best cap and the saving, or why it stopped. See [`crate::tui::tuner`].

use crate::control::tuner::{Phase, Unit};
use crate::tui::app::App;
use crate::tui::feed::daemon::TunerEnd;
use crate::tui::tuner::TunerShown;
use crate::tui::widgets::bar;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Padding, Paragraph, Widget, Wrap};

/// Width of the bar drawn for each cap's cost.
const COST_BAR: usize = 20;

/// The panel's lines (without its border).
pub fn lines(app: &App, s: &TunerShown) -> Vec<Line<'static>> {
    let t = &app.theme;
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
            let is_best = best.is_some_and(|b| (b - c.cap_w).abs() < 0.5);
            let mut spans = vec![Span::raw(format!(
                "{:>6.0} {:>9.3} {:>9.3} {:>7.0} {:>10.3}  ",
                c.cap_w,
                c.energy_per_sample_j,
                1000.0 * c.time_per_sample_s,
                c.avg_power_w,
                c.cost
            ))];
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
pub fn height(app: &App, s: &TunerShown, area: Rect) -> u16 {
    let inner_w = area.width.saturating_sub(4).max(1) as usize;
    let rows: usize = lines(app, s)
        .iter()
        .map(|l| l.width().max(1).div_ceil(inner_w))
        .sum();
    (rows as u16 + 2).min(area.height.saturating_sub(3))
}

/// Draw the panel in `area` (see [`height`]). A panel too short keeps its first two lines
/// and the newest caps.
pub fn render(app: &App, s: &TunerShown, area: Rect, buf: &mut Buffer) {
    let t = &app.theme;
    let text = lines(app, s);
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
