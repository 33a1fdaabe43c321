//! Every fault kind a scenario can inject, seen through nvml-wrapper.

mod common;

use std::time::{Duration, Instant};

use common::{eventually, isolate, isolate_with, nvml};
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::error::NvmlError;

#[test]
fn gpu_lost_only_on_that_gpu() {
    let scenario = r#"
count = 4
[[faults]]
kind = "gpu_lost"
gpu = 2
at_s = 1.0
"#;
    let Some(_) = isolate("gpu_lost_only_on_that_gpu", scenario) else {
        return;
    };
    let nvml = nvml();
    let two = nvml.device_by_index(2).expect("not lost yet at the start");
    assert!(two.name().is_ok());
    let lost = eventually(5.0, || {
        matches!(two.power_usage(), Err(NvmlError::GpuLost)).then_some(())
    });
    assert!(lost.is_some(), "GPU 2 falls off the bus at 1 s");
    assert!(
        matches!(two.name(), Err(NvmlError::GpuLost)),
        "every call on it"
    );
    assert!(
        matches!(nvml.device_by_index(2), Err(NvmlError::GpuLost)),
        "and its handle lookup"
    );
    for i in [0, 1, 3] {
        let d = nvml.device_by_index(i).unwrap();
        assert!(
            d.power_usage().is_ok() && d.name().is_ok(),
            "GPU {i} is unaffected"
        );
    }
    assert_eq!(nvml.device_count().unwrap(), 4, "a lost GPU still counts");
}

#[test]
fn not_supported_on_named_functions() {
    let scenario = r#"
count = 2
[[faults]]
kind = "not_supported"
functions = ["nvmlDeviceGetTemperature", "nvmlDeviceGetMemoryInfo"]
gpu = 1
[[faults]]
kind = "not_supported"
functions = ["nvmlDeviceGetTotalEnergyConsumption"]
"#;
    let Some(_) = isolate("not_supported_on_named_functions", scenario) else {
        return;
    };
    let nvml = nvml();
    let (zero, one) = (
        nvml.device_by_index(0).unwrap(),
        nvml.device_by_index(1).unwrap(),
    );
    assert!(zero.temperature(TemperatureSensor::Gpu).is_ok());
    assert!(matches!(
        one.temperature(TemperatureSensor::Gpu),
        Err(NvmlError::NotSupported)
    ));
    assert!(zero.memory_info().is_ok());
    // The family name covers nvml-wrapper's nvmlDeviceGetMemoryInfo_v2.
    assert!(matches!(one.memory_info(), Err(NvmlError::NotSupported)));
    for d in [&zero, &one] {
        assert!(matches!(
            d.total_energy_consumption(),
            Err(NvmlError::NotSupported)
        ));
        assert!(d.power_usage().is_ok());
    }
}

#[test]
fn slow_calls_take_their_delay() {
    let scenario = r#"
count = 2
[[faults]]
kind = "slow"
functions = ["nvmlDeviceGetPowerUsage"]
delay_ms = 300
gpu = 0
"#;
    let Some(_) = isolate("slow_calls_take_their_delay", scenario) else {
        return;
    };
    let nvml = nvml();
    let (zero, one) = (
        nvml.device_by_index(0).unwrap(),
        nvml.device_by_index(1).unwrap(),
    );
    let t = Instant::now();
    zero.power_usage().unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    let t = Instant::now();
    one.power_usage().unwrap();
    zero.temperature(TemperatureSensor::Gpu).unwrap();
    assert!(
        t.elapsed() < Duration::from_millis(300),
        "only that function on that GPU: {:?}",
        t.elapsed()
    );
}

#[test]
fn no_permission_on_setters() {
    let scenario = r#"
count = 2
[[faults]]
kind = "no_permission"
"#;
    let Some(paths) = isolate("no_permission_on_setters", scenario) else {
        return;
    };
    let nvml = nvml();
    let mut d = nvml.device_by_index(1).unwrap();
    assert!(matches!(
        d.set_power_management_limit(300_000),
        Err(NvmlError::NoPermission)
    ));
    assert!(matches!(
        d.set_persistent(true),
        Err(NvmlError::NoPermission)
    ));
    assert!(matches!(
        d.reset_gpu_locked_clocks(),
        Err(NvmlError::NoPermission)
    ));
    assert_eq!(
        d.power_management_limit().unwrap(),
        700_000,
        "nothing changed"
    );
    let log = paths.log_lines();
    assert_eq!(log.len(), 3, "refused calls are logged too");
    assert_eq!(log[0]["value"], 300_000);
    assert!(log.iter().all(|l| l["result"] == 4));
}

