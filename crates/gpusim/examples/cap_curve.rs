//! What the model says a power sweep should find: for one GPU under a training workload (the
//! `--source sim` default, ResNet-50 at batch 256, prefetch 2, 8 workers, unless told), the
//! steady SM clock and board power at each cap from MAX down to MIN, and from them the knee
//! (the lowest cap whose clock stays within 2 % of the highest, going down from the top: a
//! GEMM's throughput is proportional to the clock) and the cap of the most clock per watt (a
//! GEMM's best perf/W). `gpupilot bench power-sweep --source sim` is compared with it in
//! BENCHMARKS.md.
//!
//! `cargo run -p gpusim --example cap_curve -- h100-sxm 700:200:50 [MODEL BATCH]`

use gpusim::{Node, NodeConfig, TrainingConfig};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let gpu = args.first().map_or("h100-sxm", String::as_str);
    let caps = args.get(1).map_or("700:200:50", String::as_str);
    let model = args.get(2).map_or("resnet50", String::as_str);
    let batch: u32 = args.get(3).and_then(|b| b.parse().ok()).unwrap_or(256);
    let parts: Vec<f64> = caps.split(':').filter_map(|p| p.parse().ok()).collect();
    let [max, min, step] = parts[..] else {
        eprintln!("caps: MAX:MIN:STEP");
        std::process::exit(2);
    };
    let cfg = NodeConfig {
        gpus: vec![gpu.to_string()],
        training: Some(TrainingConfig {
            model: model.into(),
            batch_size: batch,
            prefetch_depth: 2,
            workers: 8,
        }),
        ..NodeConfig::default()
    };
    let mut node = match Node::new(&cfg) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    node.advance_to(10.0);
    let mut rows = Vec::new();
    let mut cap = max;
    while cap >= min - 1e-9 {
        let Some(g) = node.gpu_mut(0) else { return };
        if let Err(e) = g.set_power_limit_w(cap) {
            eprintln!("{e}");
            std::process::exit(2);
        }
        rows.push((cap, f64::from(g.steady_clock_mhz()), g.steady_power_w()));
        cap -= step;
    }
    println!("{gpu}, {model} batch {batch}:");
    println!(
        "{:>7} {:>9} {:>9} {:>12}",
        "cap", "clock", "power", "MHz per W"
    );
    for (c, f, p) in &rows {
        println!("{:>5} W {:>5} MHz {:>7.1} W {:>12.3}", c, f, p, f / p);
    }
    let top = rows.iter().map(|r| r.1).fold(0.0, f64::max);
    let knee = rows
        .iter()
        .take_while(|r| r.1 >= 0.98 * top)
        .last()
        .map_or(f64::NAN, |r| r.0);
    let best = rows
        .iter()
        .max_by(|a, b| (a.1 / a.2).total_cmp(&(b.1 / b.2)))
        .map_or(f64::NAN, |r| r.0);
    println!("knee: {knee} W; most clock per watt (a GEMM's best perf/W): {best} W");
}
