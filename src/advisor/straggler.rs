//! The straggler of a data-parallel job: the rank every other rank waits for at each gradient
//! all-reduce, and why.
//!
//! Each rank reports its own step time (what its step would take alone: compute and data wait;
//! the synthetic trainer and the SDK report the wait for the others apart, as `sync_wait_s`).
//! Over each rank's newest [`REPORTS`] reports inside the window (at least [`MIN_REPORTS`] of
//! them, so one slow step is not a straggler), the rank with the longest median step is the
//! straggler when that median is at least [`RATIO`] times the median of the other ranks'. By
//! count, not by time: a rank reporting four times a second is judged on its last four seconds,
//! one reporting every ten seconds on its last minutes, and a straggler that recovered stops
//! being named as soon as its newest reports say so.
//!
//! The cause is read from its GPU's newest sample (the rank's `gpu` → the telemetry's GPU of
//! that index) against its siblings' (the other ranks' GPUs), in this order:
//!
//! 1. **thermal slowdown**: a thermal throttle reason, or the temperature at its slowdown
//!    threshold with the SM clock well below the siblings' → a thermal target a few degrees
//!    lower (the governor trades a little clock for no slowdown);
//! 2. **power cap**: the software power-cap reason (or the draw at the cap) with a cap below
//!    the siblings' or the clock below theirs → the siblings' cap;
//! 3. **degraded PCIe link**: a lower link generation or width than its siblings' (only where
//!    telemetry has them) → no command: reseat the card, check the riser;
//! 4. **another process on its GPU**: more processes that are not the job's ranks than its
//!    siblings have (a simulated node shows one made-up process per busy GPU, so the count is
//!    compared, not the presence);
//! 5. **its own input pipeline**: its data wait explains at least half of the gap to the
//!    others → a deeper prefetch.
//!
//! Otherwise it is named without a cause its GPU shows. "The job loses" is the share of each
//! step the others spend waiting: `(own − median of others) / own`.

use serde::{Deserialize, Serialize};

use super::rules::{Window, ev};
use super::{Evidence, Hint, HintKind, Knob, MetricsPoint, RankWindow, RunWindow, Suggestion};
use crate::telemetry::{GpuSample, throttle};

/// A rank is a straggler when its own step time is at least this many times the median of the
/// others'.
pub const RATIO: f64 = 1.10;
/// Each rank is judged on at most its newest this many reports (inside the window).
pub const REPORTS: usize = 16;
/// Each rank compared needs at least this many reports in that time.
pub const MIN_REPORTS: usize = 5;
/// The thermal target suggested for a throttled straggler, below its slowdown temperature, °C.
pub const THERMAL_TARGET_MARGIN_C: f64 = 7.0;
/// The straggler's clock counts as held down below this share of its siblings'.
pub const CLOCK_BEHIND_SHARE: f64 = 0.9;
/// Its input pipeline is the cause when its extra data wait is at least this share of the gap.
pub const INPUT_GAP_SHARE: f64 = 0.5;

/// How far the slowest rank of a job is behind the others.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    /// The slowest rank.
    pub rank: u32,
    /// Its GPU, where it said.
    pub gpu: Option<u32>,
    /// Its own step time (the median of its recent reports), seconds.
    pub step_s: f64,
    /// The median of the other ranks' own step times, seconds.
    pub others_step_s: f64,
    /// `step_s / others_step_s`.
    pub ratio: f64,
    /// Its data wait and the others' (medians), seconds, where reported.
    pub data_wait_s: Option<f64>,
    pub others_data_wait_s: Option<f64>,
    /// Ranks with enough reports to compare.
    pub ranks: usize,
}

impl Spread {
    /// How much slower than the median rank, percent.
    pub fn slower_pct(&self) -> f64 {
        100.0 * (self.ratio - 1.0)
    }

    /// The share of each step the others wait for it, percent.
    pub fn loss_pct(&self) -> f64 {
        100.0 * (self.step_s - self.others_step_s).max(0.0) / self.step_s
    }
}

