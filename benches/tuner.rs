//! The energy tuner against an exhaustive sweep of caps, on gpusim (BENCHMARKS.md, "Energy
//! tuner"). Simulated time, so the figures do not depend on the machine.
//!
//! `cargo bench --bench tuner [-- --eta 0.5 --step-w 25]`. Prints a Markdown table.
//! `-- --joint`: the joint search of batch size and cap against the 2-D sweep instead.

use gpupilot::control::tuner::Window;
use gpupilot::control::tuner::sim::{
    BENCH_CASES, Comparison, JOINT_CASES, Judged, SimSettings, compare, compare_joint, joint_table,
    table,
};

fn main() {
    let mut s = SimSettings::default();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    let mut joint = false;
    while let Some(a) = it.next() {
        let mut value = |name: &str| -> f64 {
            it.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{name} needs a number"))
        };
        match a.as_str() {
            "--eta" => s.eta = value("--eta"),
            "--step-w" => s.step_w = value("--step-w"),
            // cargo bench passes --bench to every target.
            "--bench" => {}
            "--joint" => joint = true,
            other => panic!("unknown option {other}: use --eta E, --step-w W"),
        }
    }
    if joint {
        return joint_bench(&s);
    }
    let rows = each(BENCH_CASES, |c| (c.gpu, c.model), |c| compare(c, &s));
    println!(
        "eta {}, {} W steps, gpusim step {} s, seed {}; windows per cap: golden {:?}, descend and sweep {:?}\n",
        s.eta,
        s.step_w,
        s.sim_step_s,
        s.seed,
        Window::GOLDEN_STEPS,
        Window::DEFAULT_STEPS
    );
    print!("{}", table(&rows));
    let worst =
        |f: fn(&Comparison) -> &Judged| rows.iter().map(|c| f(c).gap_pct).fold(0.0, f64::max);
    let time = |f: fn(&Comparison) -> &Judged| {
        let t: Vec<f64> = rows.iter().map(|c| f(c).time_fraction).collect();
        let mean = t.iter().sum::<f64>() / t.len().max(1) as f64;
        (mean, t.iter().copied().fold(0.0, f64::max))
    };
    let (gm, gmax) = time(|c| &c.golden);
    let (dm, dmax) = time(|c| &c.descend);
    let (lo, hi) = rows
        .iter()
        .filter_map(|c| c.golden.run.result.energy_saving_pct)
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), e| {
            (lo.min(e), hi.max(e))
        });
    println!(
        "\ngolden: worst cost gap {:.2}%, time {:.0}% of the sweep's on average, {:.0}% at most; \
         descend: worst gap {:.2}%, time {:.0}% on average, {:.0}% at most; \
         energy saved vs default (golden) {lo:.1}–{hi:.1}%",
        worst(|c| &c.golden),
        100.0 * gm,
        100.0 * gmax,
        worst(|c| &c.descend),
        100.0 * dm,
        100.0 * dmax,
    );
}

/// The joint search against the 2-D sweep (every cap at every batch that fits).
fn joint_bench(s: &SimSettings) {
    let rows = each(JOINT_CASES, |c| (c.gpu, c.model), |c| compare_joint(c, s));
    println!(
        "eta {}, {} W steps, gpusim step {} s, seed {}; windows per point: joint {:?}, sweep {:?}\n",
        s.eta,
        s.step_w,
        s.sim_step_s,
        s.seed,
        Window::GOLDEN_STEPS,
        Window::DEFAULT_STEPS
    );
    print!("{}", joint_table(&rows));
    let gap = rows.iter().map(|c| c.gap_pct).fold(0.0, f64::max);
    let t: Vec<f64> = rows.iter().map(|c| c.time_fraction).collect();
    let mean = t.iter().sum::<f64>() / t.len().max(1) as f64;
    let max = t.iter().copied().fold(0.0, f64::max);
    let probes: usize = rows.iter().map(|c| c.probes).sum();
    let sweep: usize = rows.iter().map(|c| c.sweep_probes).sum();
    println!(
        "\njoint: worst cost gap {gap:.2}%, time {:.0}% of the 2-D sweep's on average, {:.0}% at \
         most; {probes} points measured against the sweeps' {sweep}",
        100.0 * mean,
        100.0 * max
    );
}

/// `run` on each of `cases`, keeping what succeeded; a case that fails is said on stderr.
fn each<C, R, E: std::fmt::Display>(
    cases: &[C],
    name: impl Fn(&C) -> (&str, &str),
    run: impl Fn(&C) -> Result<R, E>,
) -> Vec<R> {
    let mut rows = Vec::new();
    for case in cases {
        match run(case) {
            Ok(c) => rows.push(c),
            Err(e) => {
                let (gpu, model) = name(case);
                eprintln!("{gpu} {model}: {e}");
            }
        }
    }
    rows
}
