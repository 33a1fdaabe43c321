//! The energy tuner against an exhaustive sweep of caps, on gpusim (BENCHMARKS.md, "Energy
//! tuner"). Simulated time, so the figures do not depend on the machine.
//!
//! `cargo bench --bench tuner [-- --eta 0.5 --step-w 25]`. Prints a Markdown table.

use gpupilot::control::tuner::sim::{BENCH_CASES, SimSettings, compare, table};

fn main() {
    let mut s = SimSettings::default();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
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
            other => panic!("unknown option {other}: use --eta E, --step-w W"),
        }
    }
    let mut rows = Vec::new();
    for case in BENCH_CASES {
        match compare(case, &s) {
            Ok(c) => rows.push(c),
            Err(e) => eprintln!("{} {}: {e}", case.gpu, case.model),
        }
    }
    println!(
        "eta {}, {} W steps, window {} + {} {:?} per cap, gpusim step {} s, seed {}\n",
        s.eta, s.step_w, s.window.warmup, s.window.measure, s.window.unit, s.sim_step_s, s.seed
    );
    print!("{}", table(&rows));
    let worst = rows.iter().map(|c| c.gap_pct).fold(0.0, f64::max);
    let mean_time = rows.iter().map(|c| c.time_fraction).sum::<f64>() / rows.len().max(1) as f64;
    let (lo, hi) = rows
        .iter()
        .filter_map(|c| c.tuner.result.energy_saving_pct)
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), e| {
            (lo.min(e), hi.max(e))
        });
    println!(
        "\nworst cost gap {worst:.2}%, mean tuner time {:.0}% of the sweep's, energy saved vs default {lo:.1}–{hi:.1}%",
        100.0 * mean_time
    );
}
