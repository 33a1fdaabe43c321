//! The node power budget: share a fixed number of watts among the GPUs' caps so that their sum
//! never exceeds it, following demand.
//!
//! Every GPU first gets its minimum cap. What is left goes where it is wanted: a GPU whose cap
//! holds it back (the driver reports a power-cap throttle, or it draws within a few watts of its
//! cap) wants more than its cap; any other wants what it draws plus some headroom. When the wants
//! fit, each GPU gets its want and the spare watts are shared out evenly up to each ceiling
//! (water-filling), so a GPU can surge without waiting for the next decision; when they do not
//! fit, each gets its minimum plus a share of the rest in proportion to how much it wants above
//! its minimum. Caps are rounded down to whole watts, so rounding never adds a watt.
//!
//! The GPUs of a data-parallel job held together (`control::jobs`) are shared as one unit and
//! split evenly, so the budget never makes one of its ranks the straggler ([`allocate_jobs`]).
//!
//! A GPU that cannot be changed (lost, or no limits known) keeps its cap, and that cap counts
//! against the budget. When the minimums (plus the fixed caps) alone exceed the budget, no
//! allocation can honour it: [`allocate`] says so and sets every cap to its minimum, the
//! closest it can come.
//!
//! Pure: the caller (the daemon's control loop) applies the caps, lowering caps before raising
//! any, so the sum stays within the budget while it changes them.

use serde::{Deserialize, Serialize};

/// One GPU as the budget sees it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BudgetGpu {
    pub index: u32,
    /// The cap set now, watts.
    pub cap_w: f64,
    pub min_w: f64,
    /// The most this GPU may get: its maximum, lowered by the user's cap and the governor.
    pub ceiling_w: f64,
    /// Power drawn now, watts; None when unknown.
    pub draw_w: Option<f64>,
    /// The clock is held down by the power cap now.
    pub cap_limited: bool,
    /// The cap cannot be changed (lost GPU, no limits): it stays and counts against the budget.
    pub fixed: bool,
}

/// Tuning of how wants are estimated.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BudgetConfig {
    /// A GPU not held back by its cap wants its draw plus this fraction of it…
    pub headroom_frac: f64,
    /// …and at least this many watts above its draw.
    pub headroom_min_w: f64,
    /// A GPU held back by its cap wants this fraction of its range above its cap.
    pub grow_frac: f64,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        BudgetConfig {
            headroom_frac: 0.10,
            headroom_min_w: 20.0,
            grow_frac: 0.10,
        }
    }
}

/// The caps to set, and how the budget stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Allocation {
    /// `(gpu index, cap watts)` for every GPU given, in the order given.
    pub caps: Vec<(u32, f64)>,
    /// Sum of the caps.
    pub total_w: f64,
    /// Sum of what the GPUs want (their estimated demand), watts.
    pub demand_w: f64,
    /// Why the budget cannot be honoured, when it cannot.
    pub infeasible: Option<String>,
}

/// What `gpu` would take if the budget were no object.
pub fn want_w(gpu: &BudgetGpu, cfg: &BudgetConfig) -> f64 {
    let ceiling = gpu.ceiling_w.max(gpu.min_w);
    let want = match gpu.draw_w {
        _ if gpu.cap_limited => gpu.cap_w + cfg.grow_frac * (ceiling - gpu.min_w),
        Some(d) if d >= gpu.cap_w - cfg.headroom_min_w / 2.0 => {
            gpu.cap_w + cfg.grow_frac * (ceiling - gpu.min_w)
        }
        Some(d) => d + (cfg.headroom_frac * d).max(cfg.headroom_min_w),
        // Nothing known: leave it where it is.
        None => gpu.cap_w,
    };
    want.clamp(gpu.min_w, ceiling)
}

/// Share `budget_w` among `gpus`. See the module doc.
pub fn allocate(budget_w: f64, gpus: &[BudgetGpu], cfg: &BudgetConfig) -> Allocation {
    allocate_jobs(budget_w, gpus, &[], cfg)
}

/// One share of the budget: a GPU, or the GPUs of a job held together (`weight` of them).
struct Unit {
    /// Positions in the caller's list.
    members: Vec<usize>,
    /// The highest minimum of its GPUs (one cap for all must be at least that).
    gpu_min_w: f64,
    min_w: f64,
    ceiling_w: f64,
    want_w: f64,
}

