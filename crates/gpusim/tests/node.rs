//! The node: determinism, serialization, fixed-step time.

use gpusim::{Node, NodeConfig, SimError, TrainingConfig};

fn readings(node: &Node) -> Vec<gpusim::GpuReading> {
    node.gpus().iter().map(|g| g.reading()).collect()
}

#[test]
fn default_config_is_four_h100_training_resnet() {
    let cfg = NodeConfig::default();
    assert_eq!(cfg.gpus, vec!["h100-sxm"; 4]);
    assert_eq!((cfg.ambient_c, cfg.seed, cfg.step_s), (25.0, 0, 0.1));
    let t = cfg.training.clone().unwrap();
    assert_eq!(
        (t.model.as_str(), t.batch_size, t.prefetch_depth, t.workers),
        ("resnet50", 256, 2, 8)
    );

    let mut node = Node::new(&cfg).unwrap();
    node.advance_to(60.0);
    for r in readings(&node) {
        assert!(
            r.util_gpu_pct > 80.0 && r.util_gpu_pct < 100.0,
            "{}",
            r.util_gpu_pct
        );
        assert!(r.power_w > 550.0 && r.power_w <= 700.0, "{}", r.power_w);
        assert_eq!(r.pstate, 0);
    }
}

#[test]
fn bad_configs_are_refused() {
    let mut cfg = NodeConfig::default();
    cfg.gpus.push("b300".into());
    assert_eq!(
        Node::new(&cfg).unwrap_err(),
        SimError::UnknownGpu("b300".into())
    );

    let cfg = NodeConfig {
        training: Some(TrainingConfig {
            model: "alexnet".into(),
            batch_size: 1,
            prefetch_depth: 1,
            workers: 1,
        }),
        ..NodeConfig::default()
    };
    assert_eq!(
        Node::new(&cfg).unwrap_err(),
        SimError::UnknownModel("alexnet".into())
    );

    let cfg = NodeConfig {
        step_s: 0.0,
        ..NodeConfig::default()
    };
    assert!(matches!(Node::new(&cfg), Err(SimError::OutOfRange { .. })));

    let mut node = Node::new(&NodeConfig::default()).unwrap();
    assert!(node.gpu(4).is_none() && node.gpu_mut(4).is_none());
    assert_eq!(node.try_gpu_mut(4).unwrap_err(), SimError::NoSuchGpu(4));
}

#[test]
fn gpus_are_staggered_slightly() {
    let node = Node::new(&NodeConfig::default()).unwrap();
    let rs: Vec<f64> = node
        .gpus()
        .iter()
        .map(|g| g.thermal_resistance_c_per_w())
        .collect();
    for r in &rs {
        assert!((r / 0.065 - 1.0).abs() <= 0.04, "{r}");
    }
    assert!(rs.windows(2).all(|w| w[0] != w[1]), "{rs:?}");
    let jitters: Vec<f64> = node.gpus().iter().map(|g| g.data_jitter_frac()).collect();
    assert!(jitters.windows(2).all(|w| w[0] != w[1]), "{jitters:?}");
}

#[test]
fn same_seed_same_readings_different_seed_different() {
    let cfg = NodeConfig {
        gpus: vec!["h100".into(), "a100".into(), "v100".into(), "4090".into()],
        ..NodeConfig::default()
    };
    let mut a = Node::new(&cfg).unwrap();
    let mut b = Node::new(&cfg).unwrap();
    let mut c = Node::new(&NodeConfig {
        seed: 1,
        ..cfg.clone()
    })
    .unwrap();
    for i in 0..1000 {
        if i == 500 {
            for n in [&mut a, &mut b, &mut c] {
                n.gpu_mut(0).unwrap().set_power_limit_w(450.0).unwrap();
            }
        }
        a.step();
        b.step();
        c.step();
    }
    assert_eq!(readings(&a), readings(&b));
    assert_eq!(a, b);
    assert_ne!(readings(&a), readings(&c));
    assert_eq!(a.time_s(), 100.0);
}

