use super::*;
use crate::control::tuner::Window;

/// A run whose cost per sample is a known function of batch and cap; a batch at or above
/// `oom_at` runs out of memory (no progress, the flag raised) until another is asked.
struct FakeRun {
    obs: Observation,
    cap: f64,
    batch: u32,
    oom_at: u32,
    batches_asked: Vec<u32>,
    caps_set: Vec<f64>,
}

/// Energy per sample with its minimum at 450 W whatever the batch, scaled by a batch factor
/// whose minimum is at `best_batch`; time per sample falling with the cap and the batch.
fn surface(batch: u32, cap: f64, best_batch: u32) -> (f64, f64) {
    let x = (cap - 450.0) / 100.0;
    let r = (f64::from(batch) / f64::from(best_batch)).log2();
    let f = 1.0 + 0.1 * r * r;
    ((2.0 + x * x) * f, 0.001 * (1.0 + 100.0 / cap) * f)
}

impl FakeRun {
    fn new(batch: u32, oom_at: u32) -> FakeRun {
        FakeRun {
            obs: Observation {
                time_s: 0.0,
                steps: Some(0.0),
                energy_j: 0.0,
                samples: 0.0,
                batch: Some(batch),
                oom: false,
            },
            cap: 700.0,
            batch,
            oom_at,
            batches_asked: Vec::new(),
            caps_set: Vec::new(),
        }
    }

    fn act(&mut self, s: &SearchStep) {
        match s {
            SearchStep::SetCap(w) => {
                self.cap = *w;
                self.caps_set.push(*w);
            }
            SearchStep::SetBatch(b) => {
                self.batch = *b;
                self.batches_asked.push(*b);
            }
            SearchStep::Finish { apply_w, result } => {
                self.cap = *apply_w;
                if let Some(b) = &result.batch {
                    self.batch = b.best;
                }
            }
            SearchStep::Restore(w) => self.cap = *w,
            SearchStep::SetClock(f) => panic!("a joint search locked clocks at {f} MHz"),
        }
    }

    fn step(&mut self, best_batch: u32) -> Observation {
        self.obs.time_s += 0.1;
        self.obs.batch = Some(self.batch);
        if self.batch >= self.oom_at {
            self.obs.oom = true;
            return self.obs;
        }
        self.obs.oom = false;
        let (j, s) = surface(self.batch, self.cap, best_batch);
        let n = f64::from(self.batch);
        self.obs.steps = self.obs.steps.map(|k| k + 1.0);
        self.obs.samples += n;
        self.obs.energy_j += j * n;
        self.obs.time_s += s * n;
        self.obs
    }

    /// Drive `t` to its end; the final step.
    fn drive(&mut self, t: &mut JointTuner, best_batch: u32) -> SearchStep {
        let first = t.start(&self.obs);
        self.act(&first);
        for _ in 0..200_000 {
            let obs = self.step(best_batch);
            if let Some(s) = t.observe(&obs) {
                self.act(&s);
                if matches!(s, SearchStep::Finish { .. } | SearchStep::Restore(_)) {
                    return s;
                }
            }
        }
        panic!("the joint search never ended")
    }
}

fn config() -> TunerConfig {
    let mut c = TunerConfig::new(200.0, 700.0, 700.0, 700.0, 1);
    c.eta = 1.0;
    c.window = Window {
        unit: Unit::Steps,
        warmup: 2.0,
        measure: 8.0,
    };
    c
}

/// The cheapest (batch, cap) of the whole grid: what a 2-D sweep finds.
fn grid_best(plan: &[u32], caps: &[f64], best_batch: u32, oom_at: u32) -> f64 {
    let mut best = f64::INFINITY;
    for b in plan.iter().filter(|b| **b < oom_at) {
        for c in caps {
            let (j, _) = surface(*b, *c, best_batch);
            best = best.min(j);
        }
    }
    best
}

#[test]
fn the_plan_doubles_and_halves_within_the_range() {
    assert_eq!(batch_plan(64, 16, 1024), [16, 32, 64, 128, 256, 512, 1024]);
    assert_eq!(batch_plan(64, 40, 200), [64, 128]);
    assert_eq!(batch_plan(8, 1, 8), [1, 2, 4, 8]);
    assert_eq!(batch_plan(3, 1, 1 << 30), [1, 3, 6, 12, 24, 48]);
}

#[test]
fn the_walk_goes_up_while_it_helps_then_down() {
    let plan = [16, 32, 64, 128, 256];
    assert_eq!(next_batch(&plan, 64, &[], None), Some(64));
    assert_eq!(next_batch(&plan, 64, &[(64, 5.0)], None), Some(128));
    // 128 helped: on up; 256 did not: going up is over and, since up helped, so is the walk.
    assert_eq!(
        next_batch(&plan, 64, &[(64, 5.0), (128, 4.0)], None),
        Some(256)
    );
    assert_eq!(
        next_batch(&plan, 64, &[(64, 5.0), (128, 4.0), (256, 4.5)], None),
        None
    );
    // 128 did not help: down from 64 while it helps.
    assert_eq!(
        next_batch(&plan, 64, &[(64, 5.0), (128, 6.0)], None),
        Some(32)
    );
    assert_eq!(
        next_batch(&plan, 64, &[(64, 5.0), (128, 6.0), (32, 4.0)], None),
        Some(16)
    );
    assert_eq!(
        next_batch(&plan, 64, &[(64, 5.0), (128, 6.0), (32, 5.5)], None),
        None
    );
    // 128 ran out of memory: it and larger are avoided, the walk goes down.
    assert_eq!(next_batch(&plan, 64, &[(64, 5.0)], Some(128)), Some(32));
}

