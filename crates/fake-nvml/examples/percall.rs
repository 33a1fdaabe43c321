//! Measures what a reader pays per NVML call on the fake library, through nvml-wrapper:
//! `cargo run -p fake-nvml --example percall [--release] -- [CALLS]`.
//!
//! Uses `FAKE_NVML_SCENARIO` if set (the benchmarks use `scenarios/8xh100.toml`) and a private
//! state file. Prints the mean cost of `nvmlDeviceGetPowerUsage`, and of one 10 Hz sampler
//! tick (20 reads on every GPU).

use std::ffi::OsStr;
use std::time::Instant;

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{
    Clock, PcieUtilCounter, TemperatureSensor, TemperatureThreshold,
};

fn main() {
    let calls: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100_000);
    let lib = nvidia_ml::testing::find_cdylib()
        .expect("build the library first: cargo build -p fake-nvml");
    let state =
        std::env::temp_dir().join(format!("fake-nvml-percall-{}.state", std::process::id()));
    // SAFETY: single-threaded, before the library is loaded.
    unsafe { std::env::set_var("FAKE_NVML_STATE", &state) };
    let nvml = Nvml::builder()
        .lib_path(OsStr::new(&lib))
        .init()
        .expect("nvmlInit_v2");
    let n = nvml.device_count().unwrap();
    let devices: Vec<_> = (0..n).map(|i| nvml.device_by_index(i).unwrap()).collect();

    let t = Instant::now();
    let mut sum = 0u64;
    for _ in 0..calls {
        sum += u64::from(devices[0].power_usage().unwrap());
    }
    let per_call = t.elapsed().as_secs_f64() / f64::from(calls);
    println!("library: {}", lib.display());
    println!(
        "nvmlDeviceGetPowerUsage: {:.0} ns/call over {calls} calls (checksum {sum})",
        per_call * 1e9
    );

    let ticks = 1_000;
    let t = Instant::now();
    for _ in 0..ticks {
        for d in &devices {
            let _ = d.utilization_rates();
            let _ = d.memory_info();
            let _ = d.temperature(TemperatureSensor::Gpu);
            let _ = d.temperature_threshold(TemperatureThreshold::Slowdown);
            let _ = d.temperature_threshold(TemperatureThreshold::Shutdown);
            let _ = d.power_usage();
            let _ = d.power_management_limit();
            let _ = d.enforced_power_limit();
            let _ = d.power_management_limit_default();
            let _ = d.power_management_limit_constraints();
            let _ = d.total_energy_consumption();
            let _ = d.clock_info(Clock::SM);
            let _ = d.clock_info(Clock::Memory);
            let _ = d.max_clock_info(Clock::SM);
            let _ = d.fan_speed(0);
            let _ = d.performance_state();
            let _ = d.current_throttle_reasons();
            let _ = d.pcie_throughput(PcieUtilCounter::Receive);
            let _ = d.pcie_throughput(PcieUtilCounter::Send);
            let _ = d.running_compute_processes();
        }
    }
    let per_tick = t.elapsed().as_secs_f64() / f64::from(ticks);
    println!(
        "sampler tick (20 reads x {n} GPUs): {:.1} us; at 10 Hz that is {:.3}% of a core",
        per_tick * 1e6,
        per_tick * 10.0 * 100.0
    );
    drop(devices);
    drop(nvml);
    let _ = std::fs::remove_file(state);
}