#[test]
fn serialized_node_continues_identically() {
    let mut node = Node::new(&NodeConfig::default()).unwrap();
    node.gpu_mut(1).unwrap().set_power_limit_w(500.0).unwrap();
    node.gpu_mut(2)
        .unwrap()
        .set_locked_clocks(1000, 1500)
        .unwrap();
    node.set_ambient_c(30.0);
    node.advance_to(123.4);

    let json = serde_json::to_string(&node).unwrap();
    assert!(json.contains("\"spec\":\"h100-sxm\""), "spec stored by id");
    let mut copy: Node = serde_json::from_str(&json).unwrap();
    assert_eq!(copy, node);
    for _ in 0..500 {
        node.step();
        copy.step();
    }
    assert_eq!(readings(&copy), readings(&node));
    assert_eq!(
        serde_json::to_string(&copy).unwrap(),
        serde_json::to_string(&node).unwrap()
    );

    let bad = json.replace("\"spec\":\"h100-sxm\"", "\"spec\":\"b300\"");
    let err = serde_json::from_str::<Node>(&bad).unwrap_err();
    assert!(
        err.to_string().contains("unknown GPU spec id \"b300\""),
        "{err}"
    );
}

#[test]
fn advance_to_takes_whole_steps_and_never_goes_back() {
    let mut node = Node::new(&NodeConfig::default()).unwrap();
    node.advance_to(0.3);
    assert_eq!(
        node.steps(),
        3,
        "float rounding must not lose the last step"
    );
    node.advance_to(1.05);
    assert_eq!(node.steps(), 10);
    assert!((node.time_s() - 1.0).abs() < 1e-12);
    node.advance_to(0.5);
    assert_eq!(node.steps(), 10);
    node.advance_to(f64::NAN);
    assert_eq!(node.steps(), 10);
    node.step();
    assert_eq!(node.steps(), 11);
    assert!((node.time_s() - 1.1).abs() < 1e-12);
}

#[test]
fn ambient_is_shared_and_settable() {
    let mut node = Node::new(&NodeConfig {
        training: None,
        ..NodeConfig::default()
    })
    .unwrap();
    node.set_ambient_c(40.0);
    assert_eq!(node.ambient_c(), 40.0);
    assert_eq!(node.config().ambient_c, 25.0);
    node.advance_to(600.0);
    for g in node.gpus() {
        let t = g.reading().temperature_c;
        assert!(
            (t - (40.0 + g.thermal_resistance_c_per_w() * 70.0)).abs() < 0.1,
            "{t}"
        );
    }
}

#[test]
fn a_cooling_fault_makes_one_gpu_hot_and_throttled_while_its_siblings_run_on() {
    let mut node = Node::new(&NodeConfig::default()).unwrap();
    node.add_cooling_fault(gpusim::CoolingFault {
        gpu: 2,
        at_s: 120.0,
        thermal_resistance_scale: 3.0,
    })
    .unwrap();
    // Refused: no such GPU, a factor out of range; nothing is scheduled by them.
    let bad = |gpu, scale| gpusim::CoolingFault {
        gpu,
        at_s: 0.0,
        thermal_resistance_scale: scale,
    };
    assert_eq!(
        node.add_cooling_fault(bad(9, 2.0)),
        Err(SimError::NoSuchGpu(9))
    );
    assert!(node.add_cooling_fault(bad(1, 50.0)).is_err());
    assert_eq!(node.cooling_faults().len(), 1);

    node.advance_to(119.0);
    let before = readings(&node);
    let max = node.gpu(0).unwrap().spec().sm_clock_max_mhz;
    for r in &before {
        assert!(r.temperature_c < 75.0, "healthy cooling: {r:?}");
        assert_eq!(
            r.throttle_reasons & gpusim::throttle::HW_THERMAL_SLOWDOWN,
            0
        );
    }
    // From a minute after the fault: GPU 2 sits at its slowdown threshold, throttled to half
    // its clock; the others are as they were.
    let slowdown = node.gpu(2).unwrap().spec().slowdown_c;
    let (mut throttled, mut n) = (0, 0);
    let mut hottest: f64 = 0.0;
    let mut t = 180.0;
    while t <= 300.0 {
        node.advance_to(t);
        let r = readings(&node);
        n += 1;
        if r[2].throttle_reasons & gpusim::throttle::HW_THERMAL_SLOWDOWN != 0 {
            throttled += 1;
            assert!(r[2].sm_clock_mhz <= max / 2 + 15, "{:?}", r[2]);
        }
        hottest = hottest.max(r[2].temperature_c);
        for i in [0, 1, 3] {
            assert!(r[i].temperature_c < 75.0, "GPU {i}: {:?}", r[i]);
            assert_eq!(
                r[i].throttle_reasons & gpusim::throttle::HW_THERMAL_SLOWDOWN,
                0
            );
        }
        assert!(
            r[2].temperature_c > slowdown - 6.0,
            "GPU 2 stays at its threshold: {:?}",
            r[2]
        );
        t += 1.0;
    }
    // Throttled, it draws about half: it settles just under the threshold, latched.
    assert!(
        hottest > slowdown - 3.0 && hottest < slowdown + 3.0,
        "{hottest}"
    );
    assert!(
        throttled * 10 >= n * 9,
        "throttled {throttled} of {n} seconds"
    );
    // The fault survives a round trip through the serialized state.
    let json = serde_json::to_string(&node).unwrap();
    let back: Node = serde_json::from_str(&json).unwrap();
    assert_eq!(back.cooling_faults(), node.cooling_faults());
    assert_eq!(back.gpu(2).unwrap().cooling_scale(), 3.0);
}

