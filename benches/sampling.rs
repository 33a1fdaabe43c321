//! Sampling cost: 8 GPUs at 10 Hz for a fixed time, CPU seconds of this process per wall second.
//!
//! `cargo bench --bench sampling -- SOURCE [SECONDS] [HZ] [GPUS]` with SOURCE `sim` or `nvml`
//! (for `nvml`, set GPUPILOT_NVML_LIB and the fake library's FAKE_NVML_SCENARIO; see
//! bench/sampling.sh, which runs both on a busy node). Prints one line of `key=value` pairs.
//!
//! The simulated node moves as a busy one: gpusim's default [`gpusim::Activity`] (the one the
//! fake library's `scenarios/8xh100.toml` spells out) is set on every GPU once the source has
//! warmed up, so utilization, power, clocks, temperature and PCIe traffic change every second.

use gpupilot::history::History;
use gpupilot::telemetry::nvml::NvmlSource;
use gpupilot::telemetry::open::{Opened, SimSpec, SourceKind, open};
use gpupilot::telemetry::{Sampler, SamplerConfig, Source};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// utime + stime of this process, seconds (from /proc/self/stat; clock ticks are 1/100 s).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // Fields after the command name, which is in parentheses and may contain spaces.
    let rest = &stat[stat.rfind(')').expect("stat format") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    ticks / 100.0
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let kind = args.first().map(String::as_str).unwrap_or("sim");
    let seconds: f64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(30.0);
    let hz: f64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(10.0);
    let gpus: u32 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(8);

    let source: Arc<dyn Source> = match kind {
        "sim" => {
            let spec = SimSpec {
                gpus,
                model: "h100-sxm".into(),
                workload: "resnet50".into(),
                seed: 0,
                counters: None,
            };
            let Ok(Opened::Sim(sim)) = open(SourceKind::Sim, None, &spec) else {
                panic!("the simulator did not open")
            };
            sim.with_node(|node| node.set_activity(Some(gpusim::Activity::default())))
                .expect("gpusim's default activity");
            Arc::new(sim)
        }
        "nvml" => {
            let lib = std::env::var_os("GPUPILOT_NVML_LIB").map(std::path::PathBuf::from);
            Arc::new(NvmlSource::open(lib.as_deref()).expect("NVML (set GPUPILOT_NVML_LIB)"))
        }
        other => panic!("unknown source {other}: sim or nvml"),
    };
    let n = source.gpu_count();
    let mut config = SamplerConfig::every(Duration::from_secs_f64(1.0 / hz));
    config.host = true;
    let sampler = Sampler::start(source, config);
    let rx = sampler.subscribe();
    let mut history = History::default();

    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    let mut snapshots = 0u64;
    // GPU 0's power over the run: a range of a few watts would mean a steady node, not a busy one.
    let (mut power_lo, mut power_hi) = (f64::INFINITY, f64::NEG_INFINITY);
    while t0.elapsed().as_secs_f64() < seconds {
        if let Ok(s) = rx.recv_timeout(Duration::from_millis(500)) {
            history.record(&s);
            snapshots += 1;
            if let Some(w) = s.gpus.first().and_then(|g| g.power_w) {
                power_lo = power_lo.min(w);
                power_hi = power_hi.max(w);
            }
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    println!(
        "source={kind} gpus={n} hz={hz} wall_s={wall:.1} cpu_s={cpu:.2} cpu_pct_of_core={:.2} snapshots={snapshots} gpu0_power_w={power_lo:.0}..{power_hi:.0}",
        100.0 * cpu / wall
    );
}
