//! The run's knobs in one line, at every size: batch size, prefetch and the power cap, each
//! after the key that changes it (`b batch size 512 → 1024  d prefetch 4  c power cap GPU 0
//! 450 W`). It sits in the bottom border of the run's panel, so it costs no row: where the band
//! with its knob panel does not fit (80×24), the keys are still in sight. In a replay it shows
//! the recorded values without keys (nothing changes the node there). Render only reads.

use crate::protocol::{KnobName, RunInfo};
use crate::tui::action::Action;
use crate::tui::data::Data;
use crate::tui::feed::Link;
use crate::tui::format::NA;
use crate::tui::keymap::Context;
use crate::tui::views::Ctx;
use ratatui::text::Span;
use unicode_width::UnicodeWidthStr;

/// Whether `run`'s trainer offers `knob`.
pub fn has_knob(data: &Data, run: &RunInfo, knob: KnobName) -> bool {
    data.metrics
        .of(&run.id)
        .and_then(|m| m.trainer.as_ref())
        .is_some_and(|tr| tr.knobs.iter().any(|k| k.knob == knob))
}

/// The GPU (a position in the snapshot) whose cap `c` sets from the Run view: the selected GPU
/// when the run uses it, else the run's first GPU that the node reports. None when the run
/// names no GPU the node has.
pub fn cap_target(data: &Data, run: &RunInfo, selected: usize) -> Option<usize> {
    let gpus = data.gpus();
    let uses: Vec<u32> = run
        .gpus
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let at = |index: u32| gpus.iter().position(|g| g.index == index);
    if gpus.get(selected).is_some_and(|g| uses.contains(&g.index)) {
        return Some(selected);
    }
    uses.iter().find_map(|i| at(*i))
}

/// The first key the Run view binds to `action`.
fn key_of(ctx: Ctx, action: Action) -> Option<String> {
    ctx.keymap
        .bindings(Context::Run)
        .iter()
        .find(|b| b.action == action)
        .and_then(|b| b.keys.first())
        .map(ToString::to_string)
}

/// One part of the row: its key, its name (long and short) and its value.
struct Part {
    key: String,
    name: &'static str,
    short: &'static str,
    value: String,
}

fn parts(ctx: Ctx, run: &RunInfo, selected: usize) -> Vec<Part> {
    let mut out = Vec::new();
    let knobs = ctx
        .data
        .metrics
        .of(&run.id)
        .and_then(|m| m.trainer.as_ref())
        .map_or(&[][..], |tr| &tr.knobs[..]);
    for (knob, name, short) in [
        (KnobName::BatchSize, "batch size", "batch"),
        (KnobName::Prefetch, "prefetch", "prefetch"),
    ] {
        let Some(key) = key_of(ctx, Action::SetKnob(knob)) else {
            continue;
        };
        // A knob the run does not offer is left out (its key does nothing there).
        let Some(k) = knobs.iter().find(|k| k.knob == knob) else {
            continue;
        };
        let now = k.value.map_or_else(|| NA.to_string(), |v| v.to_string());
        let value = match k.pending.filter(|p| Some(*p) != k.value) {
            Some(p) => format!("{now} → {p}"),
            None => now,
        };
        out.push(Part {
            key,
            name,
            short,
            value,
        });
    }
    if out.is_empty() {
        // Say so, rather than leave the keys to be guessed.
        out.push(Part {
            key: String::new(),
            name: "no knobs",
            short: "no knobs",
            value: "(a profile's [knobs.*] adds them)".into(),
        });
    }
    if let (Some(key), Some(g)) = (
        key_of(ctx, Action::PowerCap),
        cap_target(ctx.data, run, selected).and_then(|i| ctx.data.gpu(i)),
    ) {
        let cap = g
            .power_limit_w
            .map_or_else(|| NA.to_string(), |w| format!("{w:.0} W"));
        out.push(Part {
            key,
            name: "power cap",
            short: "cap",
            value: format!("GPU {} {cap}", g.index),
        });
    }
    out
}

/// The row's spans for `width` columns: the long names, else the short ones, else fewer
/// parts (the last first). Empty when the run has ended or has nothing to change.
pub fn spans(ctx: Ctx, run: &RunInfo, selected: usize, width: usize) -> Vec<Span<'static>> {
    let t = ctx.theme;
    if run.is_final() {
        return Vec::new();
    }
    let parts = parts(ctx, run, selected);
    let replaying = matches!(ctx.data.link, Link::Replay { .. });
    let build = |short: bool, n: usize| -> Vec<Span<'static>> {
        let mut spans = vec![Span::raw(" ")];
        for p in parts.iter().take(n) {
            let name = if short { p.short } else { p.name };
            if p.key.is_empty() {
                spans.push(Span::styled(format!("{name} "), t.dim));
                if !short {
                    spans.push(Span::styled(format!("{} ", p.value), t.dim));
                }
            } else if replaying {
                // The values as recorded; no key, as nothing changes the node in a replay.
                spans.push(Span::styled(format!("{name} "), t.dim));
                spans.push(Span::styled(format!("{} ", p.value), t.text));
            } else {
                spans.push(Span::styled(p.key.clone(), t.key));
                spans.push(Span::styled(format!(" {name} "), t.dim));
                spans.push(Span::styled(format!("{} ", p.value), t.text));
            }
            spans.push(Span::raw(" "));
        }
        spans.pop();
        spans
    };
    let fits = |s: &[Span]| s.iter().map(|s| s.content.width()).sum::<usize>() <= width;
    for n in (1..=parts.len()).rev() {
        for short in [false, true] {
            let s = build(short, n);
            if fits(&s) {
                return s;
            }
        }
    }
    Vec::new()
}
