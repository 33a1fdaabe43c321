//! The loops against bad readings: implausible limits, a setter that keeps failing, telemetry
//! that flaps between stale and fresh.

use super::*;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// A simulated node whose driver can lie about the limit (reads 0 W) or refuse every setter.
struct Faulty {
    dev: SimDev,
    zero_limit: AtomicBool,
    /// GPU 0's limit reads 4,294,967 W (u32::MAX mW), far outside its range.
    wild_limit: AtomicBool,
    refuse: AtomicBool,
    set_calls: AtomicUsize,
}

impl Faulty {
    fn new(dev: SimDev) -> Faulty {
        Faulty {
            dev,
            zero_limit: AtomicBool::new(false),
            wild_limit: AtomicBool::new(false),
            refuse: AtomicBool::new(false),
            set_calls: AtomicUsize::new(0),
        }
    }
}

impl PowerControl for Faulty {
    fn gpu_count(&self) -> usize {
        self.dev.gpu_count()
    }
    fn power_limits(&self, gpu: usize) -> Result<PowerLimits, ControlError> {
        let mut l = self.dev.power_limits(gpu)?;
        if self.zero_limit.load(Ordering::Relaxed) {
            l.current_w = 0.0;
            l.enforced_w = None;
        }
        if gpu == 0 && self.wild_limit.load(Ordering::Relaxed) {
            l.current_w = WILD_W;
            l.enforced_w = Some(WILD_W);
        }
        Ok(l)
    }
    fn set_power_limit_w(&self, gpu: usize, watts: f64) -> Result<(), ControlError> {
        self.set_calls.fetch_add(1, Ordering::Relaxed);
        if self.refuse.load(Ordering::Relaxed) {
            return Err(ControlError::NoPermission(
                "setting the power limit on GPU 0 needs root".into(),
            ));
        }
        self.dev.set_power_limit_w(gpu, watts)
    }
}

/// u32::MAX milliwatts, as a limit read as watts.
const WILD_W: f64 = 4_294_967.295;

/// One simulated second of `sim`, then a step of the loops on `dev`: its events.
fn second<P: PowerControl>(
    nc: &mut NodeControl,
    sim: &SimDev,
    dev: &P,
    stale: bool,
) -> Vec<ControlEvent> {
    advance(sim, 1.0);
    let snap = snapshot(sim, T0, true, stale);
    nc.step(&snap, &[], &no_profile, Some(dev), "n").events
}

fn governor_events<'a>(events: &'a [ControlEvent], what: &str) -> Vec<&'a ControlEvent> {
    events
        .iter()
        .filter(|e| matches!(e, ControlEvent::Governor { change, .. } if change == what))
        .collect()
}

/// An idle H100 in a cool room: far below any target, so a governor wants to give it watts.
fn cool() -> SimDev {
    SimDev(Mutex::new(
        Node::new(&NodeConfig {
            gpus: vec!["h100-sxm".into()],
            ambient_c: 25.0,
            seed: 5,
            step_s: 0.1,
            training: None,
        })
        .unwrap(),
    ))
}

#[test]
fn a_limit_read_as_zero_is_never_acted_on_and_the_reason_is_said_once() {
    let f = Faulty::new(cool());
    f.zero_limit.store(true, Ordering::Relaxed);
    let mut nc = NodeControl::new(ControlSettings::default());
    nc.thermal_on(&[0], Target::Celsius(85.0), "alice", "test");
    let mut events = Vec::new();
    for _ in 0..60 {
        events.extend(second(&mut nc, &f.dev, &f, false));
    }
    assert_eq!(f.set_calls.load(Ordering::Relaxed), 0, "{events:?}");
    assert_eq!(caps(&f.dev), vec![700.0]);
    assert!(governor_events(&events, "cap").is_empty(), "{events:?}");
    let refused = governor_events(&events, "refused");
    assert_eq!(refused.len(), 1, "said once: {events:?}");
    let ControlEvent::Governor { why, .. } = refused[0] else {
        unreachable!()
    };
    assert!(why.contains("power limit reads 0 W"), "{why}");
    let st = nc.status();
    assert_eq!(st.governors[0].mode, Mode::Refused);
    assert!(st.governors[0].line().contains("implausible"));
    assert_eq!(
        st.governors[0].user_cap_w, None,
        "no user's cap from a 0 W reading"
    );
    // Off: nothing to put back, nothing set.
    nc.thermal_off(&[0], "alice", "done");
    second(&mut nc, &f.dev, &f, false);
    assert_eq!(f.set_calls.load(Ordering::Relaxed), 0);
    assert_eq!(caps(&f.dev), vec![700.0]);
}