/// Share `budget_w` among `gpus`, each of `jobs` (GPU indices; see `control::jobs`) as one unit
/// split evenly among its GPUs, so a job's GPUs get one cap. A job is shared as one unit whose
/// minimum is its GPUs' highest minimum, whose ceiling is their lowest ceiling (a GPU its
/// governor holds down holds down the job) and whose want is what its most wanting GPU wants
/// (the straggler's demand is the job's: the other ranks wait for it and draw less), each times
/// the number of GPUs. Fixed GPUs are never part of a job. When the jobs' minimums do not fit
/// where the GPUs' own minimums would, the budget comes first: each GPU is shared on its own.
pub fn allocate_jobs(
    budget_w: f64,
    gpus: &[BudgetGpu],
    jobs: &[Vec<u32>],
    cfg: &BudgetConfig,
) -> Allocation {
    // Folded from +0, as is the total below: `sum` of no `f64` is -0.0, printed `-0` in the
    // budget's events when no GPU is fixed or the node has none.
    let fixed_w: f64 = gpus
        .iter()
        .filter(|g| g.fixed)
        .map(|g| g.cap_w)
        .fold(0.0, |a, w| a + w);
    let singles = units(gpus, &[], cfg);
    let grouped = units(gpus, jobs, cfg);
    let mins = |us: &[Unit]| us.iter().map(|u| u.min_w).sum::<f64>();
    let units = if jobs.is_empty() || budget_w - fixed_w - mins(&grouped) < 0.0 {
        singles
    } else {
        grouped
    };
    let mins = mins(&units);
    let demand_w = fixed_w + units.iter().map(|u| u.want_w).sum::<f64>();
    let left = budget_w - fixed_w - mins;
    let mut infeasible = None;
    let shares: Vec<f64> = if left < 0.0 {
        infeasible = Some(format!(
            "the budget of {budget_w:.0} W is below what the GPUs need at their minimum caps \
             ({:.0} W): every cap is at its minimum; raise node_budget_w to at least {:.0} W",
            fixed_w + mins,
            (fixed_w + mins).ceil()
        ));
        units.iter().map(|u| u.min_w).collect()
    } else {
        let extra: Vec<f64> = units.iter().map(|u| u.want_w - u.min_w).collect();
        let extra_sum: f64 = extra.iter().sum();
        if extra_sum <= left {
            // Everyone gets their want; spare watts are shared up to the ceilings.
            let mut caps: Vec<f64> = units.iter().map(|u| u.want_w).collect();
            let ceilings: Vec<f64> = units.iter().map(|u| u.ceiling_w).collect();
            let weights: Vec<f64> = units.iter().map(|u| u.members.len() as f64).collect();
            water_fill(&mut caps, &ceilings, &weights, left - extra_sum);
            caps
        } else {
            let scale = left / extra_sum;
            units
                .iter()
                .zip(&extra)
                .map(|(u, e)| u.min_w + e * scale)
                .collect()
        }
    };
    let mut caps: Vec<(u32, f64)> = gpus.iter().map(|g| (g.index, g.cap_w)).collect();
    for (u, share) in units.iter().zip(shares) {
        let each = share / u.members.len() as f64;
        // Whole watts, rounded down, never below the minimum (the same for a job's GPUs).
        let rounded = each.floor();
        let cap = if rounded >= u.gpu_min_w {
            rounded
        } else {
            each
        };
        for &m in &u.members {
            caps[m].1 = cap;
        }
    }
    let total_w = caps.iter().map(|(_, c)| c).fold(0.0, |a, w| a + w);
    Allocation {
        caps,
        total_w,
        demand_w,
        infeasible,
    }
}