#[test]
fn power_limit_zero_is_reported() {
    let scenario = r#"
count = 2
[[faults]]
kind = "power_limit_zero"
gpu = 1
"#;
    let Some(_) = isolate("power_limit_zero_is_reported", scenario) else {
        return;
    };
    let nvml = nvml();
    let one = nvml.device_by_index(1).unwrap();
    assert_eq!(one.power_management_limit().unwrap(), 0);
    assert_eq!(one.enforced_power_limit().unwrap(), 0);
    assert!(
        one.power_management_limit_constraints().unwrap().max_limit > 0,
        "constraints stay sane"
    );
    assert_eq!(
        nvml.device_by_index(0)
            .unwrap()
            .power_management_limit()
            .unwrap(),
        700_000
    );
}

#[test]
fn wild_readings_jump_the_counter_and_put_the_limit_outside_its_range() {
    let scenario = r#"
count = 3
[[faults]]
kind = "wild_readings"
gpu = 0
energy_offset_mj = 1000000000000000
power_limit_mw = 4294967295
[[faults]]
kind = "wild_readings"
gpu = 1
energy_offset_mj = -1000000000000000000
[[faults]]
kind = "wild_readings"
gpu = 2
at_s = 1.0
energy_offset_mj = 1000000000000000
"#;
    let Some(_) = isolate(
        "wild_readings_jump_the_counter_and_put_the_limit_outside_its_range",
        scenario,
    ) else {
        return;
    };
    let nvml = nvml();
    let zero = nvml.device_by_index(0).unwrap();
    assert_eq!(zero.power_management_limit().unwrap(), 4_294_967_295);
    assert_eq!(zero.enforced_power_limit().unwrap(), 4_294_967_295);
    let c = zero.power_management_limit_constraints().unwrap();
    assert_eq!(
        (c.min_limit, c.max_limit),
        (200_000, 700_000),
        "the range stays"
    );
    let e0 = zero.total_energy_consumption().unwrap();
    assert!(
        (1_000_000_000_000_000..1_000_000_100_000_000).contains(&e0),
        "{e0}"
    );
    // 1e18 mJ below a counter near zero: it wraps round 2^64.
    let e1 = nvml
        .device_by_index(1)
        .unwrap()
        .total_energy_consumption()
        .unwrap();
    assert!(e1 > u64::MAX - 1_000_000_000_000_000_000, "{e1}");
    // GPU 2 reads true until 1 s, then jumps.
    let two = nvml.device_by_index(2).unwrap();
    let before = two.total_energy_consumption().unwrap();
    assert!(before < 1_000_000_000, "{before}");
    assert_eq!(two.power_management_limit().unwrap(), 700_000);
    let jumped = eventually(5.0, || {
        let e = two.total_energy_consumption().unwrap();
        (e >= 1_000_000_000_000_000).then_some(e)
    });
    assert!(jumped.is_some(), "GPU 2's counter jumps at 1 s");
}

#[test]
fn bad_scenario_fails_init_with_a_located_message() {
    let scenario = "count = 2\n[training]\nmodel = \"resnet50\"\nbatchsize = 3\n";
    let check = |out: &std::process::Output| {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let line = stderr
            .lines()
            .find(|l| l.starts_with("fake-nvml:"))
            .expect("one fake-nvml line");
        assert!(line.contains("scenario.toml:4:1:"), "{line}");
        assert!(line.contains("batchsize"), "{line}");
    };
    let Some(_) = isolate_with(
        "bad_scenario_fails_init_with_a_located_message",
        scenario,
        check,
    ) else {
        return;
    };
    let lib = common::lib();
    let Err(err) = Nvml::builder().lib_path(lib.as_os_str()).init() else {
        panic!("init must fail on a bad scenario");
    };
    assert!(matches!(err, NvmlError::Unknown), "{err:?}");
}