/// A limit of 4,294,967 W on an H100 (range 200–700 W) used to be refused by the governor and
/// counted by the budget: "infeasible", GPU 1 pinned to its minimum, "raise node_budget_w to at
/// least 4295168 W". It is absent to every loop: GPU 0 counts at its maximum, 700 W, and GPU 1
/// gets the rest of the budget.
#[test]
fn a_limit_outside_its_range_is_absent_to_the_budget_too() {
    let f = Faulty::new(hot(2));
    f.wild_limit.store(true, Ordering::Relaxed);
    let mut nc = NodeControl::new(ControlSettings::default());
    nc.set_budget(Some(1000.0), "alice", "test");
    let mut events = Vec::new();
    for _ in 0..30 {
        advance(&f.dev, 1.0);
        let mut snap = snapshot(&f.dev, T0, true, false);
        snap.gpus[0].power_limit_w = Some(WILD_W);
        events.extend(nc.step(&snap, &[], &no_profile, Some(&f), "n").events);
    }
    let budget = nc.status().budget.expect("a budget");
    assert_eq!(budget.infeasible, None, "{events:?}");
    assert_eq!(budget.caps, vec![(0, 700.0), (1, 300.0)], "{budget:?}");
    assert_eq!(budget.total_w, 1000.0);
    assert!(
        events
            .iter()
            .all(|e| !matches!(e, ControlEvent::Budget { why, .. }
            if why.contains("raise node_budget_w"))),
        "{events:?}"
    );
    assert_eq!(caps(&f.dev), vec![700.0, 300.0]);
    let refused = governor_events(&events, "refused");
    assert_eq!(refused.len(), 1, "said once: {events:?}");
    let ControlEvent::Governor { gpu, by, why, .. } = refused[0] else {
        unreachable!()
    };
    assert_eq!((*gpu, by.as_str()), (0, BY_BUDGET));
    assert!(
        why.contains("4294967 W, outside its range 200–700 W"),
        "{why}"
    );
}

/// A counter that jumps by 1e15 mJ (1e12 J) used to be a run's energy: it is counted from
/// power for that second, and said once in the node's events.
#[test]
fn a_counter_jump_is_not_a_runs_energy_and_is_said_once() {
    let dev = hot(1);
    advance(&dev, 20.0);
    let tmp = tempfile::tempdir().unwrap();
    let view = ControlledRun {
        visible: Some("0".into()),
        ..run_view(tmp.path(), true)
    };
    let counter = |d: &SimDev| d.node().gpus()[0].reading().energy_mj as f64 / 1000.0;
    let mut nc = NodeControl::new(ControlSettings::default());
    let mut events = Vec::new();
    let mut energy = 0.0;
    let mut start = 0.0;
    for s in 0..30 {
        advance(&dev, 1.0);
        if s == 0 {
            start = counter(&dev);
        }
        let mut snap = snapshot(&dev, T0, true, false);
        if s >= 10 {
            // From second 10 on, the counter reads 1e15 mJ more than it should.
            *snap.gpus[0].energy_j.as_mut().unwrap() += 1e12;
        }
        let out = nc.step(
            &snap,
            std::slice::from_ref(&view),
            &no_profile,
            None::<&SimDev>,
            "n",
        );
        events.extend(out.events);
        energy = out.energy.last().map_or(energy, |(_, e, _)| e.energy_j);
    }
    let truth = counter(&dev) - start;
    // One second of 29 integrated from power instead of the counter.
    assert!(
        (energy - truth).abs() / truth < 0.01,
        "{energy} J vs {truth} J"
    );
    let said = governor_events(&events, "implausible");
    assert_eq!(said.len(), 1, "said once: {events:?}");
    let ControlEvent::Governor { gpu, by, why, .. } = said[0] else {
        unreachable!()
    };
    assert_eq!((*gpu, by.as_str()), (0, BY_ENERGY));
    assert!(why.contains("jumped by 1.000e12 J"), "{why}");
}

