//! History memory: 8 GPUs × every metric × 7 days at 1 Hz (then the raw tier at 10 Hz for its
//! last ten minutes), and the time a 200-column window query takes.
//!
//! `cargo bench --bench history`. Prints `key=value` pairs.

use gpupilot::history::{History, Metric};
use std::time::Instant;

fn main() {
    let mut h = History::default();
    let week = 7 * 86_400;
    let t0 = Instant::now();
    for s in 0..week {
        let t = s as f64;
        for g in 0..8 {
            for (k, m) in Metric::ALL.iter().enumerate() {
                h.push(g, *m, t, ((s + k) % 100) as f64);
            }
        }
    }
    // The last ten minutes at 10 Hz, as a daemon sampling at 10 Hz leaves them.
    for i in 0..6000 {
        let t = week as f64 + i as f64 * 0.1;
        for g in 0..8 {
            for m in Metric::ALL {
                h.push(g, m, t, 50.0);
            }
        }
    }
    let fill = t0.elapsed().as_secs_f64();
    let end = week as f64 + 600.0;
    let mut points = 0;
    let q0 = Instant::now();
    let windows = [60.0, 600.0, 3600.0, 86_400.0, 7.0 * 86_400.0];
    for _ in 0..100 {
        for w in windows {
            points += h.window(3, Metric::Power, end - w, end, 200).len();
        }
    }
    let query_us = q0.elapsed().as_secs_f64() * 1e6 / (100.0 * windows.len() as f64);
    println!(
        "series={} allocated_mib={:.1} budget_mib={:.1} fill_s={fill:.1} window_query_us={query_us:.1} points={points}",
        8 * Metric::ALL.len(),
        h.allocated_bytes() as f64 / (1 << 20) as f64,
        h.budget_bytes() as f64 / (1 << 20) as f64,
    );
}
