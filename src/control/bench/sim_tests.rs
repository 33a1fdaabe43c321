//! The sweep and the burn on gpusim in simulated time; expectations come from gpusim's model
//! (its clock under a cap, its steady power and temperature), not from the code under test.

use std::sync::atomic::{AtomicBool, Ordering};

use gpusim::{CoolingFault, Node, NodeConfig, TrainingConfig};

use super::burn::{self, BurnConfig};
use super::sim::{SimBench, SimLoads};
use super::sweep::{self, CapSteps, KNEE_DROP, SweepConfig, SweepPoint};
use super::*;

fn node_config(gpus: usize, model: &str, training: &str, batch: u32) -> NodeConfig {
    NodeConfig {
        gpus: vec![model.to_string(); gpus],
        training: Some(TrainingConfig {
            model: training.to_string(),
            batch_size: batch,
            prefetch_depth: 2,
            workers: 8,
        }),
        ..NodeConfig::default()
    }
}

fn sweep_config(caps: &str) -> SweepConfig {
    SweepConfig {
        gpu: 0,
        caps: Some(CapSteps::parse(caps).unwrap()),
        workload: Workload::Gemm,
        warmup_s: 5.0,
        window_s: 20.0,
        poll_s: 0.5,
    }
}

/// gpusim's steady SM clock and power of GPU 0 of `cfg` under each cap.
fn model_curve(cfg: &NodeConfig, caps: &[f64]) -> Vec<(f64, f64, f64)> {
    let mut node = Node::new(cfg).unwrap();
    node.advance_to(10.0);
    caps.iter()
        .map(|&c| {
            let g = node.gpu_mut(0).unwrap();
            g.set_power_limit_w(c).unwrap();
            (c, f64::from(g.steady_clock_mhz()), g.steady_power_w())
        })
        .collect()
}

#[test]
fn the_knee_and_the_best_perf_per_watt_lie_where_the_model_says() {
    for (gpu, caps) in [("h100-sxm", "700:200:25"), ("a100-sxm-80gb", "400:100:20")] {
        // The `--source sim` daemon's default workload.
        let cfg = node_config(1, gpu, "resnet50", 256);
        let steps = CapSteps::parse(caps).unwrap();
        let curve = model_curve(&cfg, &steps.caps());
        // GEMM throughput is proportional to the clock: the plateau is the caps whose steady
        // clock is within 2 % of the highest, from the top down.
        let top = curve.iter().map(|c| c.1).fold(0.0, f64::max);
        let expected_knee = curve
            .iter()
            .take_while(|c| c.1 >= (1.0 - KNEE_DROP) * top)
            .last()
            .unwrap()
            .0;
        let expected_best = curve
            .iter()
            .max_by(|a, b| (a.1 / a.2).total_cmp(&(b.1 / b.2)))
            .unwrap()
            .0;
        // Premise: neither is an end of the range, so the test can miss.
        assert!(
            expected_knee < steps.max_w && expected_knee > steps.min_w,
            "{gpu}: {curve:?}"
        );
        assert!(expected_best < expected_knee, "{gpu}: {curve:?}");

        let mut node = SimBench::new(&cfg, 60.0).unwrap();
        let stop = AtomicBool::new(false);
        let r = sweep::run(&mut node, &mut SimLoads, &sweep_config(caps), &stop).unwrap();
        assert_eq!(r.label, Label::Simulated);
        assert_eq!(r.points.len(), curve.len());
        let knee = r.knee.clone().unwrap();
        assert_eq!(knee.cap_w, expected_knee, "{gpu}: {:?}", r.points);
        assert!(knee.falloff_at_w.is_some_and(|f| f < expected_knee));
        assert_eq!(
            r.best_perf_per_w_cap_w,
            Some(expected_best),
            "{gpu}: {:?}",
            r.points
        );
        // Measured power is the model's steady power at each cap (energy counter over the
        // window), within 2 %.
        for (p, (c, _, w)) in r.points.iter().zip(&curve) {
            assert_eq!(p.cap_w, *c);
            assert!(
                (p.power_w - w).abs() / w < 0.02,
                "{gpu} at {c}: {} vs {w}",
                p.power_w
            );
            assert!((p.energy_per_unit_j * p.perf_per_w - 1.0).abs() < 1e-9);
        }
        // The cap is back, and went back last.
        assert_eq!(node.limits(0).unwrap().current_w, r.original_cap_w);
        let (_, w, why) = node.cap_log().last().unwrap();
        assert_eq!(*w, r.original_cap_w);
        assert!(why.contains("done, cap restored"), "{why}");
    }
}