#[test]
fn a_setter_that_keeps_failing_is_retried_less_and_less_often() {
    let f = Faulty::new(hot(1));
    f.refuse.store(true, Ordering::Relaxed);
    let mut nc = NodeControl::new(ControlSettings::default());
    nc.thermal_on(&[0], Target::Celsius(60.0), "alice", "test");
    let mut events = Vec::new();
    let mut calls_at = Vec::new();
    for s in 0..600 {
        let before = f.set_calls.load(Ordering::Relaxed);
        let out = second(&mut nc, &f.dev, &f, false);
        if f.set_calls.load(Ordering::Relaxed) > before {
            calls_at.push(s);
        }
        events.extend(out);
    }
    // Exponential: 1, 2, 4, 8 … s between tries, at most 5 min: about ten tries in 10 min,
    // not 600.
    assert!(
        (5..=12).contains(&calls_at.len()),
        "setter called at {calls_at:?}"
    );
    let gaps: Vec<i32> = calls_at.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps.windows(2).all(|w| w[1] >= w[0]), "{gaps:?}");
    let failed = governor_events(&events, "failed");
    assert_eq!(failed.len(), 1, "said once: {failed:?}");
    let ControlEvent::Governor { why, .. } = failed[0] else {
        unreachable!()
    };
    assert!(
        why.contains("needs root") && why.contains("less often"),
        "{why}"
    );
    // Allowed again: the next try succeeds and the cap moves.
    f.refuse.store(false, Ordering::Relaxed);
    for _ in 0..400 {
        second(&mut nc, &f.dev, &f, false);
    }
    assert!(caps(&f.dev)[0] < 700.0, "{:?}", caps(&f.dev));
}

#[test]
fn telemetry_that_flaps_is_reported_once_per_episode_not_every_second() {
    let dev = hot(1);
    let mut nc = NodeControl::new(ControlSettings::default());
    nc.thermal_on(&[0], Target::Celsius(70.0), "alice", "test");
    let mut events = Vec::new();
    // An hour of stale 1 s, fresh 1–2 s, again and again.
    for s in 0..3600 {
        let stale = s % 3 == 0 || s % 7 == 0;
        events.extend(second(&mut nc, &dev, &dev, stale));
    }
    let said: Vec<&ControlEvent> = events
        .iter()
        .filter(|e| {
            matches!(e, ControlEvent::Governor { change, .. }
                if ["stale", "resumed", "flapping"].contains(&change.as_str()))
        })
        .collect();
    assert!(
        said.len() <= 4,
        "{} events: {:?}",
        said.len(),
        &said[..said.len().min(8)]
    );
    assert_eq!(governor_events(&events, "flapping").len(), 1, "{said:?}");
    // Steady again for a while: one `resumed` that counts the spells.
    for _ in 0..120 {
        events.extend(second(&mut nc, &dev, &dev, false));
    }
    let resumed = governor_events(&events, "resumed");
    let Some(ControlEvent::Governor { why, .. }) = resumed.last() else {
        panic!("no resumed: {events:?}")
    };
    assert!(why.contains("stale spells"), "{why}");
}

