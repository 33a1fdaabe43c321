use super::*;

/// A run whose cost per sample at each cap is a known function: one observation per step.
struct FakeRun {
    obs: Observation,
    cap: f64,
    batch: f64,
    /// (joules, seconds) per sample at a cap.
    curve: fn(f64) -> (f64, f64),
}

impl FakeRun {
    fn new(curve: fn(f64) -> (f64, f64)) -> FakeRun {
        FakeRun {
            obs: Observation {
                time_s: 100.0,
                steps: Some(5000.0),
                energy_j: 1e6,
                samples: 8e4,
                batch: None,
                oom: false,
            },
            cap: 0.0,
            batch: 16.0,
            curve,
        }
    }

    fn step(&mut self) -> Observation {
        let (j, s) = (self.curve)(self.cap);
        self.obs.time_s += s * self.batch;
        self.obs.energy_j += j * self.batch;
        self.obs.samples += self.batch;
        self.obs.steps = self.obs.steps.map(|n| n + 1.0);
        self.obs
    }

    /// Drive the tuner to its end; returns the caps it set and the final action.
    fn drive(&mut self, t: &mut Tuner) -> (Vec<f64>, SearchStep) {
        let mut set = Vec::new();
        let SearchStep::SetCap(first) = t.start(&self.obs) else {
            panic!("start sets a cap")
        };
        set.push(first);
        self.cap = first;
        for _ in 0..100_000 {
            let obs = self.step();
            match t.observe(&obs) {
                Some(SearchStep::SetCap(w)) => {
                    set.push(w);
                    self.cap = w;
                }
                Some(done) => return (set, done),
                None => {}
            }
        }
        panic!("the search never ended")
    }
}

/// Energy per sample with a minimum at 450 W; time per sample falling with the cap.
fn bowl(cap: f64) -> (f64, f64) {
    let x = (cap - 450.0) / 100.0;
    (2.0 + 0.5 * x * x, 0.01 * 700.0 / cap)
}

fn h100() -> TunerConfig {
    let mut c = TunerConfig::new(200.0, 700.0, 700.0, 700.0, 1).with_strategy(Strategy::Descend);
    c.eta = 1.0;
    c
}

#[test]
fn the_plan_runs_from_max_down_and_includes_the_default() {
    let c = h100();
    let plan = c.plan();
    assert_eq!(plan.len(), 21);
    assert_eq!((plan[0], plan[1], plan[20]), (700.0, 675.0, 200.0));
    let mut rtx = TunerConfig::new(150.0, 450.0, 600.0, 450.0, 1);
    rtx.step_w = 40.0;
    let plan = rtx.plan();
    assert!(plan.contains(&450.0), "{plan:?}");
    assert!(plan.windows(2).all(|w| w[0] > w[1]), "{plan:?}");
    assert_eq!(*plan.last().unwrap(), 160.0);
}

#[test]
fn finds_the_minimum_and_stops_after_two_clear_rises() {
    let mut t = Tuner::new(h100()).unwrap();
    let (set, end) = FakeRun::new(bowl).drive(&mut t);
    let SearchStep::Finish { apply_w, result } = end else {
        panic!("{end:?}")
    };
    assert_eq!(apply_w, 450.0);
    // 700 … 450, then 425 (+1.6%: no rise at a 2% margin), 400 (+6%) and 375 rise: stop.
    assert_eq!(*set.last().unwrap(), 375.0, "{set:?}");
    assert!(result.stopped_early);
    assert_eq!(result.curve.len(), set.len());
    assert_eq!(result.planned, 21);
    // Against 700 W: 2 + 0.5·6.25 = 5.125 J → 2 J.
    let e = result.energy_saving_pct.unwrap();
    assert!((e - 100.0 * (5.125 - 2.0) / 5.125).abs() < 1e-6, "{e}");
    let time = result.time_change_pct.unwrap();
    assert!(
        (time - 100.0 * (700.0 / 450.0 - 1.0)).abs() < 1e-6,
        "{time}"
    );
    assert!(
        result.summary().contains("best cap 450 W"),
        "{}",
        result.summary()
    );
    assert_eq!(t.phase(), Phase::Done);
    assert_eq!(t.result().unwrap().best.cap_w, 450.0);
    // Done: nothing to undo, nothing more to do.
    assert_eq!(t.cancel(), None);
}

