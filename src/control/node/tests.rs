//! The loops on a simulated node in simulated time: a gpusim node behind [`PowerControl`],
//! snapshots made from it at whole simulated seconds.

use super::*;
use crate::control::energy::{EnergySource, Price};
use crate::control::governor::Mode;
use crate::control::{ControlError, PowerLimits};
use crate::telemetry::GpuSample;
use crate::telemetry::NodeInfo;
use gpusim::{Node, NodeConfig, TrainingConfig};
use std::sync::Mutex;

struct SimDev(Mutex<Node>);

impl SimDev {
    fn node(&self) -> std::sync::MutexGuard<'_, Node> {
        self.0.lock().unwrap()
    }
}

impl PowerControl for SimDev {
    fn gpu_count(&self) -> usize {
        self.node().gpus().len()
    }
    fn power_limits(&self, gpu: usize) -> Result<PowerLimits, ControlError> {
        let n = self.node();
        let g = n
            .gpu(gpu)
            .ok_or(ControlError::NoGpu(format!("no GPU {gpu}")))?;
        let s = g.spec();
        Ok(PowerLimits {
            current_w: g.power_limit_w(),
            enforced_w: Some(g.power_limit_w()),
            default_w: s.power_default_w,
            min_w: s.power_min_w,
            max_w: s.power_max_w,
        })
    }
    fn set_power_limit_w(&self, gpu: usize, watts: f64) -> Result<(), ControlError> {
        let mut n = self.node();
        let g = n
            .gpu_mut(gpu)
            .ok_or(ControlError::NoGpu(format!("no GPU {gpu}")))?;
        g.set_power_limit_w(watts)
            .map_err(|e| ControlError::OutOfRange(e.to_string()))
    }
}

fn hot(gpus: usize) -> SimDev {
    SimDev(Mutex::new(
        Node::new(&NodeConfig {
            gpus: vec!["h100-sxm".into(); gpus],
            ambient_c: 35.0,
            seed: 5,
            step_s: 0.1,
            training: Some(TrainingConfig {
                model: "gpt-1.3b".into(),
                batch_size: 8,
                prefetch_depth: 4,
                workers: 8,
            }),
        })
        .unwrap(),
    ))
}

/// A snapshot of the simulated node at its current time (`t0` + simulated seconds).
fn snapshot(dev: &SimDev, t0: f64, counter: bool, stale: bool) -> Snapshot {
    let n = dev.node();
    let t = t0 + n.time_s();
    Snapshot {
        time_s: t,
        node: NodeInfo::default(),
        gpus: n
            .gpus()
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let r = g.reading();
                let s = g.spec();
                GpuSample {
                    index: i as u32,
                    stale,
                    time_s: if stale { t0 } else { t },
                    temperature_c: Some(r.temperature_c),
                    temp_slowdown_c: Some(s.slowdown_c),
                    power_w: Some(r.power_w),
                    power_limit_w: Some(r.power_limit_w),
                    power_min_w: Some(s.power_min_w),
                    power_max_w: Some(s.power_max_w),
                    energy_j: counter.then_some(r.energy_mj as f64 / 1000.0),
                    throttle_reasons: Some(r.throttle_reasons),
                    ecc_uncorrected: Some(0),
                    ..GpuSample::default()
                }
            })
            .collect(),
        host: None,
    }
}

fn no_profile(_: &Path) -> Option<RunRules> {
    None
}

const T0: f64 = 1_800_000_000.0;

fn advance(dev: &SimDev, secs: f64) {
    let mut n = dev.node();
    let t = n.time_s() + secs;
    n.advance_to(t);
}

fn caps(dev: &SimDev) -> Vec<f64> {
    dev.node()
        .gpus()
        .iter()
        .map(|g| g.power_limit_w())
        .collect()
}

/// One simulated second on, and a step of the loops at it (fresh telemetry, no runs).
fn next_second(nc: &mut NodeControl, dev: &SimDev) -> StepOutput {
    advance(dev, 1.0);
    nc.step(
        &snapshot(dev, T0, true, false),
        &[],
        &no_profile,
        Some(dev),
        "n",
    )
}

fn temps(dev: &SimDev) -> Vec<f64> {
    dev.node()
        .gpus()
        .iter()
        .map(|g| g.reading().temperature_c)
        .collect()
}