#[test]
fn a_runs_energy_survives_a_daemon_kill_with_the_downtime_counted() {
    let dev = hot(2);
    advance(&dev, 20.0);
    let tmp = tempfile::tempdir().unwrap();
    let view = ControlledRun {
        visible: Some("0,1".into()),
        ..run_view(tmp.path(), true)
    };
    let counter = |d: &SimDev| -> f64 {
        d.node()
            .gpus()
            .iter()
            .map(|g| g.reading().energy_mj as f64 / 1000.0)
            .sum()
    };
    // What the daemon's control loop does with a step's output: save the ledgers.
    let step = |nc: &mut NodeControl| -> f64 {
        let snap = snapshot(&dev, T0, true, false);
        let out = nc.step(
            &snap,
            std::slice::from_ref(&view),
            &no_profile,
            None::<&SimDev>,
            "n",
        );
        for (dir, l) in &out.ledgers {
            energy_ledger::save(dir, l).unwrap();
        }
        out.energy.last().map_or(0.0, |(_, e, _)| e.energy_j)
    };
    let mut nc = NodeControl::new(ControlSettings::default());
    step(&mut nc);
    let start = counter(&dev);
    for _ in 0..25 {
        advance(&dev, 1.0);
        step(&mut nc);
    }
    // kill -9: what the loops held in memory is gone; 40 s pass with nobody measuring.
    drop(nc);
    advance(&dev, 40.0);
    let mut nc = NodeControl::new(ControlSettings::default());
    let mut e = 0.0;
    for _ in 0..10 {
        advance(&dev, 1.0);
        e = step(&mut nc);
    }
    let truth = counter(&dev) - start;
    assert!((e - truth).abs() / truth < 1e-6, "{e} J vs {truth} J");
}

#[test]
fn energy_goes_to_the_runs_whose_processes_use_the_gpu() {
    let dev = hot(2);
    advance(&dev, 20.0);
    let tmp = tempfile::tempdir().unwrap();
    // A CPU-only run that declared no GPU; a run on GPU 0 (3 GiB) and one sharing it (1 GiB).
    let cpu = ControlledRun {
        id: "cpu".into(),
        visible: None,
        ..run_view(tmp.path(), true)
    };
    let big = ControlledRun {
        id: "big".into(),
        visible: None,
        uses: BTreeMap::from([(0, 3 << 30)]),
        ..run_view(tmp.path(), true)
    };
    let small = ControlledRun {
        id: "small".into(),
        visible: Some("0".into()),
        uses: BTreeMap::from([(0, 1 << 30)]),
        ..run_view(tmp.path(), true)
    };
    let views = [cpu, big, small];
    let mut nc = NodeControl::new(ControlSettings::default());
    let gpu0 = |d: &SimDev| d.node().gpus()[0].reading().energy_mj as f64 / 1000.0;
    let mut energy = BTreeMap::new();
    let mut start = 0.0;
    for i in 0..30 {
        if i > 0 {
            advance(&dev, 1.0);
        }
        let mut snap = snapshot(&dev, T0, true, false);
        // NVML lists the GPUs' processes (none of them the CPU-only run's).
        for g in &mut snap.gpus {
            g.processes = Some(vec![]);
        }
        let out = nc.step(&snap, &views, &no_profile, None::<&SimDev>, "n");
        if i == 0 {
            start = gpu0(&dev);
        }
        for (id, e, _) in out.energy {
            energy.insert(id, e.energy_j);
        }
    }
    let truth = gpu0(&dev) - start;
    assert!(energy["cpu"] < 1e-9, "{energy:?}");
    assert!(
        (energy["big"] - 0.75 * truth).abs() < 1e-6 * truth,
        "{energy:?} of {truth}"
    );
    assert!(
        (energy["small"] - 0.25 * truth).abs() < 1e-6 * truth,
        "{energy:?} of {truth}"
    );
}