/// Why a straggler is slow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    ThermalSlowdown,
    PowerCap,
    PcieLink,
    OtherProcess,
    InputPipeline,
    /// Its GPU shows nothing its siblings' do not, and its data wait is like theirs.
    Unknown,
}

/// The straggler verdict on one job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub run: String,
    /// None: too few ranks with enough recent reports to compare.
    pub spread: Option<Spread>,
    /// What its GPU (or its data wait) shows, when it is a straggler.
    pub cause: Option<Cause>,
    /// The straggler hint, when the spread makes one.
    pub hint: Option<Hint>,
}

/// The kind of GPU hint a straggler hint already says, for its GPU.
pub(super) fn covers(cause: Cause) -> Option<HintKind> {
    match cause {
        Cause::ThermalSlowdown => Some(HintKind::ThermalThrottle),
        Cause::PowerCap => Some(HintKind::PowerCapThrottle),
        _ => None,
    }
}

/// The verdict on `run`; None for a run of fewer than two ranks.
pub(super) fn assess(w: &Window, run: &RunWindow) -> Option<Verdict> {
    if run.ranks.len() < 2 {
        return None;
    }
    let spread = spread(w, run);
    let found = spread
        .as_ref()
        .filter(|s| s.ratio >= w.th.straggler_ratio)
        .map(|s| hint(w, run, s));
    Some(Verdict {
        run: run.run.clone(),
        spread,
        cause: found.as_ref().map(|f| f.1),
        hint: found.map(|f| f.0),
    })
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// One rank's recent medians: (rank, step, data wait).
fn rank_medians<'r>(w: &Window, r: &'r RankWindow) -> Option<(&'r RankWindow, f64, Option<f64>)> {
    let mut recent: Vec<&MetricsPoint> = r
        .metrics
        .iter()
        .rev()
        .filter(|m| m.t >= w.from && m.t <= w.input.now)
        .filter(|m| m.step_time_s.is_some_and(|s| s > 0.0))
        .take(w.th.straggler_reports.max(1))
        .collect();
    recent.reverse();
    if recent.len() < w.th.straggler_min_reports.max(1) {
        return None;
    }
    let step = median(recent.iter().filter_map(|m| m.step_time_s).collect())?;
    let wait = median(recent.iter().filter_map(|m| m.data_wait_s).collect());
    Some((r, step, wait))
}

/// The slowest rank against the median of the others, over their recent reports.
pub(super) fn spread(w: &Window, run: &RunWindow) -> Option<Spread> {
    let per: Vec<(&RankWindow, f64, Option<f64>)> = run
        .ranks
        .iter()
        .filter_map(|r| rank_medians(w, r))
        .collect();
    if per.len() < 2 {
        return None;
    }
    let slowest = per
        .iter()
        .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.rank.cmp(&a.0.rank)))?;
    let others: Vec<&(&RankWindow, f64, Option<f64>)> =
        per.iter().filter(|p| p.0.rank != slowest.0.rank).collect();
    let others_step_s = median(others.iter().map(|p| p.1).collect())?;
    if others_step_s <= 0.0 {
        return None;
    }
    Some(Spread {
        rank: slowest.0.rank,
        gpu: slowest.0.gpu,
        step_s: slowest.1,
        others_step_s,
        ratio: slowest.1 / others_step_s,
        data_wait_s: slowest.2,
        others_data_wait_s: median(others.iter().filter_map(|p| p.2).collect()),
        ranks: per.len(),
    })
}

/// The newest usable sample of GPU `index`.
fn sample<'a>(w: &Window<'a>, index: u32) -> Option<&'a GpuSample> {
    w.input
        .gpus
        .iter()
        .find(|g| g.index == index)?
        .latest
        .as_ref()
        .filter(|s| !s.lost && !s.stale)
}