#[test]
fn governors_and_a_budget_hold_four_hot_gpus() {
    let dev = hot(4);
    let mut nc = NodeControl::new(ControlSettings::default());
    let ev = nc.thermal_on(&[0, 1, 2, 3], Target::BelowSlowdown(15.0), "alice", "test");
    assert_eq!(ev.len(), 4);
    nc.set_budget(Some(2600.0), "alice", "PSU");
    let mut events = Vec::new();
    for s in 1..=600 {
        advance(&dev, 1.0);
        let snap = snapshot(&dev, T0, true, false);
        let out = nc.step(&snap, &[], &no_profile, Some(&dev), "n");
        events.extend(out.events);
        let sum: f64 = caps(&dev).iter().sum();
        assert!(sum <= 2600.0 + 1e-9, "at {s} s the caps sum to {sum} W");
        if s > 120 {
            for t in temps(&dev) {
                assert!((t - 74.0).abs() <= 2.0, "at {s} s: {t:.1} °C");
            }
        }
    }
    let status = nc.status();
    assert_eq!(status.governors.len(), 4);
    let b = status.budget.unwrap();
    assert!(b.total_w <= 2600.0 && b.infeasible.is_none(), "{b:?}");
    let line = status.governors[0].line();
    assert!(line.starts_with("governor 74 °C: cap "), "{line}");
    assert!(
        events
            .iter()
            .any(|e| matches!(e, ControlEvent::Governor { change, .. } if change == "cap"))
    );
    assert!(
        events
            .iter()
            .any(|e| matches!(e, ControlEvent::Budget { caps, .. } if !caps.is_empty()))
    );
    // Off: the governors go, the budget stays; then the budget goes and the users' caps
    // (700 W) come back.
    nc.thermal_off(&[0, 1, 2, 3], "alice", "done");
    nc.set_budget(None, "alice", "done");
    let out = next_second(&mut nc, &dev);
    assert_eq!(caps(&dev), vec![700.0; 4]);
    assert_eq!(
        out.events
            .iter()
            .filter(|e| matches!(e, ControlEvent::Governor { change, .. } if change == "restored"))
            .count(),
        4
    );
}

#[test]
fn stale_telemetry_moves_no_cap() {
    let dev = hot(1);
    let mut nc = NodeControl::new(ControlSettings::default());
    nc.thermal_on(&[0], Target::Celsius(70.0), "alice", "test");
    for _ in 0..30 {
        next_second(&mut nc, &dev);
    }
    let before = caps(&dev);
    let mut stale_events = 0;
    for _ in 0..60 {
        advance(&dev, 1.0);
        let out = nc.step(
            &snapshot(&dev, T0, true, true),
            &[],
            &no_profile,
            Some(&dev),
            "n",
        );
        stale_events += out
            .events
            .iter()
            .filter(|e| matches!(e, ControlEvent::Governor { change, .. } if change == "stale"))
            .count();
        assert!(
            !out.events
                .iter()
                .any(|e| matches!(e, ControlEvent::Governor { change, .. } if change == "cap"))
        );
        assert_eq!(caps(&dev), before);
    }
    assert_eq!(stale_events, 1, "said once");
    let st = nc.status();
    assert_eq!(st.governors[0].mode, Mode::Stale);
    assert!(st.governors[0].line().contains("holding: telemetry stale"));
    let out = next_second(&mut nc, &dev);
    assert!(
        out.events
            .iter()
            .any(|e| matches!(e, ControlEvent::Governor { change, .. } if change == "resumed"))
    );
}

fn run_view(dir: &Path, live: bool) -> ControlledRun {
    ControlledRun {
        id: "r1".into(),
        live,
        paused: false,
        visible: Some("0,1".into()),
        dir: dir.to_path_buf(),
        started_s: T0,
        recorded: None,
        job_gpus: Vec::new(),
        pid: None,
        uses: BTreeMap::new(),
    }
}