#[test]
fn eta_trades_energy_for_time() {
    // With time in the cost the optimum moves up from the energy-only 450 W.
    let mut c = h100();
    c.eta = 0.5;
    let mut t = Tuner::new(c).unwrap();
    let (_, end) = FakeRun::new(bowl).drive(&mut t);
    let SearchStep::Finish { apply_w, result } = end else {
        panic!()
    };
    // cost = 0.5·(2 + 0.5x²) + 0.5·700·(7/cap): brute force on the plan.
    let best = h100()
        .plan()
        .into_iter()
        .min_by(|a, b| {
            let f = |c: f64| {
                let (j, s) = bowl(c);
                zeus_cost(0.5, 700.0, j, s)
            };
            f(*a).total_cmp(&f(*b))
        })
        .unwrap();
    assert!(best > 450.0, "{best}");
    assert_eq!(apply_w, best);
    let p = result.best;
    assert!(
        (p.cost - zeus_cost(0.5, 700.0, p.energy_per_sample_j, p.time_per_sample_s)).abs() < 1e-9
    );
}

#[test]
fn the_sweep_tries_every_cap() {
    let mut c = h100();
    c = c.with_strategy(Strategy::Sweep);
    let mut t = Tuner::new(c).unwrap();
    let (set, end) = FakeRun::new(bowl).drive(&mut t);
    assert_eq!(set, h100().plan());
    let SearchStep::Finish { apply_w, result } = end else {
        panic!()
    };
    assert_eq!(apply_w, 450.0);
    assert!(!result.stopped_early);
}

/// Flat down to the default (the cap does not bind above it), then rising.
fn flat_then_rising(cap: f64) -> (f64, f64) {
    let j = if cap >= 450.0 {
        3.0
    } else {
        3.0 + (450.0 - cap) / 10.0
    };
    // The highest caps measure a touch worse: noise that would look like two rises.
    let j = if cap > 560.0 { j * 0.9 } else { j };
    (j, 0.01)
}

#[test]
fn never_stops_before_the_default_cap_is_measured() {
    let mut c = TunerConfig::new(150.0, 450.0, 600.0, 450.0, 1).with_strategy(Strategy::Descend);
    c.eta = 1.0;
    let mut t = Tuner::new(c).unwrap();
    let (set, end) = FakeRun::new(flat_then_rising).drive(&mut t);
    assert!(set.contains(&450.0), "{set:?}");
    let SearchStep::Finish { result, .. } = end else {
        panic!()
    };
    assert!(result.default.is_some());
    assert_eq!(result.default.unwrap().cap_w, 450.0);
}

#[test]
fn warm_up_is_not_scored() {
    // Energy spent during the warm-up (and a jump in the counter there) never reaches a point.
    let mut c = h100();
    c.window = Window {
        unit: Unit::Steps,
        warmup: 3.0,
        measure: 4.0,
    };
    let mut t = Tuner::new(c).unwrap();
    let mut obs = Observation {
        time_s: 0.0,
        steps: Some(0.0),
        energy_j: 0.0,
        samples: 0.0,
        batch: None,
        oom: false,
    };
    assert_eq!(t.start(&obs), SearchStep::SetCap(700.0));
    for k in 1..=3 {
        obs.steps = Some(k as f64);
        obs.time_s = k as f64;
        obs.energy_j += 1000.0; // warm-up: 1000 J a step
        obs.samples += 10.0;
        assert_eq!(t.observe(&obs), None);
        if k < 3 {
            assert_eq!(t.phase(), Phase::WarmUp);
        }
    }
    assert_eq!(t.phase(), Phase::Measure);
    for k in 4..=6 {
        obs.steps = Some(k as f64);
        obs.time_s = k as f64;
        obs.energy_j += 100.0;
        obs.samples += 10.0;
        assert_eq!(t.observe(&obs), None);
    }
    assert!((t.progress().fraction - 0.75).abs() < 1e-9);
    assert_eq!(t.progress().cap_w, Some(700.0));
    obs.steps = Some(7.0);
    obs.time_s = 7.0;
    obs.energy_j += 100.0;
    obs.samples += 10.0;
    assert_eq!(t.observe(&obs), Some(SearchStep::SetCap(675.0)));
    let p = t.progress().curve[0];
    assert_eq!((p.energy_j, p.samples, p.seconds), (400.0, 40.0, 4.0));
    assert_eq!(p.energy_per_sample_j, 10.0);
    assert_eq!(p.avg_power_w, 100.0);
}