#[test]
fn the_joint_search_finds_the_grids_best_in_a_fraction_of_its_windows() {
    for best_batch in [32, 64, 256] {
        let plan = batch_plan(64, 16, 512);
        let mut t = JointTuner::new(config(), plan.clone(), 64).unwrap();
        let caps = Tuner::new(config()).unwrap().plan().to_vec();
        let mut run = FakeRun::new(64, u32::MAX);
        let end = run.drive(&mut t, best_batch);
        let SearchStep::Finish { apply_w, result } = end else {
            panic!("{end:?}")
        };
        let b = result.batch.clone().unwrap();
        let (j, _) = surface(b.best, apply_w, best_batch);
        let best = grid_best(&plan, &caps, best_batch, u32::MAX);
        assert!(
            (j - best) / best < 0.02,
            "best batch {best_batch}: found {} at {apply_w} W, {j} against {best}",
            b.best
        );
        assert_eq!(b.best, best_batch, "{b:?}");
        assert_eq!(
            (run.batch, run.cap),
            (b.best, apply_w),
            "the best is applied"
        );
        // Far fewer windows than the grid's.
        let windows = result.curve.len();
        assert!(
            windows * 3 <= caps.len() * plan.len(),
            "{windows} of {}",
            caps.len() * plan.len()
        );
        // The default cap measured once, at the starting batch: the savings' reference.
        let d = result.default.unwrap();
        assert_eq!((d.batch, d.cap_w), (Some(64), 700.0));
        assert!(result.cost_saving_pct.unwrap() > 0.0);
        // Every point says its batch.
        assert!(result.curve.iter().all(|p| p.batch.is_some()));
    }
}

#[test]
fn an_out_of_memory_probe_is_ended_the_last_good_batch_restored_and_larger_ones_avoided() {
    // The cost keeps falling with the batch, but 256 does not fit.
    let plan = batch_plan(128, 16, 1024);
    let mut t = JointTuner::new(config(), plan, 128).unwrap();
    let mut run = FakeRun::new(128, 256);
    let end = run.drive(&mut t, 1024);
    let SearchStep::Finish { result, .. } = end else {
        panic!("{end:?}")
    };
    let b = result.batch.clone().unwrap();
    assert_eq!(b.oom, Some(256), "{b:?}");
    assert_eq!(b.best, 128, "{b:?}");
    // 256 asked once, then straight back to 128 (the last good batch) before the walk goes
    // on downwards; nothing larger is ever asked.
    assert_eq!(
        run.batches_asked[..3],
        [256, 128, 64],
        "{:?}",
        run.batches_asked
    );
    assert_eq!(run.batches_asked.iter().filter(|x| **x >= 256).count(), 1);
    assert!(result.curve.iter().all(|p| p.batch.unwrap() < 256));
    assert_eq!(run.batch, 128);
    // Progress says it too.
    let p = t.progress();
    assert_eq!(p.batch.unwrap().oom, Some(256));
}

#[test]
fn cancelling_mid_way_asks_for_the_start_back_and_a_resumed_search_keeps_what_it_knew() {
    let plan = batch_plan(64, 16, 512);
    let mut t = JointTuner::new(config(), plan.clone(), 64).unwrap();
    let mut run = FakeRun::new(64, 512);
    let first = t.start(&run.obs);
    run.act(&first);
    // Run until the second batch is being searched.
    let mut n = 0;
    while t.progress().batch.unwrap().done.is_empty() || n < 10 {
        let obs = run.step(256);
        if let Some(s) = t.observe(&obs) {
            run.act(&s);
        }
        n += 1;
        assert!(n < 100_000);
    }
    let p = t.progress();
    assert_eq!(t.cancel(), Some(SearchStep::Restore(700.0)));
    // A search resumed from the record: the first batch is not searched again.
    let mut again = JointTuner::new(config(), plan, 64)
        .unwrap()
        .resumed(&p.curve, p.batch.as_ref());
    let mut run = FakeRun::new(64, 512);
    let end = run.drive(&mut again, 256);
    let SearchStep::Finish { result, .. } = end else {
        panic!("{end:?}")
    };
    let b = result.batch.unwrap();
    assert_eq!(
        b.searched.iter().filter(|s| s.batch == 64).count(),
        1,
        "{b:?}"
    );
    assert_eq!(b.best, 256);
    assert_eq!(b.oom, Some(512));
}
