//! What a straggler's GPU (against its siblings') or its own data wait says about why it is
//! slow: one function per cause, each `None` unless its evidence is there (the order they are
//! tried in is the module doc's of [`super`]).

use super::{CLOCK_BEHIND_SHARE, Cause, INPUT_GAP_SHARE, Spread, THERMAL_TARGET_MARGIN_C, median};
use crate::advisor::rules::{Window, ev};
use crate::advisor::{Evidence, Knob, RunWindow, Suggestion};
use crate::telemetry::{GpuSample, throttle};

/// The newest usable sample of GPU `index`.
pub(super) fn sample<'a>(w: &Window<'a>, index: u32) -> Option<&'a GpuSample> {
    w.input
        .gpus
        .iter()
        .find(|g| g.index == index)?
        .latest
        .as_ref()
        .filter(|s| !s.lost && !s.stale)
}

/// What the straggler's GPU and its siblings' show.
pub(super) struct Scene<'a> {
    pub(super) gpu: Option<&'a GpuSample>,
    pub(super) siblings: Vec<&'a GpuSample>,
    /// The job's processes (its ranks).
    pub(super) pids: Vec<u32>,
    /// The hottest the straggler's GPU was in the window, °C.
    pub(super) hottest_c: Option<f64>,
}

impl Scene<'_> {
    fn sib_median(&self, f: impl Fn(&GpuSample) -> Option<f64>) -> Option<f64> {
        median(self.siblings.iter().filter_map(|s| f(s)).collect())
    }

    /// The straggler's SM clock and its siblings' median, MHz.
    fn clocks(&self) -> (Option<f64>, Option<f64>) {
        let clock = |s: &GpuSample| s.sm_clock_mhz.map(f64::from);
        (self.gpu.and_then(clock), self.sib_median(clock))
    }

    fn clock_behind(&self) -> bool {
        match self.clocks() {
            (Some(c), Some(s)) => c < CLOCK_BEHIND_SHARE * s,
            _ => false,
        }
    }

    /// Processes on `s` that are not the job's.
    fn foreign<'s>(&self, s: &'s GpuSample) -> Vec<&'s crate::telemetry::GpuProcess> {
        s.processes
            .iter()
            .flatten()
            .filter(|p| !self.pids.contains(&p.pid))
            .collect()
    }
}

/// The cause in words (after "…slower than the median rank: "), its numbers and its action.
pub(super) struct Told {
    pub(super) cause: Cause,
    pub(super) words: String,
    pub(super) evidence: Vec<Evidence>,
    pub(super) action: Option<Suggestion>,
}

pub(super) fn thermal(sc: &Scene, margin_c: f64, gpu: u32) -> Option<Told> {
    let g = sc.gpu?;
    let bits = throttle::SW_THERMAL_SLOWDOWN | throttle::HW_THERMAL_SLOWDOWN;
    let flagged = g.throttle_reasons.is_some_and(|r| r & bits != 0);
    let slowdown = g.temp_slowdown_c;
    let temp = g.temperature_c;
    let hottest = sc.hottest_c.or(temp);
    let near = matches!((hottest, slowdown), (Some(h), Some(s)) if h >= s - margin_c);
    let held = near && sc.clock_behind();
    if !(flagged || held) {
        return None;
    }
    let mut parts = Vec::new();
    let mut evidence = Vec::new();
    match (temp, slowdown) {
        (Some(t), Some(s)) if t >= s - margin_c => {
            parts.push(format!("{t:.0} °C at its {s:.0} °C slowdown threshold"))
        }
        (Some(t), Some(s)) => parts.push(format!(
            "{t:.0} °C against its {s:.0} °C slowdown threshold"
        )),
        (Some(t), None) => parts.push(format!("{t:.0} °C")),
        _ => {}
    }
    if let Some(t) = temp {
        evidence.push(ev("temperature", t, "C"));
    }
    if let Some(s) = slowdown {
        evidence.push(ev("slowdown threshold", s, "C"));
    }
    let (clock, sib) = sc.clocks();
    let max = g.sm_clock_max_mhz.map(f64::from);
    if let Some(c) = clock {
        let mut s = format!("SM {c:.0} MHz");
        if let Some(m) = max {
            s.push_str(&format!(" against {m:.0} MHz max"));
        }
        if let Some(sc) = sib {
            s.push_str(&format!(" while its siblings run at {sc:.0} MHz"));
        }
        parts.push(s);
        evidence.push(ev("SM clock", c, "MHz"));
    }
    if let Some(m) = max {
        evidence.push(ev("SM clock max", m, "MHz"));
    }
    if let Some(s) = sib {
        evidence.push(ev("siblings' SM clock (median)", s, "MHz"));
    }
    let words = if parts.is_empty() {
        "thermal slowdown".to_string()
    } else {
        format!("thermal slowdown — {}", parts.join(", "))
    };
    Some(Told {
        cause: Cause::ThermalSlowdown,
        words,
        evidence,
        action: slowdown.map(|s| Suggestion::ThermalTarget {
            gpus: vec![gpu],
            celsius: (s - THERMAL_TARGET_MARGIN_C).round(),
        }),
    })
}