#[test]
fn a_counter_going_backwards_restarts_the_window() {
    let mut c = h100();
    c.window = Window {
        unit: Unit::Seconds,
        warmup: 0.0,
        measure: 10.0,
    };
    let mut t = Tuner::new(c).unwrap();
    let mut obs = Observation {
        time_s: 0.0,
        steps: None,
        energy_j: 5000.0,
        samples: 0.0,
        batch: None,
        oom: false,
    };
    t.start(&obs);
    obs.time_s = 0.5;
    t.observe(&obs);
    assert_eq!(t.phase(), Phase::Measure);
    obs.time_s = 6.0;
    obs.energy_j = 10.0; // the GPU's counter was reset
    obs.samples = 60.0;
    assert_eq!(t.observe(&obs), None);
    // 10 s after the reset, not after the start of the window.
    obs.time_s = 12.0;
    obs.energy_j = 610.0;
    obs.samples = 120.0;
    assert_eq!(t.observe(&obs), None);
    obs.time_s = 16.0;
    obs.energy_j = 1010.0;
    obs.samples = 160.0;
    assert_eq!(t.observe(&obs), Some(SearchStep::SetCap(675.0)));
    let p = t.progress().curve[0];
    assert_eq!((p.energy_j, p.samples, p.seconds), (1000.0, 100.0, 10.0));
}

#[test]
fn steps_without_samples_are_measured_again() {
    let mut c = h100();
    c.window = Window {
        unit: Unit::Steps,
        warmup: 0.0,
        measure: 2.0,
    };
    let mut t = Tuner::new(c).unwrap();
    let mut obs = Observation {
        time_s: 0.0,
        steps: Some(0.0),
        energy_j: 0.0,
        samples: 0.0,
        batch: None,
        oom: false,
    };
    t.start(&obs);
    t.observe(&obs);
    obs.steps = Some(2.0);
    obs.time_s = 1.0;
    obs.energy_j = 100.0;
    assert_eq!(t.observe(&obs), None, "no samples: nothing to score");
    assert!(t.progress().curve.is_empty());
    // A steps-window observation without steps does not move the window.
    assert_eq!(
        t.observe(&Observation {
            steps: None,
            time_s: 9.0,
            ..obs
        }),
        None
    );
}

#[test]
fn cancelling_mid_way_restores_the_starting_cap() {
    let mut c = h100();
    c.start_w = 550.0;
    let mut t = Tuner::new(c).unwrap();
    let mut run = FakeRun::new(bowl);
    t.start(&run.obs);
    for _ in 0..120 {
        let o = run.step();
        t.observe(&o);
    }
    assert!(matches!(t.phase(), Phase::WarmUp | Phase::Measure));
    assert!(!t.progress().curve.is_empty());
    assert_eq!(t.cancel(), Some(SearchStep::Restore(550.0)));
    assert_eq!(t.phase(), Phase::Cancelled);
    assert_eq!(t.observe(&run.step()), None);
    assert_eq!(t.cancel(), None);
    // Cancelled before starting: nothing was changed, nothing to restore.
    let mut fresh = Tuner::new(h100()).unwrap();
    assert_eq!(fresh.cancel(), None);
}

