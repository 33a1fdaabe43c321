//! The governor on a simulated node, in simulated time (no sleeping): the figures in
//! docs/operations.md ("Thermal governor") come from these tests.

use super::*;
use gpusim::{Node, NodeConfig, TrainingConfig};

/// A node of one `gpu` training the heaviest model, in a 35 °C room.
fn hot_node(gpu: &str) -> Node {
    let spec = gpusim::find(gpu).unwrap();
    // The heaviest model where it fits, else BERT-large.
    let model = if gpusim::find_model("gpt-1.3b").unwrap().fits(spec, 8) {
        "gpt-1.3b"
    } else {
        "bert-large"
    };
    Node::new(&NodeConfig {
        gpus: vec![gpu.to_string()],
        ambient_c: 35.0,
        seed: 3,
        step_s: 0.1,
        training: Some(TrainingConfig {
            model: model.into(),
            batch_size: 8,
            prefetch_depth: 4,
            workers: 8,
        }),
    })
    .unwrap()
}

thread_local! {
    static ROUND: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn input(node: &Node, now_s: f64, user_cap_w: Option<f64>) -> GovernorInput {
    let g = node.gpu(0).unwrap();
    let r = g.reading();
    let s = g.spec();
    GovernorInput {
        now_s,
        sample_time_s: now_s,
        temperature_c: Some(if ROUND.with(|r| r.get()) {
            r.temperature_c.round()
        } else {
            r.temperature_c
        }),
        slowdown_c: Some(s.slowdown_c),
        stale: false,
        power_w: Some(r.power_w),
        cap_w: r.power_limit_w,
        min_w: s.power_min_w,
        max_w: s.power_max_w,
        user_cap_w,
    }
}

/// What a run of the governor did: temperatures every second, caps, and when it settled.
struct Trace {
    temps: Vec<f64>,
    caps: Vec<f64>,
    /// First second after which every temperature stays within ±2 °C of the target.
    settled_at_s: Option<usize>,
    max_step_w: f64,
}

/// Run `node` for `secs` simulated seconds with a decision every second.
fn govern(node: &mut Node, target: Target, secs: usize, user_cap_w: Option<f64>) -> Trace {
    govern_with(node, target, secs, user_cap_w, GovernorConfig::default())
}

fn govern_with(
    node: &mut Node,
    target: Target,
    secs: usize,
    user_cap_w: Option<f64>,
    cfg: GovernorConfig,
) -> Trace {
    let mut gov = Governor::new(target, cfg);
    let target_c = target
        .resolve(Some(node.gpu(0).unwrap().spec().slowdown_c))
        .unwrap();
    let (mut temps, mut caps, mut max_step_w) = (Vec::new(), Vec::new(), 0.0f64);
    for t in 1..=secs {
        node.advance_to(t as f64);
        let d = gov.decide(&input(node, t as f64, user_cap_w));
        if let Some(to) = d.new_cap_w() {
            let from = node.gpu(0).unwrap().power_limit_w();
            max_step_w = max_step_w.max((to - from).abs());
            node.gpu_mut(0).unwrap().set_power_limit_w(to).unwrap();
        }
        let g = node.gpu(0).unwrap();
        temps.push(g.reading().temperature_c);
        caps.push(g.power_limit_w());
    }
    let last_out = temps.iter().rposition(|t| (t - target_c).abs() > 2.0);
    let settled_at_s = match last_out {
        Some(i) if i + 1 >= temps.len() => None,
        Some(i) => Some(i + 2),
        None => Some(1),
    };
    Trace {
        temps,
        caps,
        settled_at_s,
        max_step_w,
    }
}

/// The stated settle time: docs/operations.md repeats it.
const SETTLE_WITHIN_S: usize = 120;

#[test]
fn a_hot_h100_at_35c_settles_at_its_target_and_never_reaches_slowdown() {
    let mut node = hot_node("h100-sxm");
    let spec = node.gpu(0).unwrap().spec();
    // Premise: left alone, this GPU settles well above the target.
    let free = node.gpu(0).unwrap().steady_temperature_c(35.0);
    let target = Target::BelowSlowdown(15.0);
    let target_c = spec.slowdown_c - 15.0;
    assert!(free > target_c + 4.0, "uncontrolled {free:.1} °C");
    let tr = govern(&mut node, target, 900, None);
    let settled = tr.settled_at_s.expect("never settled");
    eprintln!(
        "h100: free {free:.1} °C, target {target_c} °C, settled at {settled} s, peak {:.2} °C, final cap {:.0} W",
        tr.temps.iter().cloned().fold(f64::MIN, f64::max),
        tr.caps.last().unwrap()
    );
    assert!(settled <= SETTLE_WITHIN_S, "settled at {settled} s");
    assert!(tr.temps.iter().all(|&t| t < spec.slowdown_c));
    // No overshoot past the band on the way up (the lead cuts before the crossing).
    assert!(tr.temps.iter().cloned().fold(f64::MIN, f64::max) < target_c + 2.0);
    // The steady cap sits where physics says the target is: (target − ambient) / R.
    let r = node.gpu(0).unwrap().thermal_resistance_c_per_w();
    let cap = *tr.caps.last().unwrap();
    let draw = node.gpu(0).unwrap().reading().power_w;
    assert!((draw - (target_c - 35.0) / r).abs() < 2.0 / r, "{draw} W");
    assert!(cap >= spec.power_min_w && cap <= spec.power_max_w);
    // Bounded steps: never more than 6% of the range per decision.
    assert!(tr.max_step_w <= 0.06 * (spec.power_max_w - spec.power_min_w) + 1.0);
    // Hysteresis: once settled, the cap moves rarely (not every second).
    let moves = tr.caps[600..].windows(2).filter(|w| w[0] != w[1]).count();
    assert!(moves < 30, "{moves} changes in the last 300 s");
}

#[test]
fn whole_degree_readings_and_a_warmer_room_are_followed() {
    // NVML reports whole degrees; the trend filter keeps the lead from jumping on each step.
    ROUND.with(|r| r.set(true));
    let mut node = hot_node("h100-sxm");
    let spec = node.gpu(0).unwrap().spec();
    let target = Target::BelowSlowdown(15.0);
    let target_c = spec.slowdown_c - 15.0;
    let tr = govern(&mut node, target, 400, None);
    assert!(
        tr.settled_at_s.is_some_and(|s| s <= SETTLE_WITHIN_S),
        "{:?}",
        tr.settled_at_s
    );
    let moves = tr.caps[200..].windows(2).filter(|w| w[0] != w[1]).count();
    assert!(moves < 30, "{moves} changes in 200 s");
    // The room warms by 5 °C: the governor gives up watts and settles again.
    let cap_before = *tr.caps.last().unwrap();
    node.set_ambient_c(40.0);
    let mut gov = Governor::new(target, GovernorConfig::default());
    let mut temps = Vec::new();
    for t in 401..=800 {
        node.advance_to(t as f64);
        if let Some(to) = gov.decide(&input(&node, t as f64, None)).new_cap_w() {
            node.gpu_mut(0).unwrap().set_power_limit_w(to).unwrap();
        }
        temps.push(node.gpu(0).unwrap().reading().temperature_c);
    }
    ROUND.with(|r| r.set(false));
    assert!(temps.iter().all(|&t| t < spec.slowdown_c));
    assert!(
        temps[SETTLE_WITHIN_S..]
            .iter()
            .all(|t| (t - target_c).abs() <= 2.0)
    );
    let cap_after = node.gpu(0).unwrap().power_limit_w();
    assert!(cap_after < cap_before - 50.0, "{cap_before} → {cap_after}");
}

#[test]
fn every_catalog_gpu_settles_at_slowdown_minus_12_within_the_stated_time() {
    for gpu in ["a100-sxm-80gb", "v100-sxm2", "h200", "rtx-4090"] {
        let mut node = hot_node(gpu);
        let spec = node.gpu(0).unwrap().spec();
        let free = node.gpu(0).unwrap().steady_temperature_c(35.0);
        let target_c = (spec.slowdown_c - 12.0).min(free - 5.0);
        let tr = govern(&mut node, Target::Celsius(target_c), 900, None);
        let settled = tr.settled_at_s.unwrap_or(usize::MAX);
        eprintln!("{gpu}: free {free:.1} °C, target {target_c:.1} °C, settled at {settled} s");
        assert!(settled <= SETTLE_WITHIN_S, "{gpu}: settled at {settled} s");
        assert!(tr.temps.iter().all(|&t| t < spec.slowdown_c), "{gpu}");
        assert!(
            tr.temps[SETTLE_WITHIN_S..]
                .iter()
                .all(|t| (t - target_c).abs() <= 2.0),
            "{gpu}"
        );
    }
}

#[test]
fn the_users_cap_is_a_ceiling_and_the_minimum_a_floor() {
    // A target the GPU cannot reach even at the minimum cap: it stays at the floor.
    let mut node = hot_node("h100-sxm");
    let tr = govern(&mut node, Target::Celsius(36.0), 400, None);
    let spec = node.gpu(0).unwrap().spec();
    assert_eq!(*tr.caps.last().unwrap(), spec.power_min_w);
    assert!(tr.caps.iter().all(|&c| c >= spec.power_min_w));
    // A cool target and a user cap of 450 W: never above 450 W.
    let mut node = hot_node("h100-sxm");
    node.gpu_mut(0).unwrap().set_power_limit_w(450.0).unwrap();
    let tr = govern(&mut node, Target::Celsius(88.0), 400, Some(450.0));
    assert!(tr.caps.iter().all(|&c| c <= 450.0), "{:?}", tr.caps);
}

#[test]
fn stale_telemetry_holds_the_cap_still() {
    let mut node = hot_node("h100-sxm");
    let mut gov = Governor::new(Target::Celsius(70.0), GovernorConfig::default());
    node.advance_to(200.0);
    let mut i = input(&node, 200.0, None);
    // The sampler marks it stale.
    i.stale = true;
    let d = gov.decide(&i);
    assert_eq!(d.action, CapMove::Hold);
    assert_eq!(d.mode, Mode::Stale);
    assert!(d.why.contains("stale"), "{}", d.why);
    // The newest sample is old.
    i.stale = false;
    i.sample_time_s = 190.0;
    let d = gov.decide(&i);
    assert_eq!((d.action, d.mode), (CapMove::Hold, Mode::Stale));
    assert!(d.why.contains("10 s old"), "{}", d.why);
    // No temperature.
    i.sample_time_s = 200.0;
    i.temperature_c = None;
    assert_eq!(gov.decide(&i).action, CapMove::Hold);
    // Over a whole minute of stale samples on a hot GPU, not one change.
    let mut stale_secs = 0;
    for t in 201..=260 {
        node.advance_to(t as f64);
        let mut i = input(&node, t as f64, None);
        // The sampler's newest reading is from before the minute began.
        i.sample_time_s = 194.0;
        if gov.decide(&i).new_cap_w().is_none() {
            stale_secs += 1;
        }
    }
    assert_eq!(stale_secs, 60);
    // Fresh again: it acts at once (the GPU is far above 70 °C).
    let d = gov.decide(&input(&node, 261.0, None));
    assert!(d.new_cap_w().is_some_and(|c| c < 700.0), "{d:?}");
}

#[test]
fn a_margin_needs_a_slowdown_threshold() {
    let mut gov = Governor::new(Target::BelowSlowdown(8.0), GovernorConfig::default());
    let d = gov.decide(&GovernorInput {
        now_s: 1.0,
        sample_time_s: 1.0,
        temperature_c: Some(80.0),
        slowdown_c: None,
        stale: false,
        power_w: Some(300.0),
        cap_w: 350.0,
        min_w: 100.0,
        max_w: 400.0,
        user_cap_w: None,
    });
    assert_eq!(d.action, CapMove::Hold);
    assert!(d.why.contains("absolute target"), "{}", d.why);
    assert_eq!(Target::BelowSlowdown(8.0).resolve(Some(89.0)), Some(81.0));
}

#[test]
fn a_cap_far_above_the_draw_is_cut_from_the_draw() {
    let mut gov = Governor::new(Target::Celsius(70.0), GovernorConfig::default());
    let d = gov.decide(&GovernorInput {
        now_s: 1.0,
        sample_time_s: 1.0,
        temperature_c: Some(75.0),
        slowdown_c: Some(89.0),
        stale: false,
        power_w: Some(400.0),
        cap_w: 700.0,
        min_w: 200.0,
        max_w: 700.0,
        user_cap_w: None,
    });
    let to = d.new_cap_w().unwrap();
    assert!((380.0..410.0).contains(&to), "{d:?}");
    assert!(d.why.contains("75.0 °C > target 70 °C"), "{}", d.why);
}

#[test]
fn implausible_limits_move_nothing_and_say_why() {
    // A GPU at 29 °C under an 85 °C target would get watts back; with its limit read as 0 W
    // (or any figure that makes no sense) it gets nothing, and the decision says why.
    let base = GovernorInput {
        now_s: 1.0,
        sample_time_s: 1.0,
        temperature_c: Some(29.0),
        slowdown_c: Some(89.0),
        stale: false,
        power_w: Some(620.0),
        cap_w: 0.0,
        min_w: 200.0,
        max_w: 700.0,
        user_cap_w: Some(0.0),
    };
    let cases = [
        (base, "reads 0 W"),
        (
            GovernorInput {
                cap_w: f64::NAN,
                user_cap_w: None,
                ..base
            },
            "do not read as numbers",
        ),
        (
            GovernorInput {
                cap_w: 500.0,
                min_w: 700.0,
                max_w: 200.0,
                user_cap_w: None,
                ..base
            },
            "upside down",
        ),
        (
            GovernorInput {
                cap_w: 900.0,
                user_cap_w: None,
                ..base
            },
            "outside its range",
        ),
        (
            GovernorInput {
                cap_w: 500.0,
                max_w: f64::NAN,
                user_cap_w: None,
                ..base
            },
            "do not read as numbers",
        ),
    ];
    for (input, says) in cases {
        let mut gov = Governor::new(Target::Celsius(85.0), GovernorConfig::default());
        for s in 0..5 {
            let d = gov.decide(&GovernorInput {
                now_s: 1.0 + s as f64,
                sample_time_s: 1.0 + s as f64,
                ..input
            });
            assert_eq!(d.action, CapMove::Hold, "{input:?}: {d:?}");
            assert_eq!(d.mode, Mode::Refused);
            assert!(d.why.contains(says), "{}", d.why);
            assert!(d.why.contains("not moved"), "{}", d.why);
        }
    }
    // The same GPU with a plausible limit is given watts back as before.
    let mut gov = Governor::new(Target::Celsius(85.0), GovernorConfig::default());
    let d = gov.decide(&GovernorInput {
        cap_w: 400.0,
        user_cap_w: None,
        ..base
    });
    assert!(d.new_cap_w().is_some_and(|w| w > 400.0), "{d:?}");
}
