//! The energy tuner against an exhaustive sweep of caps, on gpusim (BENCHMARKS.md, "Energy
//! tuner"). Simulated time, so the figures do not depend on the machine.
//!
//! `cargo bench --bench tuner [-- --eta 0.5 --step-w 25]`. Prints a Markdown table.
//! `-- --joint`: the joint search of batch size and cap against the 2-D sweep instead.
//! `-- --knob clocks`: the search of locked SM clocks against the sweep of every clock of its
//! plan, and `--knob both`'s choice between the two knobs.

use gpupilot::control::tuner::sim::knob_on_sim;
use gpupilot::control::tuner::sim::{
    BENCH_CASES, Comparison, JOINT_CASES, Judged, SimSettings, compare, compare_joint, joint_table,
    table,
};
use gpupilot::control::tuner::{Knob, Strategy, Window};

fn main() {
    let mut s = SimSettings::default();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    let mut joint = false;
    let mut clocks = false;
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
            "--knob" => match it.next().map(String::as_str) {
                Some("clocks") => clocks = true,
                Some("cap") => {}
                _ => panic!("--knob takes cap or clocks"),
            },
            other => {
                panic!("unknown option {other}: use --eta E, --step-w W, --joint, --knob clocks")
            }
        }
    }
    if joint {
        return joint_bench(&s);
    }
    if clocks {
        return clock_bench(&s);
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

/// The clock search against the sweep of every clock of its plan (another seed), and what
/// `--knob both` keeps.
fn clock_bench(s: &SimSettings) {
    println!(
        "eta {}, clocks from the highest down to half of it, gpusim step {} s, seed {}\n",
        s.eta, s.sim_step_s, s.seed
    );
    println!(
        "| GPU | workload | clock sweep best (clocks, time) | golden: clock, gap, clocks, time share | saving vs unlocked (golden) | cap search's saving | --knob both keeps |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|");
    let mut worst: f64 = 0.0;
    let mut shares = Vec::new();
    for c in BENCH_CASES {
        let other = SimSettings {
            seed: s.seed.wrapping_add(1),
            ..s.clone()
        };
        let (Ok(sweep), Ok(golden), Ok(both)) = (
            knob_on_sim(c, &other, Knob::Clocks, Strategy::Sweep),
            knob_on_sim(c, s, Knob::Clocks, Strategy::Golden),
            knob_on_sim(c, s, Knob::Both, Strategy::Golden),
        ) else {
            println!("| {} | {} | (did not run) | | | | |", c.gpu, c.model);
            continue;
        };
        let (w, r) = (&sweep.result, &golden.result);
        let chosen = w
            .curve
            .iter()
            .find(|p| p.cap_w == r.best.cap_w)
            .map_or(r.best.cost, |p| p.cost);
        let gap = 100.0 * (chosen - w.best.cost) / w.best.cost;
        let share = golden.sim_time_s / sweep.sim_time_s;
        worst = worst.max(gap);
        shares.push(share);
        let b = &both.result;
        let cap_saving = if b.knob == Knob::Cap {
            b.cost_saving_pct
        } else {
            b.other.as_ref().and_then(|o| o.cost_saving_pct)
        };
        println!(
            "| {} | {} (batch {}) | {:.0} MHz ({}, {:.0} s) | {:.0} MHz, {gap:.2}%, {}, {:.0} s = {share:.2} | {:.1}% | {:.1}% | {} ({}) |",
            c.gpu,
            c.model,
            c.batch_size,
            w.best.cap_w,
            w.curve.len(),
            sweep.sim_time_s,
            r.best.cap_w,
            r.curve.len(),
            golden.sim_time_s,
            r.cost_saving_pct.unwrap_or(f64::NAN),
            cap_saving.unwrap_or(f64::NAN),
            b.knob.name(),
            b.knob.show(b.best.cap_w),
        );
    }
    let mean = shares.iter().sum::<f64>() / shares.len().max(1) as f64;
    println!(
        "\nclocks: worst cost gap {worst:.2}%, time {:.0}% of the clock sweep's on average, {:.0}% at most",
        100.0 * mean,
        100.0 * shares.iter().copied().fold(0.0, f64::max)
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