#[test]
fn bad_configs_are_refused_with_a_reason() {
    let mut c = h100();
    c.eta = 1.5;
    assert!(Tuner::new(c).unwrap_err().to_string().contains("eta"));
    let mut c = h100();
    c.step_w = 0.0;
    assert!(Tuner::new(c).is_err());
    let mut c = h100();
    c.default_w = 800.0;
    assert!(Tuner::new(c).is_err());
    let mut c = h100();
    c.window.measure = 0.0;
    assert!(Tuner::new(c).is_err());
    let mut c = h100();
    c.patience = 0;
    assert!(Tuner::new(c).is_err());
}

#[test]
fn results_round_trip_as_json() {
    let mut t = Tuner::new(h100()).unwrap();
    let (_, end) = FakeRun::new(bowl).drive(&mut t);
    let SearchStep::Finish { result, .. } = end else {
        panic!()
    };
    let text = serde_json::to_string(&result).unwrap();
    let back: TuneResult = serde_json::from_str(&text).unwrap();
    assert_eq!(back.best.cap_w, result.best.cap_w);
    assert_eq!(back.curve.len(), result.curve.len());
}

/// One GPU's (joules, seconds) per sample at a cap.
type Curve = fn(f64) -> (f64, f64);

/// A data-parallel job: one rank per GPU, each with its own (joules, seconds) per sample at a
/// cap; all GPUs at the one cap the tuner sets. A step takes as long as its slowest rank, and
/// the tuner sees the energy of every GPU and the samples of every rank.
fn drive_job(t: &mut Tuner, gpus: &[Curve]) -> (Vec<f64>, SearchStep) {
    let batch = 16.0;
    let mut obs = Observation {
        time_s: 0.0,
        steps: Some(0.0),
        energy_j: 0.0,
        samples: 0.0,
        batch: None,
        oom: false,
    };
    let SearchStep::SetCap(mut cap) = t.start(&obs) else {
        panic!("start sets a cap")
    };
    let mut set = vec![cap];
    for _ in 0..100_000 {
        let per_gpu: Vec<(f64, f64)> = gpus.iter().map(|f| f(cap)).collect();
        let step_s = per_gpu.iter().map(|(_, s)| s * batch).fold(0.0, f64::max);
        obs.time_s += step_s;
        obs.energy_j += per_gpu.iter().map(|(j, _)| j * batch).sum::<f64>();
        obs.samples += batch * gpus.len() as f64;
        obs.steps = obs.steps.map(|n| n + 1.0);
        match t.observe(&obs) {
            Some(SearchStep::SetCap(w)) => {
                set.push(w);
                cap = w;
            }
            Some(done) => return (set, done),
            None => {}
        }
    }
    panic!("the search never ended")
}

/// GPUs `n` of the h100 config, as `prepare` makes it for a job: max power summed.
fn job_config(n: usize, eta: f64) -> TunerConfig {
    let mut c = TunerConfig::new(200.0, 700.0, 700.0, 700.0, n);
    c.eta = eta;
    c = c.with_strategy(Strategy::Sweep);
    c
}

#[test]
fn a_job_of_identical_ranks_scores_as_one_of_them() {
    // Four times the energy over four times the samples, against four times the max power:
    // every cap costs what it costs one GPU alone, whatever eta.
    for eta in [0.0, 0.5, 1.0] {
        let mut one = Tuner::new(job_config(1, eta)).unwrap();
        let mut four = Tuner::new(job_config(4, eta)).unwrap();
        assert_eq!(four.config().max_power_w, 4.0 * 700.0);
        let (set1, end1) = drive_job(&mut one, &[bowl]);
        let (set4, end4) = drive_job(&mut four, &[bowl, bowl, bowl, bowl]);
        assert_eq!(set1, set4);
        let (SearchStep::Finish { result: r1, .. }, SearchStep::Finish { result: r4, .. }) =
            (end1, end4)
        else {
            panic!("both finish")
        };
        assert_eq!(r1.best.cap_w, r4.best.cap_w, "eta {eta}");
        for (a, b) in r1.curve.iter().zip(&r4.curve) {
            assert!(
                (a.cost - b.cost).abs() < 1e-9 * a.cost,
                "eta {eta}: {a:?} {b:?}"
            );
            assert!((4.0 * a.energy_j - b.energy_j).abs() < 1e-6 * b.energy_j);
            assert!((4.0 * a.samples - b.samples).abs() < 1e-9);
        }
    }
}