/// Meter a run on GPUs 0 and 1 of a 4-GPU node for `secs`, the run's profile giving `rates`
/// over the node's (0.30 EUR, 400 g/kWh, PUE 1.25); returns (run J, gpusim's J).
fn run_energy(counter: bool, secs: usize, rates: Option<EnergyRates>) -> (RunEnergy, f64) {
    let dev = hot(4);
    advance(&dev, 20.0);
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("metrics.jsonl"),
        format!(
            "{{\"n\":0,\"t\":{T0},\"samples_per_s\":100.0}}\n{{\"n\":1,\"t\":{},\"samples_per_s\":100.0}}\n",
            T0 + 100.0
        ),
    )
    .unwrap();
    let mut nc = NodeControl::new(ControlSettings {
        price: Some(Price {
            per_kwh: 0.30,
            currency: "EUR".into(),
        }),
        grid_co2_g_per_kwh: Some(400.0),
        pue: Some(1.25),
        ..ControlSettings::default()
    });
    let profile = |_: &Path| {
        rates.clone().map(|energy| RunRules {
            energy,
            ..RunRules::default()
        })
    };
    let counter_j = |d: &SimDev| -> f64 {
        d.node().gpus()[..2]
            .iter()
            .map(|g| g.reading().energy_mj as f64 / 1000.0)
            .sum()
    };
    let view = run_view(tmp.path(), true);
    nc.step(
        &snapshot(&dev, T0, counter, false),
        std::slice::from_ref(&view),
        &profile,
        None::<&SimDev>,
        "n",
    );
    let start = counter_j(&dev);
    for i in 0..secs {
        advance(&dev, 1.0);
        // The power moves: caps change every 20 s.
        if i % 20 == 0 {
            let cap = if i % 40 == 0 { 450.0 } else { 680.0 };
            dev.set_power_limit_w(0, cap).unwrap();
        }
        nc.step(
            &snapshot(&dev, T0, counter, false),
            std::slice::from_ref(&view),
            &profile,
            None::<&SimDev>,
            "n",
        );
    }
    let truth = counter_j(&dev) - start;
    let out = nc.step(
        &snapshot(&dev, T0, counter, false),
        &[run_view(tmp.path(), false)],
        &profile,
        None::<&SimDev>,
        "n",
    );
    let (id, e, write) = out.energy.into_iter().next().expect("final energy");
    assert_eq!((id.as_str(), write), ("r1", true));
    (e, truth)
}

#[test]
fn run_energy_matches_gpusims_counter_within_1_percent() {
    let (e, truth) = run_energy(true, 300, None);
    assert!(
        (e.energy_j - truth).abs() / truth < 1e-6,
        "{} vs {truth}",
        e.energy_j
    );
    assert_eq!(e.source, Some(EnergySource::Counter));
    assert_eq!(e.per_gpu.len(), 2, "GPUs 0 and 1 only: {:?}", e.per_gpu);
    // Without the counter: power integrated at 1 Hz.
    let (e, truth) = run_energy(false, 300, None);
    let err = (e.energy_j - truth).abs() / truth;
    assert!(err < 0.01, "{} vs {truth}: {:.3}%", e.energy_j, 100.0 * err);
    assert_eq!(e.source, Some(EnergySource::Power));
    // 100 samples/s for 100 s from the metrics file.
    assert_eq!(e.samples, Some(10_000));
    assert!((e.j_per_sample.unwrap() - e.energy_j / 10_000.0).abs() < 1e-9);
    assert!((e.cost.unwrap() - e.kwh * 0.30).abs() < 1e-12);
    assert_eq!(e.currency.as_deref(), Some("EUR"));
    assert!((e.co2_g.unwrap() - e.kwh * 400.0).abs() < 1e-9);
    assert!((e.facility_kwh.unwrap() - e.kwh * 1.25).abs() < 1e-12);
}

#[test]
fn a_runs_energy_rates_win_over_the_nodes_field_by_field() {
    let run = EnergyRates {
        price: Some(Price {
            per_kwh: 0.5,
            currency: "USD".into(),
        }),
        grid_co2_g_per_kwh: Some(20.0),
        pue: None,
    };
    let (e, _) = run_energy(true, 30, Some(run));
    assert!(e.kwh > 0.0);
    assert!((e.cost.unwrap() - e.kwh * 0.5).abs() < 1e-12);
    assert_eq!(e.currency.as_deref(), Some("USD"));
    assert!((e.co2_g.unwrap() - e.kwh * 20.0).abs() < 1e-9);
    // No PUE in the profile: the node's.
    assert_eq!(e.pue, Some(1.25));
    assert!((e.facility_cost.unwrap() - e.kwh * 0.5 * 1.25).abs() < 1e-12);
    assert!((e.facility_co2_g.unwrap() - e.kwh * 20.0 * 1.25).abs() < 1e-9);
}