/// What the straggler's GPU and its siblings' show.
struct Scene<'a> {
    gpu: Option<&'a GpuSample>,
    siblings: Vec<&'a GpuSample>,
    /// The job's processes (its ranks).
    pids: Vec<u32>,
    /// The hottest the straggler's GPU was in the window, °C.
    hottest_c: Option<f64>,
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
struct Told {
    cause: Cause,
    words: String,
    evidence: Vec<Evidence>,
    action: Option<Suggestion>,
}

fn thermal(sc: &Scene, margin_c: f64, gpu: u32) -> Option<Told> {
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
            gpu,
            celsius: (s - THERMAL_TARGET_MARGIN_C).round(),
        }),
    })
}

fn power_cap(sc: &Scene, gpu: u32) -> Option<Told> {
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
        action: target.map(|watts| Suggestion::PowerCap { gpu, watts }),
    })
}

fn pcie_link(sc: &Scene) -> Option<Told> {
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

fn other_process(sc: &Scene, gpu: u32) -> Option<Told> {
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

fn input_pipeline(run: &RunWindow, sp: &Spread) -> Option<Told> {
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

/// The straggler hint for `sp`, with its cause.
fn hint(w: &Window, run: &RunWindow, sp: &Spread) -> (Hint, Cause) {
    let sibling_gpus: Vec<u32> = run
        .ranks
        .iter()
        .filter(|r| r.rank != sp.rank)
        .filter_map(|r| r.gpu)
        .filter(|g| Some(*g) != sp.gpu)
        .collect();
    let hottest_c = sp.gpu.and_then(|i| {
        let s = w.input.gpus.iter().find(|g| g.index == i)?;
        s.points
            .iter()
            .filter(|p| p.t >= w.from && p.t <= w.input.now)
            .filter_map(|p| p.temperature_c)
            .chain(s.latest.as_ref().and_then(|l| l.temperature_c))
            .reduce(f64::max)
    });
    let scene = Scene {
        gpu: sp.gpu.and_then(|g| sample(w, g)),
        siblings: sibling_gpus.iter().filter_map(|g| sample(w, *g)).collect(),
        pids: run.ranks.iter().filter_map(|r| r.pid).collect(),
        hottest_c,
    };
    let told = sp
        .gpu
        .and_then(|g| {
            thermal(&scene, w.th.thermal_margin_c, g)
                .or_else(|| power_cap(&scene, g))
                .or_else(|| pcie_link(&scene))
                .or_else(|| other_process(&scene, g))
        })
        .or_else(|| input_pipeline(run, sp))
        .unwrap_or_else(|| Told {
            cause: Cause::Unknown,
            words: match (sp.gpu, scene.gpu) {
                (Some(_), Some(_)) => "its GPU shows no cause (no throttling, its link and processes like its siblings') and its data wait is like theirs: look at its host (CPU, memory, network)".into(),
                (Some(g), None) => format!("GPU {g} is not in this node's telemetry, and its data wait is like the other ranks': look at its node"),
                (None, _) => "it did not say which GPU it trains on, and its data wait is like the other ranks'".into(),
            },
            evidence: Vec::new(),
            action: None,
        });
    let whose = match sp.gpu {
        Some(g) => format!("rank {} on GPU {g}", sp.rank),
        None => format!("rank {}", sp.rank),
    };
    let summary = format!(
        "{whose} is {:.0}% slower than the median rank: {}; the job loses {:.0}% of its time",
        sp.slower_pct(),
        told.words,
        sp.loss_pct()
    );
    let mut evidence = vec![
        ev(&format!("step time (rank {})", sp.rank), sp.step_s, "s"),
        ev(
            "step time (median of the other ranks)",
            sp.others_step_s,
            "s",
        ),
        ev("slower than the median rank", sp.slower_pct(), "%"),
        ev("job time lost", sp.loss_pct(), "%"),
        ev("ranks compared", sp.ranks as f64, ""),
    ];
    evidence.extend(told.evidence);
    (
        Hint {
            kind: HintKind::Straggler,
            gpu: sp.gpu,
            run: Some(run.run.clone()),
            summary,
            evidence,
            action: told.action,
        },
        told.cause,
    )
}