pub(super) fn power_cap(sc: &Scene, gpu: u32) -> Option<Told> {
    let g = sc.gpu?;
    let cap = g.power_enforced_w.or(g.power_limit_w)?;
    let capped = match (g.throttle_reasons, g.power_w) {
        (Some(r), _) => r & throttle::SW_POWER_CAP != 0,
        (None, Some(p)) => p >= 0.98 * cap,
        (None, None) => false,
    };
    let sib_cap = sc.sib_median(|s| s.power_enforced_w.or(s.power_limit_w));
    let lower =
        sib_cap.is_some_and(|s| cap < s - 1.0) || g.power_default_w.is_some_and(|d| cap < d - 1.0);
    if !capped || !(lower || sc.clock_behind()) {
        return None;
    }
    let mut evidence = vec![ev("power cap", cap, "W")];
    let mut words = match g.power_w {
        Some(p) => {
            evidence.insert(0, ev("power drawn", p, "W"));
            format!("power cap — {p:.0} W at its {cap:.0} W cap")
        }
        None => format!("power cap — held at its {cap:.0} W cap"),
    };
    if let Some(s) = sib_cap {
        words.push_str(&format!(" while its siblings may draw {s:.0} W"));
        evidence.push(ev("siblings' power cap (median)", s, "W"));
    }
    let (clock, sib) = sc.clocks();
    if let (Some(c), Some(s)) = (clock, sib) {
        words.push_str(&format!(", SM {c:.0} MHz against their {s:.0} MHz"));
        evidence.push(ev("SM clock", c, "MHz"));
        evidence.push(ev("siblings' SM clock (median)", s, "MHz"));
    }
    let target = sib_cap
        .filter(|s| *s > cap + 1.0)
        .or(g.power_default_w.filter(|d| *d > cap + 1.0));
    Some(Told {
        cause: Cause::PowerCap,
        words,
        evidence,
        action: target.map(|watts| Suggestion::PowerCap {
            gpus: vec![gpu],
            watts,
        }),
    })
}

pub(super) fn pcie_link(sc: &Scene) -> Option<Told> {
    let g = sc.gpu?;
    let (gen_, width) = (g.pcie_gen?, g.pcie_width?);
    let sib_gen = sc.siblings.iter().filter_map(|s| s.pcie_gen).max()?;
    let sib_width = sc.siblings.iter().filter_map(|s| s.pcie_width).max()?;
    if gen_ >= sib_gen && width >= sib_width {
        return None;
    }
    Some(Told {
        cause: Cause::PcieLink,
        words: format!(
            "degraded PCIe link — Gen{gen_} x{width} against Gen{sib_gen} x{sib_width} on its siblings (reseat the card or check its riser and slot)"
        ),
        evidence: vec![
            ev("PCIe generation", f64::from(gen_), ""),
            ev("PCIe width", f64::from(width), "lanes"),
            ev("siblings' PCIe generation", f64::from(sib_gen), ""),
            ev("siblings' PCIe width", f64::from(sib_width), "lanes"),
        ],
        action: None,
    })
}

pub(super) fn other_process(sc: &Scene, gpu: u32) -> Option<Told> {
    let g = sc.gpu?;
    g.processes.as_ref()?;
    let mine = sc.foreign(g);
    let theirs = median(
        sc.siblings
            .iter()
            .filter(|s| s.processes.is_some())
            .map(|s| sc.foreign(s).len() as f64)
            .collect(),
    )
    .unwrap_or(0.0);
    if (mine.len() as f64) <= theirs {
        return None;
    }
    let p = mine
        .iter()
        .max_by_key(|p| p.used_memory_bytes.unwrap_or(0))?;
    let name = p
        .name
        .as_deref()
        .map_or(String::new(), |n| format!(" ({n})"));
    let gib = p.used_memory_bytes.map(|b| b as f64 / (1u64 << 30) as f64);
    let held = gib.map_or(String::new(), |g| format!(", {g:.1} GiB"));
    let more = match mine.len() {
        1 => String::new(),
        n => format!(" and {} more", n - 1),
    };
    let mut evidence = vec![
        ev("other process pid", f64::from(p.pid), ""),
        ev("processes not the job's", mine.len() as f64, ""),
    ];
    if let Some(g) = gib {
        evidence.push(ev("its GPU memory", g, "GiB"));
    }
    Some(Told {
        cause: Cause::OtherProcess,
        words: format!(
            "another process on its GPU — pid {}{name}{held}{more} shares GPU {gpu} with it; move it or stop it",
            p.pid
        ),
        evidence,
        action: None,
    })
}

pub(super) fn input_pipeline(run: &RunWindow, sp: &Spread) -> Option<Told> {
    let (wait, others) = (sp.data_wait_s?, sp.others_data_wait_s.unwrap_or(0.0));
    let gap = sp.step_s - sp.others_step_s;
    if wait <= others || wait - others < INPUT_GAP_SHARE * gap {
        return None;
    }
    let prefetch = run
        .ranks
        .iter()
        .find(|r| r.rank == sp.rank)
        .and_then(|r| r.metrics.iter().rev().find_map(|m| m.prefetch));
    let max = run.prefetch_range.map_or(u32::MAX, |r| r.1);
    let next = prefetch
        .map(|p| (p * 2).max(p + 1).min(max))
        .filter(|n| Some(*n) != prefetch);
    let mut words = format!(
        "its own input pipeline — it waits {:.0} ms a step for data against {:.0} ms on the other ranks",
        1000.0 * wait,
        1000.0 * others
    );
    match (prefetch, next) {
        (Some(p), Some(n)) => words.push_str(&format!("; raise prefetch {p} → {n}")),
        (Some(p), None) => words.push_str(&format!(
            "; prefetch is at its maximum ({p}): add loader workers or look at its host"
        )),
        (None, _) => {}
    }
    let mut evidence = vec![
        ev(&format!("data wait (rank {})", sp.rank), wait, "s"),
        ev("data wait (median of the other ranks)", others, "s"),
    ];
    if let Some(p) = prefetch {
        evidence.push(ev("prefetch depth", f64::from(p), ""));
    }
    Some(Told {
        cause: Cause::InputPipeline,
        words,
        evidence,
        action: next.map(|n| Suggestion::SetKnob {
            run: run.run.clone(),
            knob: Knob::Prefetch,
            value: f64::from(n),
        }),
    })
}