#[test]
fn a_runs_profile_governs_its_gpus_while_it_lives() {
    let dev = hot(2);
    let tmp = tempfile::tempdir().unwrap();
    let mut nc = NodeControl::new(ControlSettings::default());
    let rules = |_: &Path| {
        Some(RunRules {
            thermal: Some(Target::Celsius(65.0)),
            node_budget_w: None,
            alerts: AlertRules {
                temp_c: Some(60.0),
                hook: Some(vec!["true".into()]),
                ..AlertRules::default()
            },
            ..RunRules::default()
        })
    };
    let mut view = run_view(tmp.path(), true);
    view.visible = Some("1".into());
    let mut raised = Vec::new();
    let mut hooks = 0;
    for _ in 0..200 {
        advance(&dev, 1.0);
        let out = nc.step(
            &snapshot(&dev, T0, true, false),
            std::slice::from_ref(&view),
            &rules,
            Some(&dev),
            "n",
        );
        hooks += out.hooks.len();
        for e in out.events {
            if let ControlEvent::Alert { change, alert } = e {
                raised.push((change, alert.key));
            }
        }
    }
    assert_eq!(nc.governed(), vec![1]);
    let c = caps(&dev);
    assert_eq!(c[0], 700.0, "GPU 0 is not the run's");
    assert!(c[1] < 650.0, "{c:?}");
    // One alert for the hot GPU 1, not one per sample; its hook once.
    assert_eq!(
        raised,
        vec![("raised".to_string(), "temperature:gpu1".to_string())]
    );
    assert_eq!(hooks, 1);
    // The run ends: its governor goes, its cap comes back, its alert clears.
    view.live = false;
    advance(&dev, 1.0);
    let out = nc.step(
        &snapshot(&dev, T0, true, false),
        std::slice::from_ref(&view),
        &rules,
        Some(&dev),
        "n",
    );
    assert!(nc.governed().is_empty());
    assert_eq!(caps(&dev), vec![700.0, 700.0]);
    assert!(
        out.events
            .iter()
            .any(|e| matches!(e, ControlEvent::Alert { change, .. } if change == "cleared"))
    );
    assert!(
        out.events
            .iter()
            .any(|e| matches!(e, ControlEvent::Governor { change, .. } if change == "off"))
    );
}

#[test]
fn a_budget_below_the_minimums_is_said_once() {
    let dev = hot(2);
    let mut nc = NodeControl::new(ControlSettings::default());
    nc.set_budget(Some(300.0), "alice", "test");
    let mut said = 0;
    for _ in 0..20 {
        let out = next_second(&mut nc, &dev);
        said += out
            .events
            .iter()
            .filter(|e| matches!(e, ControlEvent::Budget { why, .. } if why.contains("raise node_budget_w")))
            .count();
    }
    assert_eq!(said, 1);
    assert_eq!(caps(&dev), vec![200.0, 200.0]);
    assert!(nc.status().budget.unwrap().line().contains("cannot be met"));
}

#[test]
fn a_cap_someone_else_sets_becomes_the_users_cap() {
    let dev = hot(1);
    let mut nc = NodeControl::new(ControlSettings::default());
    nc.thermal_on(&[0], Target::Celsius(88.0), "alice", "test");
    for _ in 0..5 {
        next_second(&mut nc, &dev);
    }
    // `gpupilot power cap 500` meanwhile.
    dev.set_power_limit_w(0, 500.0).unwrap();
    for _ in 0..100 {
        next_second(&mut nc, &dev);
        assert!(caps(&dev)[0] <= 500.0);
    }
    assert_eq!(nc.status().governors[0].user_cap_w, Some(500.0));
}

/// A cap set from outside between two budget steps stands from the next step on: the budget's
/// share taken before it (here 700 W) does not raise the GPU back past it.
#[test]
fn a_cap_set_between_budget_steps_is_not_raised_back() {
    let dev = hot(2);
    let mut nc = NodeControl::new(ControlSettings::default());
    nc.set_budget(Some(2000.0), "alice", "test");
    // The budget steps at the first snapshot and every BUDGET_EVERY_S after it: the sixth
    // is one, so the next few are not.
    for _ in 0..6 {
        next_second(&mut nc, &dev);
    }
    assert_eq!(
        nc.status().budget.unwrap().caps,
        vec![(0, 700.0), (1, 700.0)]
    );
    // `gpupilot power cap 400 --gpu 0` now.
    dev.set_power_limit_w(0, 400.0).unwrap();
    for s in 1..=12 {
        next_second(&mut nc, &dev);
        assert_eq!(caps(&dev), vec![400.0, 700.0], "{s} s after the user's cap");
    }
    assert_eq!(nc.held(0).map(|(user, _)| user), Some(400.0));
}

mod hardening;
mod jobs;