/// A node that refuses one cap, or turns the stop flag after some waits.
struct Faulty<'a> {
    inner: SimBench,
    refuse_w: Option<f64>,
    stop_after_waits: Option<(usize, &'a AtomicBool)>,
}

impl BenchNode for Faulty<'_> {
    fn label(&self) -> Label {
        self.inner.label()
    }
    fn samples(&mut self) -> anyhow::Result<Vec<crate::telemetry::GpuSample>> {
        self.inner.samples()
    }
    fn limits(&mut self, gpu: u32) -> anyhow::Result<crate::control::PowerLimits> {
        self.inner.limits(gpu)
    }
    fn set_cap(&mut self, gpus: &[u32], watts: f64, why: &str) -> anyhow::Result<()> {
        if self.refuse_w == Some(watts) {
            anyhow::bail!("refused: {watts} W");
        }
        self.inner.set_cap(gpus, watts, why)
    }
    fn wait(&mut self, seconds: f64) {
        if let Some((n, flag)) = &mut self.stop_after_waits {
            if *n == 0 {
                flag.store(true, Ordering::SeqCst);
            }
            *n = n.saturating_sub(1);
        }
        self.inner.wait(seconds)
    }
    fn now_s(&self) -> f64 {
        self.inner.now_s()
    }
}

#[test]
fn the_cap_goes_back_on_an_error_and_on_a_stop() {
    let cfg = node_config(1, "h100-sxm", "gpt-1.3b", 8);
    let mut start = SimBench::new(&cfg, 60.0).unwrap();
    start.set_cap(&[0], 650.0, "the operator's cap").unwrap();
    let mut node = Faulty {
        inner: start,
        refuse_w: Some(500.0),
        stop_after_waits: None,
    };
    let stop = AtomicBool::new(false);
    let e = sweep::run(
        &mut node,
        &mut SimLoads,
        &sweep_config("600:400:100"),
        &stop,
    )
    .unwrap_err();
    assert!(e.to_string().contains("refused"), "{e}");
    assert_eq!(node.limits(0).unwrap().current_w, 650.0);
    let (_, w, why) = node.inner.cap_log().last().unwrap();
    assert_eq!(
        (*w, why.as_str()),
        (650.0, "bench power-sweep: failed, cap restored")
    );

    let stop = AtomicBool::new(false);
    node.refuse_w = None;
    // 50 waits a cap (10 of warm-up, 40 measured): stopped in the second cap's warm-up.
    node.stop_after_waits = Some((55, &stop));
    let r = sweep::run(
        &mut node,
        &mut SimLoads,
        &sweep_config("600:400:100"),
        &stop,
    )
    .unwrap();
    assert!(r.stopped);
    assert_eq!(r.points.len(), 1);
    assert_eq!(node.limits(0).unwrap().current_w, 650.0);
    let caps: Vec<f64> = node.inner.cap_log().iter().map(|c| c.1).collect();
    assert_eq!(caps[caps.len() - 3..], [600.0, 500.0, 650.0]);
}

#[test]
fn caps_outside_the_range_are_refused_before_any_change() {
    let cfg = node_config(1, "h100-sxm", "gpt-1.3b", 8);
    let mut node = SimBench::new(&cfg, 1.0).unwrap();
    let stop = AtomicBool::new(false);
    let e = sweep::run(
        &mut node,
        &mut SimLoads,
        &sweep_config("900:400:100"),
        &stop,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("900 W is outside GPU 0's range, 200–700 W"),
        "{e}"
    );
    assert!(node.cap_log().is_empty());
}