/// Energy per sample with a minimum at 550 W (a less efficient GPU at low clocks).
fn bowl_550(cap: f64) -> (f64, f64) {
    let x = (cap - 550.0) / 100.0;
    (2.0 + 0.5 * x * x, 0.01 * 700.0 / cap)
}

#[test]
fn a_job_is_scored_on_the_energy_of_all_its_gpus() {
    // Alone, one GPU's best is 450 W, the other's 550 W; held at one cap, the job's energy
    // per sample is their mean, lowest at 500 W.
    let mut t = Tuner::new(job_config(1, 1.0)).unwrap();
    let (_, SearchStep::Finish { apply_w, .. }) = drive_job(&mut t, &[bowl]) else {
        panic!()
    };
    assert_eq!(apply_w, 450.0);
    let mut t = Tuner::new(job_config(2, 1.0)).unwrap();
    let (set, end) = drive_job(&mut t, &[bowl, bowl_550]);
    let SearchStep::Finish { apply_w, result } = end else {
        panic!("{end:?}")
    };
    assert_eq!(apply_w, 500.0, "{set:?}");
    let best = result.best;
    // (2 + 0.5·0.25) + (2 + 0.5·0.25) J over two samples.
    assert!((best.energy_per_sample_j - 2.125).abs() < 1e-9, "{best:?}");
    // The job's samples: 16 per rank per step.
    assert_eq!(best.samples % 32.0, 0.0, "{best:?}");
}

#[test]
fn the_golden_search_finds_the_minimum_from_the_default_in_few_caps() {
    let mut c = TunerConfig::new(200.0, 700.0, 700.0, 700.0, 1);
    c.eta = 1.0;
    assert_eq!(c.strategy, Strategy::Golden, "the default search");
    let mut t = Tuner::new(c).unwrap();
    let (set, end) = FakeRun::new(bowl).drive(&mut t);
    let SearchStep::Finish { apply_w, result } = end else {
        panic!("{end:?}")
    };
    assert_eq!(apply_w, 450.0, "{set:?}");
    // The default first, then a bracket, never a cap twice.
    assert_eq!(set[0], 700.0);
    let mut seen = set.clone();
    seen.sort_by(f64::total_cmp);
    seen.dedup();
    assert_eq!(seen.len(), set.len(), "{set:?}");
    assert!(set.len() <= 9, "{set:?}");
    // Both neighbours of the best were measured and cost more.
    for n in [425.0, 475.0] {
        assert!(result.curve.iter().any(|p| p.cap_w == n), "{set:?}");
    }
    assert_eq!(result.strategy, Strategy::Golden);
    assert!(result.stopped_early);
    assert!(result.default.is_some());
}

#[test]
fn a_quiet_window_ends_early_and_a_noisy_one_runs_to_its_end() {
    let mut c = TunerConfig::new(200.0, 700.0, 700.0, 700.0, 1);
    c.eta = 1.0;
    c.window = Window {
        unit: Unit::Steps,
        warmup: 0.0,
        measure: 40.0,
    };
    // Quiet: every step costs the same, so the cost is known after three chunks of 4.
    let mut t = Tuner::new(c.clone()).unwrap();
    let mut obs = Observation {
        time_s: 0.0,
        steps: Some(0.0),
        energy_j: 0.0,
        samples: 0.0,
        batch: None,
        oom: false,
    };
    t.start(&obs);
    let mut steps = 0;
    loop {
        steps += 1;
        obs.steps = Some(steps as f64);
        obs.time_s += 1.0;
        obs.energy_j += 100.0;
        obs.samples += 10.0;
        if t.observe(&obs).is_some() {
            break;
        }
    }
    assert_eq!(steps, 12);
    // Noisy: every other chunk costs twice as much; the whole 40 steps are measured.
    let mut t = Tuner::new(c).unwrap();
    t.start(&obs);
    let start = steps;
    loop {
        steps += 1;
        obs.steps = Some(steps as f64);
        obs.time_s += 1.0;
        obs.energy_j += if (steps / 4) % 2 == 0 { 100.0 } else { 200.0 };
        obs.samples += 10.0;
        if t.observe(&obs).is_some() {
            break;
        }
    }
    assert_eq!(steps - start, 40);
}

