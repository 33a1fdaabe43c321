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
    let fixed_w: f64 = gpus.iter().filter(|g| g.fixed).map(|g| g.cap_w).sum();
    let free: Vec<&BudgetGpu> = gpus.iter().filter(|g| !g.fixed).collect();
    let mins: f64 = free.iter().map(|g| g.min_w).sum();
    let wants: Vec<f64> = free.iter().map(|g| want_w(g, cfg)).collect();
    let demand_w = fixed_w + wants.iter().sum::<f64>();
    let left = budget_w - fixed_w - mins;
    let mut infeasible = None;
    let shares: Vec<f64> = if left < 0.0 {
        infeasible = Some(format!(
            "the budget of {budget_w:.0} W is below what the GPUs need at their minimum caps \
             ({:.0} W): every cap is at its minimum; raise node_budget_w to at least {:.0} W",
            fixed_w + mins,
            (fixed_w + mins).ceil()
        ));
        free.iter().map(|g| g.min_w).collect()
    } else {
        let extra: Vec<f64> = free.iter().zip(&wants).map(|(g, w)| w - g.min_w).collect();
        let extra_sum: f64 = extra.iter().sum();
        if extra_sum <= left {
            // Everyone gets their want; spare watts are shared up to the ceilings.
            let mut caps: Vec<f64> = wants.clone();
            let ceilings: Vec<f64> = free.iter().map(|g| g.ceiling_w.max(g.min_w)).collect();
            water_fill(&mut caps, &ceilings, left - extra_sum);
            caps
        } else {
            let scale = left / extra_sum;
            free.iter()
                .zip(&extra)
                .map(|(g, e)| g.min_w + e * scale)
                .collect()
        }
    };
    let mut by_index = shares.into_iter();
    let caps: Vec<(u32, f64)> = gpus
        .iter()
        .map(|g| {
            if g.fixed {
                return (g.index, g.cap_w);
            }
            let x = by_index.next().expect("one share per free GPU");
            // Whole watts, rounded down, never below the minimum.
            let rounded = x.floor();
            (g.index, if rounded >= g.min_w { rounded } else { x })
        })
        .collect();
    let total_w = caps.iter().map(|(_, c)| c).sum();
    Allocation {
        caps,
        total_w,
        demand_w,
        infeasible,
    }
}

/// Add `spare` watts to `caps` evenly, none above its ceiling.
fn water_fill(caps: &mut [f64], ceilings: &[f64], mut spare: f64) {
    for _ in 0..caps.len() {
        let open: Vec<usize> = (0..caps.len())
            .filter(|&i| caps[i] < ceilings[i] - 1e-9)
            .collect();
        if open.is_empty() || spare <= 1e-9 {
            return;
        }
        let each = spare / open.len() as f64;
        for i in open {
            let add = each.min(ceilings[i] - caps[i]);
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