#[test]
fn cap_steps_parse_and_list() {
    let c = CapSteps::parse("700:300:150").unwrap();
    assert_eq!(c.caps(), [700.0, 550.0, 400.0, 300.0]);
    assert_eq!(CapSteps::parse("700W:300:100").unwrap().caps().len(), 5);
    for bad in [
        "700:300",
        "300:700:50",
        "700:x:50",
        "700:300:0",
        "700:300:1",
    ] {
        assert!(CapSteps::parse(bad).is_err(), "{bad}");
    }
}

fn point(cap_w: f64, throughput_per_s: f64, power_w: f64) -> SweepPoint {
    SweepPoint {
        cap_w,
        throughput_per_s,
        power_w,
        energy_per_unit_j: power_w / throughput_per_s,
        perf_per_w: throughput_per_s / power_w,
        sm_clock_mhz: None,
        temperature_c: None,
        throttle_reasons: 0,
    }
}

#[test]
fn the_knee_is_the_lowest_cap_of_the_plateau() {
    let pts = [
        point(700.0, 99.0, 600.0),
        point(600.0, 100.0, 590.0),
        point(500.0, 98.5, 500.0),
        point(400.0, 90.0, 400.0),
        point(300.0, 99.0, 300.0),
    ];
    let k = sweep::knee(&pts).unwrap();
    // 300 W is back within 2 %, but the plateau ended at 400 W.
    assert_eq!((k.cap_w, k.falloff_at_w), (500.0, Some(400.0)));
    assert_eq!(sweep::best_perf_per_w(&pts), Some(300.0));
    let flat = [point(700.0, 100.0, 600.0), point(600.0, 99.0, 500.0)];
    let k = sweep::knee(&flat).unwrap();
    assert_eq!((k.cap_w, k.falloff_at_w), (600.0, None));
    assert!(sweep::knee(&[]).is_none());
}

#[test]
fn the_sweep_json_has_its_documented_fields() {
    let cfg = node_config(1, "h100-sxm", "gpt-1.3b", 8);
    let mut node = SimBench::new(&cfg, 30.0).unwrap();
    let stop = AtomicBool::new(false);
    let mut c = sweep_config("700:500:200");
    c.window_s = 2.0;
    let r = sweep::run(&mut node, &mut SimLoads, &c, &stop).unwrap();
    let v = serde_json::to_value(&r).unwrap();
    for key in [
        "schema",
        "label",
        "gpu",
        "gpu_name",
        "workload",
        "unit",
        "warmup_s",
        "window_s",
        "original_cap_w",
        "stopped",
        "points",
        "knee",
        "best_perf_per_w_cap_w",
    ] {
        assert!(v.get(key).is_some(), "{key}: {v}");
    }
    assert_eq!(v["schema"], "gpupilot.bench.power-sweep/1");
    assert_eq!(v["label"], "simulated");
    assert_eq!(v["unit"], "flop");
    let p = &v["points"][0];
    for key in [
        "cap_w",
        "throughput_per_s",
        "power_w",
        "energy_per_unit_j",
        "perf_per_w",
        "sm_clock_mhz",
        "temperature_c",
        "throttle_reasons",
    ] {
        assert!(p.get(key).is_some(), "{key}: {p}");
    }
    let back: sweep::SweepResult = serde_json::from_value(v).unwrap();
    assert_eq!(back, r);
}