#[test]
fn a_resumed_golden_search_does_not_measure_a_cap_again() {
    let mut c = TunerConfig::new(200.0, 700.0, 700.0, 700.0, 1);
    c.eta = 1.0;
    let mut first = Tuner::new(c.clone()).unwrap();
    let (all, _) = FakeRun::new(bowl).drive(&mut first);
    // Stop after three caps and resume from what they measured.
    let mut t = Tuner::new(c.clone()).unwrap();
    let mut run = FakeRun::new(bowl);
    let mut done = Vec::new();
    let SearchStep::SetCap(w) = t.start(&run.obs) else {
        panic!()
    };
    run.cap = w;
    while t.progress().curve.len() < 3 {
        if let Some(SearchStep::SetCap(w)) = t.observe(&run.step()) {
            run.cap = w;
        }
    }
    done.extend(t.progress().curve);
    let mut resumed = Tuner::new(c).unwrap().with_points(&done);
    let (rest, end) = run.drive(&mut resumed);
    let SearchStep::Finish { apply_w, .. } = end else {
        panic!()
    };
    assert_eq!(apply_w, 450.0);
    for p in &done {
        assert!(!rest.contains(&p.cap_w), "{rest:?} after {done:?}");
    }
    assert_eq!(done.len() + rest.len(), all.len(), "{all:?} vs {rest:?}");
}

#[test]
fn a_prior_brackets_the_search_and_a_wrong_one_is_walked_off() {
    for (prior, most) in [(450.0, 7), (650.0, 12)] {
        let mut c = TunerConfig::new(200.0, 700.0, 700.0, 700.0, 1);
        c.eta = 1.0;
        c.prior_w = Some(prior);
        let mut t = Tuner::new(c).unwrap();
        let (set, end) = FakeRun::new(bowl).drive(&mut t);
        let SearchStep::Finish { apply_w, .. } = end else {
            panic!()
        };
        assert_eq!(apply_w, 450.0, "prior {prior}: {set:?}");
        assert!(set.len() <= most, "prior {prior}: {set:?}");
    }
}

#[test]
fn the_result_states_its_runner_up_and_the_noise() {
    let mut c = TunerConfig::new(200.0, 700.0, 700.0, 700.0, 1);
    c.eta = 1.0;
    let mut t = Tuner::new(c).unwrap();
    assert_eq!(t.confidence(), None);
    FakeRun::new(bowl).drive(&mut t);
    // 450 W costs 2 J; its neighbours 2 + 0.5 · 0.25² = 2.03125 J: 1.5625% more. Every step
    // of the fake run costs the same, so the windows have no noise.
    let k = t.confidence().unwrap();
    assert!([425.0, 475.0].contains(&k.runner_up_w), "{k:?}");
    assert!((k.margin_pct - 1.5625).abs() < 1e-9, "{k:?}");
    assert!(k.noise_pct < 1e-9, "{k:?}");
    assert!(k.resolved());
    let noisy = Confidence {
        noise_pct: 1.0,
        ..k
    };
    assert!(!noisy.resolved());
}