/// The units the free GPUs make: each job's free GPUs (two or more) as one, every other free
/// GPU on its own, in the order of `gpus`.
fn units(gpus: &[BudgetGpu], jobs: &[Vec<u32>], cfg: &BudgetConfig) -> Vec<Unit> {
    let mut job_of: Vec<Option<usize>> = vec![None; gpus.len()];
    for (j, job) in jobs.iter().enumerate() {
        let members: Vec<usize> = (0..gpus.len())
            .filter(|&i| !gpus[i].fixed && job_of[i].is_none() && job.contains(&gpus[i].index))
            .collect();
        // One cap must fit every GPU's range: GPUs of different models whose ranges do not
        // overlap are shared on their own.
        let highest_min = members
            .iter()
            .map(|&i| gpus[i].min_w)
            .fold(f64::MIN, f64::max);
        let lowest_ceiling = members
            .iter()
            .map(|&i| gpus[i].ceiling_w.max(gpus[i].min_w))
            .fold(f64::MAX, f64::min);
        if members.len() >= 2 && highest_min <= lowest_ceiling {
            for m in members {
                job_of[m] = Some(j);
            }
        }
    }
    let mut out: Vec<Unit> = Vec::new();
    let mut unit_of_job: Vec<Option<usize>> = vec![None; jobs.len()];
    for (i, g) in gpus.iter().enumerate().filter(|(_, g)| !g.fixed) {
        let ceiling = g.ceiling_w.max(g.min_w);
        let want = want_w(g, cfg);
        let Some(j) = job_of[i] else {
            out.push(Unit {
                members: vec![i],
                gpu_min_w: g.min_w,
                min_w: g.min_w,
                ceiling_w: ceiling,
                want_w: want,
            });
            continue;
        };
        match unit_of_job[j] {
            None => {
                unit_of_job[j] = Some(out.len());
                out.push(Unit {
                    members: vec![i],
                    gpu_min_w: g.min_w,
                    min_w: g.min_w,
                    ceiling_w: ceiling,
                    want_w: want,
                });
            }
            Some(u) => {
                let u = &mut out[u];
                u.members.push(i);
                u.min_w = u.min_w.max(g.min_w);
                u.gpu_min_w = u.min_w;
                u.ceiling_w = u.ceiling_w.min(ceiling);
                u.want_w = u.want_w.max(want);
            }
        }
    }
    // Per GPU so far: a job's unit is its GPUs' figures times their number.
    for u in &mut out {
        let k = u.members.len() as f64;
        u.ceiling_w = u.ceiling_w.max(u.min_w) * k;
        u.want_w = u.want_w.clamp(u.min_w, u.ceiling_w / k) * k;
        u.min_w *= k;
    }
    out
}