/// A node training BERT-large on eight H100s, sampled once a second for `secs` seconds.
fn per_second(activity: Option<gpusim::Activity>, secs: usize) -> Vec<Vec<gpusim::GpuReading>> {
    let cfg = NodeConfig {
        gpus: vec!["h100-sxm".into(); 8],
        seed: 8,
        training: Some(TrainingConfig {
            model: "bert-large".into(),
            batch_size: 32,
            prefetch_depth: 4,
            workers: 8,
        }),
        ..NodeConfig::default()
    };
    let mut node = Node::new(&cfg).unwrap();
    node.set_activity(activity).unwrap();
    node.advance_to(600.0); // a warm node
    (1..=secs)
        .map(|s| {
            node.advance_to(600.0 + s as f64);
            readings(&node)
        })
        .collect()
}

/// Seconds (of consecutive pairs) in which GPU 0's figure changed by at least `min`.
fn moves(
    samples: &[Vec<gpusim::GpuReading>],
    min: f64,
    f: fn(&gpusim::GpuReading) -> f64,
) -> usize {
    samples
        .windows(2)
        .filter(|w| (f(&w[1][0]) - f(&w[0][0])).abs() >= min)
        .count()
}

#[test]
fn a_busy_node_moves_every_second_and_a_steady_one_does_not() {
    let busy = per_second(Some(gpusim::Activity::default()), 120);
    let steady = per_second(None, 120);
    // Power by at least 5 W in most seconds; the SM clock steps under the cap; utilization
    // dips in stalls; temperature follows power.
    let counts = [
        moves(&busy, 3.0, |r| r.power_w),
        moves(&busy, 15.0, |r| f64::from(r.sm_clock_mhz)),
        moves(&busy, 1.0, |r| r.util_gpu_pct),
        moves(&busy, 0.1, |r| r.temperature_c),
    ];
    eprintln!("seconds of 119 with a move (power, clock, util, temperature): {counts:?}");
    assert!(counts[0] > 80, "busy power");
    assert!(counts[1] > 12, "busy clock");
    assert!(counts[2] > 40, "busy util");
    assert!(counts[3] > 25, "busy temperature");
    assert!(moves(&steady, 5.0, |r| r.power_w) == 0, "steady power");
    assert!(
        moves(&steady, 15.0, |r| f64::from(r.sm_clock_mhz)) == 0,
        "steady clock"
    );
    // The mean load stays near the model's: gaps, stalls and evaluations take a few percent
    // off, the capped peaks cannot add it back.
    let mean = |s: &[Vec<gpusim::GpuReading>]| {
        s.iter().map(|r| r[0].power_w).sum::<f64>() / s.len() as f64
    };
    assert!(
        (0.88..0.99).contains(&(mean(&busy) / mean(&steady))),
        "{} vs {}",
        mean(&busy),
        mean(&steady)
    );
    // And a node built the same way moves the same way (deterministic under its seed).
    assert_eq!(busy, per_second(Some(gpusim::Activity::default()), 120));
}

#[test]
fn a_busy_node_survives_serialization_and_old_state_reads_as_steady() {
    let mut node = Node::new(&NodeConfig::default()).unwrap();
    node.set_activity(Some(gpusim::Activity::default()))
        .unwrap();
    node.advance_to(10.0);
    let json = serde_json::to_string(&node).unwrap();
    let mut back: Node = serde_json::from_str(&json).unwrap();
    node.advance_to(20.0);
    back.advance_to(20.0);
    assert_eq!(readings(&node), readings(&back));
    assert!(back.gpu(0).unwrap().activity().is_some());

    let steady = serde_json::to_string(&Node::new(&NodeConfig::default()).unwrap()).unwrap();
    assert!(
        !steady.contains("activity"),
        "steady state is written as before"
    );
}