/// Energy per sample flat at 2 J from 400 to 500 W, rising outside; time falling with the cap.
fn flat_bottom(cap: f64) -> (f64, f64) {
    let x = ((cap - 450.0).abs() - 50.0).max(0.0) / 100.0;
    (2.0 + 0.5 * x * x, 0.01 * 700.0 / cap)
}

/// Drive `t` on `curve` with every step's energy off by ±`noise` (a fixed pattern): the caps
/// set and the result.
fn drive_noisy(t: &mut Tuner, curve: fn(f64) -> (f64, f64), noise: f64) -> (Vec<f64>, TuneResult) {
    let mut run = FakeRun::new(curve);
    let SearchStep::SetCap(first) = t.start(&run.obs) else {
        panic!("start sets a cap")
    };
    let mut set = vec![first];
    run.cap = first;
    for i in 0..100_000u64 {
        let mut obs = run.step();
        // A pattern with no period a chunk of 4 steps averages away.
        let wobble = [1.0, -0.4, 0.7, -1.0, 0.2, -0.6, 0.9][(i * 3 % 7) as usize];
        run.obs.energy_j += wobble * noise * 2.0 * run.batch;
        obs.energy_j = run.obs.energy_j;
        match t.observe(&obs) {
            Some(SearchStep::SetCap(w)) => {
                set.push(w);
                run.cap = w;
            }
            Some(SearchStep::Finish { result, .. }) => return (set, *result),
            Some(other) => panic!("{other:?}"),
            None => {}
        }
    }
    panic!("the search never ended")
}

#[test]
fn a_best_the_noise_cannot_tell_from_its_runner_up_is_measured_again() {
    let mut c = TunerConfig::new(200.0, 700.0, 700.0, 700.0, 1);
    c.eta = 1.0;
    let mut t = Tuner::new(c.clone()).unwrap();
    let (set, r) = drive_noisy(&mut t, flat_bottom, 0.05);
    let k = r.confidence.expect("two caps were measured");
    let twice = |w: f64| set.iter().filter(|c| **c == w).count() == 2;
    assert!(twice(r.best.cap_w) && twice(k.runner_up_w), "{set:?} {k:?}");
    // Each measured again holds both windows' samples; the others one window's.
    let once = r.curve.iter().find(|p| !twice(p.cap_w)).unwrap();
    assert!(r.best.samples > 1.5 * once.samples, "{r:?}");
    assert!(r.best.se_pct.is_some() && k.noise_pct > 0.0, "{k:?}");
    assert!((400.0..=500.0).contains(&r.best.cap_w), "{r:?}");
    // A quiet run tells them apart: nothing is measured twice.
    let mut quiet = Tuner::new(c).unwrap();
    let (set, r) = drive_noisy(&mut quiet, bowl, 0.0);
    let mut uniq = set.clone();
    uniq.sort_by(f64::total_cmp);
    uniq.dedup();
    assert_eq!(uniq.len(), set.len(), "{set:?}");
    assert!(r.confidence.unwrap().resolved());
}

#[test]
fn a_saving_states_its_uncertainty_and_no_saving_is_an_answer() {
    let mut c = TunerConfig::new(200.0, 700.0, 700.0, 700.0, 1);
    c.eta = 1.0;
    let (_, r) = drive_noisy(&mut Tuner::new(c.clone()).unwrap(), bowl, 0.05);
    let u = r.saving_uncertainty_pct.expect("both windows were chunked");
    assert!(u > 0.0 && u < 10.0, "{r:?}");
    assert!(
        r.summary().contains(&format!("(±{u:.1} points)")),
        "{}",
        r.summary()
    );
    // Energy per sample lowest at the top: the default cap is the answer.
    let (_, r) = drive_noisy(
        &mut Tuner::new(c).unwrap(),
        |cap| (3.0 - cap / 700.0, 0.01),
        0.0,
    );
    assert_eq!(r.best.cap_w, 700.0, "{r:?}");
    assert_eq!(r.saving_uncertainty_pct, None);
    assert!(
        r.summary()
            .contains("the default 700 W is the best cap: no saving"),
        "{}",
        r.summary()
    );
}