/// Add `spare` watts to `caps` in proportion to `weights` (a job's number of GPUs, so each GPU
/// gets as much as a GPU on its own), none above its ceiling.
fn water_fill(caps: &mut [f64], ceilings: &[f64], weights: &[f64], mut spare: f64) {
    for _ in 0..caps.len() {
        let open: Vec<usize> = (0..caps.len())
            .filter(|&i| caps[i] < ceilings[i] - 1e-9)
            .collect();
        if open.is_empty() || spare <= 1e-9 {
            return;
        }
        let per_weight = spare / open.iter().map(|&i| weights[i]).sum::<f64>();
        for i in open {
            let add = (per_weight * weights[i]).min(ceilings[i] - caps[i]);
            caps[i] += add;
            spare -= add;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn gpu(index: u32, cap: f64, draw: Option<f64>, limited: bool) -> BudgetGpu {
        BudgetGpu {
            index,
            cap_w: cap,
            min_w: 200.0,
            ceiling_w: 700.0,
            draw_w: draw,
            cap_limited: limited,
            fixed: false,
        }
    }

    #[test]
    fn no_gpu_at_all_totals_0_watts_never_minus_0() {
        let a = allocate(1000.0, &[], &BudgetConfig::default());
        assert!(a.caps.is_empty());
        assert_eq!(a.total_w.to_string(), "0");
        assert_eq!(a.demand_w.to_string(), "0");
    }

    #[test]
    fn caps_follow_demand() {
        // One busy GPU held back by its cap, one idle: the busy one gets the watts.
        let a = allocate(
            1000.0,
            &[
                gpu(0, 500.0, Some(498.0), true),
                gpu(1, 500.0, Some(80.0), false),
            ],
            &BudgetConfig::default(),
        );
        assert!(a.infeasible.is_none());
        assert!(a.total_w <= 1000.0);
        let (c0, c1) = (a.caps[0].1, a.caps[1].1);
        assert!(c0 > 500.0 && (200.0..500.0).contains(&c1), "{a:?}");
        // Plenty of budget: everyone may go to the ceiling.
        let a = allocate(
            2000.0,
            &[gpu(0, 500.0, Some(498.0), true), gpu(1, 500.0, None, false)],
            &BudgetConfig::default(),
        );
        assert_eq!(a.caps, vec![(0, 700.0), (1, 700.0)]);
    }

    #[test]
    fn mins_above_the_budget_are_said() {
        let a = allocate(
            300.0,
            &[
                gpu(0, 500.0, Some(400.0), true),
                gpu(1, 500.0, Some(400.0), true),
            ],
            &BudgetConfig::default(),
        );
        let why = a.infeasible.expect("infeasible");
        assert!(why.contains("400 W"), "{why}");
        assert_eq!(a.caps, vec![(0, 200.0), (1, 200.0)]);
    }

    #[test]
    fn a_fixed_gpu_counts_against_the_budget() {
        let mut lost = gpu(1, 600.0, None, false);
        lost.fixed = true;
        let a = allocate(
            1000.0,
            &[gpu(0, 500.0, Some(500.0), true), lost],
            &BudgetConfig::default(),
        );
        assert_eq!(a.caps[1], (1, 600.0));
        assert!(a.caps[0].1 <= 400.0 && a.caps[0].1 >= 200.0, "{a:?}");
    }

    #[test]
    fn a_job_gets_one_cap_for_its_gpus() {
        // GPUs 0 and 1 are one job: GPU 0 is its straggler (held back by its cap), GPU 1 waits
        // for it at the sync and draws less. GPU 2 is another run's, idle.
        let gpus = [
            gpu(0, 400.0, Some(398.0), true),
            gpu(1, 400.0, Some(250.0), false),
            gpu(2, 400.0, Some(100.0), false),
        ];
        let cfg = BudgetConfig::default();
        let apart = allocate(1200.0, &gpus, &cfg);
        assert!(apart.caps[0].1 > apart.caps[1].1, "{apart:?}");
        let a = allocate_jobs(1200.0, &gpus, &[vec![0, 1]], &cfg);
        assert!(a.infeasible.is_none());
        assert!(a.total_w <= 1200.0, "{a:?}");
        let (c0, c1, c2) = (a.caps[0].1, a.caps[1].1, a.caps[2].1);
        assert_eq!(c0, c1, "one cap for the job: {a:?}");
        // The job wants what its straggler wants, on both GPUs: 400 + 10% of the range.
        assert!(c0 >= 450.0, "{a:?}");
        assert!(c2 < c0, "{a:?}");
        // A governor holding GPU 1 at 300 W holds the job there, and the watts go elsewhere.
        let mut held = gpus;
        held[1].ceiling_w = 300.0;
        let a = allocate_jobs(1200.0, &held, &[vec![0, 1]], &cfg);
        assert_eq!((a.caps[0].1, a.caps[1].1), (300.0, 300.0), "{a:?}");
        assert_eq!(a.caps[2].1, 600.0, "{a:?}");
        // The job's minimums alone do not fit where the GPUs' do: each GPU on its own.
        let mut mixed = gpus;
        mixed[0].min_w = 350.0;
        mixed[1].ceiling_w = 300.0;
        let a = allocate_jobs(1200.0, &mixed, &[vec![0, 1]], &cfg);
        assert!(a.caps[1].1 <= 300.0 && a.caps[0].1 >= 350.0, "{a:?}");
    }

    fn arb_gpu() -> impl Strategy<Value = BudgetGpu> {
        (
            50.0f64..300.0,
            0.0f64..500.0,
            0.0f64..1.0,
            proptest::option::of(0.0f64..900.0),
            any::<bool>(),
            proptest::bool::weighted(0.1),
        )
            .prop_map(|(min, span, at, draw, limited, fixed)| {
                let ceiling = min + span;
                BudgetGpu {
                    index: 0,
                    cap_w: min + span * at,
                    min_w: min,
                    ceiling_w: ceiling,
                    draw_w: draw,
                    cap_limited: limited,
                    fixed,
                }
            })
    }

    proptest! {
        /// With jobs held together, the budget is honoured whenever the GPUs' own minimums fit,
        /// every cap stays within its GPU's bounds, and a job's free GPUs share one cap when
        /// their ranges allow one.
        #[test]
        fn jobs_share_one_cap_within_the_budget(
            gpus in proptest::collection::vec(arb_gpu(), 2..9),
            budget in 100.0f64..6000.0,
            split in 1usize..8,
        ) {
            let gpus: Vec<BudgetGpu> = gpus
                .into_iter()
                .enumerate()
                .map(|(i, g)| BudgetGpu { index: i as u32, ..g })
                .collect();
            let split = split.min(gpus.len() - 1);
            let job: Vec<u32> = (0..split as u32 + 1).collect();
            let a = allocate_jobs(budget, &gpus, std::slice::from_ref(&job), &BudgetConfig::default());
            let floor: f64 = gpus
                .iter()
                .map(|g| if g.fixed { g.cap_w } else { g.min_w })
                .sum();
            if floor <= budget {
                prop_assert!(a.infeasible.is_none());
                prop_assert!(a.total_w <= budget + 1e-6, "{} > {budget}", a.total_w);
            }
            for (g, (i, c)) in gpus.iter().zip(&a.caps) {
                prop_assert_eq!(g.index, *i);
                if g.fixed {
                    prop_assert_eq!(*c, g.cap_w);
                } else {
                    prop_assert!(*c >= g.min_w - 1e-9 && *c <= g.ceiling_w.max(g.min_w) + 1e-9,
                        "{c} outside {}..{}", g.min_w, g.ceiling_w);
                }
            }
            let free: Vec<&BudgetGpu> = gpus
                .iter()
                .filter(|g| !g.fixed && job.contains(&g.index))
                .collect();
            let fits = free.iter().map(|g| g.min_w).fold(f64::MIN, f64::max)
                <= free.iter().map(|g| g.ceiling_w.max(g.min_w)).fold(f64::MAX, f64::min);
            let held_mins: f64 = free.iter().map(|g| g.min_w).fold(0.0, f64::max)
                * free.len() as f64
                + gpus
                    .iter()
                    .filter(|g| !free.iter().any(|f| f.index == g.index))
                    .map(|g| if g.fixed { g.cap_w } else { g.min_w })
                    .sum::<f64>();
            if free.len() >= 2 && fits && held_mins <= budget {
                let caps: Vec<f64> = free.iter().map(|g| a.caps[g.index as usize].1).collect();
                prop_assert!(caps.iter().all(|c| *c == caps[0]), "{caps:?}");
            }
        }

        /// Under random demand, step after step (each allocation's caps become the next
        /// step's caps), the sum of caps never exceeds the budget when the budget can be met,
        /// and every cap stays within its GPU's bounds.
        #[test]
        fn the_sum_of_caps_never_exceeds_the_budget(
            start in proptest::collection::vec(arb_gpu(), 1..9),
            budget in 100.0f64..6000.0,
            steps in proptest::collection::vec(
                proptest::collection::vec((proptest::option::of(0.0f64..900.0), any::<bool>()), 8),
                1..12,
            ),
        ) {
            let cfg = BudgetConfig::default();
            let mut gpus: Vec<BudgetGpu> = start
                .into_iter()
                .enumerate()
                .map(|(i, g)| BudgetGpu { index: i as u32, ..g })
                .collect();
            for demand in steps {
                for (g, (draw, limited)) in gpus.iter_mut().zip(demand) {
                    g.draw_w = draw;
                    g.cap_limited = limited;
                }
                let a = allocate(budget, &gpus, &cfg);
                let floor: f64 = gpus
                    .iter()
                    .map(|g| if g.fixed { g.cap_w } else { g.min_w })
                    .sum();
                if floor <= budget {
                    prop_assert!(a.infeasible.is_none());
                    prop_assert!(a.total_w <= budget + 1e-6, "{} > {budget}", a.total_w);
                } else {
                    prop_assert!(a.infeasible.is_some());
                }
                let sum: f64 = a.caps.iter().map(|(_, c)| c).sum();
                prop_assert!((sum - a.total_w).abs() < 1e-6);
                for (g, (i, c)) in gpus.iter_mut().zip(&a.caps) {
                    prop_assert_eq!(g.index, *i);
                    if g.fixed {
                        prop_assert_eq!(*c, g.cap_w);
                    } else {
                        prop_assert!(*c >= g.min_w - 1e-9 && *c <= g.ceiling_w.max(g.min_w) + 1e-9,
                            "{c} outside {}..{}", g.min_w, g.ceiling_w);
                    }
                    g.cap_w = *c;
                }
            }
        }
    }
}