#[test]
fn a_burn_names_the_gpu_whose_cooling_failed_and_why() {
    let cfg = node_config(4, "h100-sxm", "gpt-1.3b", 8);
    // Premise from the model: tripled thermal resistance puts GPU 2 above its slowdown.
    let mut check = Node::new(&cfg).unwrap();
    check.advance_to(1.0);
    let g = check.gpu_mut(2).unwrap();
    let slowdown = g.spec().slowdown_c;
    g.set_cooling_scale(3.0).unwrap();
    assert!(g.steady_temperature_c(25.0) > slowdown + 10.0);

    let mut node = SimBench::new(&cfg, 5.0).unwrap();
    node.node_mut()
        .add_cooling_fault(CoolingFault {
            gpu: 2,
            at_s: 0.0,
            thermal_resistance_scale: 3.0,
        })
        .unwrap();
    let stop = AtomicBool::new(false);
    let mut ticks = 0;
    let r = burn::run(
        &mut node,
        &mut SimLoads,
        &BurnConfig {
            gpus: vec![],
            duration_s: 600.0,
            workload: Workload::Gemm,
            poll_s: 1.0,
        },
        &stop,
        &mut |p| {
            ticks += 1;
            assert!(p.elapsed_s <= p.duration_s + 1e-9);
        },
    )
    .unwrap();
    assert_eq!(ticks, 600);
    assert_eq!(r.gpus.len(), 4);
    for v in &r.gpus {
        assert!((v.steady.from_s - 450.0).abs() < 1e-9);
        if v.gpu == 2 {
            let slow = v.slow.as_ref().expect("GPU 2 is named");
            assert!(slow.below_median_pct >= 15.0, "{slow:?}");
            assert!(slow.cause.starts_with("thermal slowdown"), "{}", slow.cause);
            assert!(v.thermal_slowdown_at_s.is_some());
            // Hovering around the threshold, as the model says.
            let t = v.steady.temperature_c.unwrap();
            assert!((t - slowdown).abs() < 6.0, "{t}");
        } else {
            assert!(v.slow.is_none(), "{v:?}");
            assert!(v.thermal_slowdown_at_s.is_none(), "{v:?}");
            let t = v.steady.temperature_c.unwrap();
            assert!(t < slowdown - 10.0, "{t}");
        }
    }
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["schema"], "gpupilot.bench.burn/1");
    assert_eq!(v["label"], "simulated");
    for key in [
        "gpu",
        "name",
        "thermal_slowdown_at_s",
        "power_slowdown_at_s",
        "peak_temperature_c",
        "temp_slowdown_c",
        "steady",
        "throughput_per_s",
        "slow",
    ] {
        assert!(v["gpus"][0].get(key).is_some(), "{key}");
    }
}

#[test]
fn a_burn_on_an_idle_simulated_gpu_says_so() {
    let mut cfg = node_config(2, "h100-sxm", "gpt-1.3b", 8);
    cfg.training = None;
    let mut node = SimBench::new(&cfg, 5.0).unwrap();
    let stop = AtomicBool::new(false);
    let c = BurnConfig {
        gpus: vec![1],
        duration_s: 10.0,
        workload: Workload::Gemm,
        poll_s: 1.0,
    };
    let e = burn::run(&mut node, &mut SimLoads, &c, &stop, &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("idle"), "{e}");
}

#[test]
fn a_stopped_burn_stops_its_loads_and_gives_the_verdict_of_what_ran() {
    let cfg = node_config(2, "h100-sxm", "resnet50", 256);
    let stop = AtomicBool::new(false);
    let mut node = Faulty {
        inner: SimBench::new(&cfg, 5.0).unwrap(),
        refuse_w: None,
        stop_after_waits: Some((30, &stop)),
    };
    let c = BurnConfig {
        gpus: vec![0, 1],
        duration_s: 600.0,
        workload: Workload::Memory,
        poll_s: 1.0,
    };
    let r = burn::run(&mut node, &mut SimLoads, &c, &stop, &mut |_| {}).unwrap();
    assert!(r.stopped);
    assert_eq!(r.unit, WorkUnit::Byte);
    // The stop comes during the 31st wait of a second; the burn ends there, no wait after.
    assert!((node.now_s() - 5.0 - 31.0).abs() < 1e-6, "{}", node.now_s());
    for v in &r.gpus {
        // A span of 450 s that never came: nothing steady measured, the whole-burn rate kept.
        assert_eq!(v.steady.throughput_per_s, 0.0);
        assert!(v.throughput_per_s > 1e12, "{v:?}");
        assert!(v.slow.is_none());
    }
    // No cap was touched by a burn.
    assert!(node.inner.cap_log().is_empty());
}
