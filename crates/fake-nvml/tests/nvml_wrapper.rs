//! The fake library through nvml-wrapper 0.13, the binding gpupilot uses: reads, setters, and
//! two processes sharing one node.

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use common::{eventually, isolate, nvml};
use nvml_wrapper::enum_wrappers::device::{
    Clock, PcieUtilCounter, TemperatureSensor, TemperatureThreshold,
};
use nvml_wrapper::enums::device::{GpuLockedClocksSetting, UsedGpuMemory};
use nvml_wrapper::error::NvmlError;

const H100: &str = "h100-sxm";

const TRAINING_4XH100: &str = r#"
count = 4
model = "h100-sxm"
[training]
model = "resnet50"
batch_size = 256
prefetch_depth = 2
workers = 8
"#;

fn spec() -> &'static gpusim::GpuSpec {
    gpusim::find(H100).unwrap()
}

#[test]
fn reads_every_metric() {
    let Some(_) = isolate("reads_every_metric", TRAINING_4XH100) else {
        return;
    };
    let nvml = nvml();
    let s = spec();
    assert_eq!(nvml.device_count().unwrap(), 4);
    assert_eq!(nvml.sys_driver_version().unwrap(), "550.54.15");
    assert_eq!(nvml.sys_cuda_driver_version().unwrap(), 12040);
    assert_eq!(nvml.sys_nvml_version().unwrap(), "12.550.54.15");

    let mut uuids = Vec::new();
    for i in 0..4 {
        let d = nvml.device_by_index(i).unwrap();
        assert_eq!(d.index().unwrap(), i);
        assert_eq!(d.name().unwrap(), s.name);
        let uuid = d.uuid().unwrap();
        assert!(uuid.starts_with("GPU-") && uuid.len() == 40, "{uuid}");
        uuids.push(uuid.clone());
        assert_eq!(
            nvml.device_by_uuid(uuid.as_str()).unwrap().index().unwrap(),
            i
        );
        let pci = d.pci_info().unwrap();
        assert_eq!(
            nvml.device_by_pci_bus_id(pci.bus_id.as_str())
                .unwrap()
                .index()
                .unwrap(),
            i
        );
        assert_eq!(pci.pci_device_id, 0x2330_10de);

        let mem = d.memory_info().unwrap();
        assert_eq!(mem.total, s.memory_bytes);
        assert_eq!(mem.used + mem.free, mem.total);
        assert!(
            mem.used > 1 << 30,
            "resnet50 at batch 256 holds GiBs: {}",
            mem.used
        );

        assert_eq!(
            d.temperature_threshold(TemperatureThreshold::Slowdown)
                .unwrap(),
            s.slowdown_c as u32
        );
        assert_eq!(
            d.temperature_threshold(TemperatureThreshold::Shutdown)
                .unwrap(),
            s.shutdown_c as u32
        );
        assert_eq!(
            d.temperature_threshold(TemperatureThreshold::GpuMax)
                .unwrap(),
            s.gpu_max_operating_c as u32
        );
        let t = d.temperature(TemperatureSensor::Gpu).unwrap();
        assert!((20..=s.shutdown_c as u32).contains(&t), "temperature {t}");

        let limit = d.power_management_limit().unwrap();
        assert_eq!(limit, (s.power_default_w * 1000.0) as u32, "milliwatts");
        assert_eq!(d.enforced_power_limit().unwrap(), limit);
        assert_eq!(d.power_management_limit_default().unwrap(), limit);
        let c = d.power_management_limit_constraints().unwrap();
        assert_eq!(
            (c.min_limit, c.max_limit),
            (
                (s.power_min_w * 1000.0) as u32,
                (s.power_max_w * 1000.0) as u32
            )
        );
        let p = d.power_usage().unwrap();
        assert!(p > (s.idle_w * 1000.0) as u32 && p <= limit, "power {p} mW");

        let sm = d.clock_info(Clock::SM).unwrap();
        assert!(
            (s.sm_clock_min_mhz..=s.sm_clock_max_mhz).contains(&sm),
            "sm {sm}"
        );
        assert_eq!(d.clock_info(Clock::Memory).unwrap(), s.mem_clock_mhz);
        assert_eq!(d.max_clock_info(Clock::SM).unwrap(), s.sm_clock_max_mhz);
        assert_eq!(
            d.max_clock_info(Clock::Graphics).unwrap(),
            s.sm_clock_max_mhz
        );

        let util = d.utilization_rates().unwrap();
        assert!(util.gpu > 50 && util.gpu <= 100, "util {}", util.gpu);
        let reasons = d.current_throttle_reasons_strict().unwrap();
        assert!(!reasons.contains(nvml_wrapper::bitmasks::device::ThrottleReasons::GPU_IDLE));
        assert!(
            matches!(d.fan_speed(0), Err(NvmlError::NotSupported)),
            "SXM boards have no fan"
        );
        assert_eq!(d.current_pcie_link_gen().unwrap(), s.pcie_gen);
        assert_eq!(d.max_pcie_link_width().unwrap(), s.pcie_width);
        assert!(
            d.pcie_throughput(PcieUtilCounter::Receive).unwrap() > 0,
            "the data loader feeds the GPU"
        );
        assert_eq!(d.architecture().unwrap().to_string(), "Hopper");
        let cc = d.cuda_compute_capability().unwrap();
        assert_eq!((cc.major, cc.minor), (9, 0));

        let procs = d.running_compute_processes().unwrap();
        assert_eq!(procs.len(), 1);
        assert_eq!(procs[0].pid, 4_200_000 + i);
        assert_eq!(procs[0].used_gpu_memory, UsedGpuMemory::Used(mem.used));
        assert!(d.running_graphics_processes().unwrap().is_empty());
        assert_eq!(nvml.sys_process_name(procs[0].pid, 64).unwrap(), "python3");
    }
    uuids.sort();
    uuids.dedup();
    assert_eq!(uuids.len(), 4, "UUIDs are unique");

    // Energy is a counter of millijoules that grows with wall time.
    let d = nvml.device_by_index(0).unwrap();
    let e0 = d.total_energy_consumption().unwrap();
    let e1 = eventually(5.0, || {
        Some(d.total_energy_consumption().unwrap()).filter(|e| *e > e0)
    })
    .expect("energy grows");
    assert!(e1 > e0);
}

#[test]
fn set_power_limit_reads_back_and_lowers_the_clock() {
    let Some(paths) = isolate(
        "set_power_limit_reads_back_and_lowers_the_clock",
        TRAINING_4XH100,
    ) else {
        return;
    };
    let nvml = nvml();
    let mut d = nvml.device_by_index(1).unwrap();
    // Let the job start so the clock reflects the load.
    eventually(5.0, || {
        (d.utilization_rates().unwrap().gpu > 0).then_some(())
    })
    .unwrap();
    let before = d.clock_info(Clock::SM).unwrap();

    d.set_power_management_limit(250_123).unwrap();
    assert_eq!(
        d.power_management_limit().unwrap(),
        250_123,
        "the exact milliwatts, back"
    );
    assert_eq!(d.enforced_power_limit().unwrap(), 250_123);
    let after = eventually(5.0, || {
        Some(d.clock_info(Clock::SM).unwrap()).filter(|c| *c < before)
    })
    .unwrap_or_else(|| panic!("a 250 W cap lowers the clock from {before} MHz"));
    assert!(after < before);
    let reasons = d.current_throttle_reasons().unwrap();
    assert!(
        reasons.contains(nvml_wrapper::bitmasks::device::ThrottleReasons::SW_POWER_CAP),
        "{reasons:?}"
    );
    assert!(
        d.power_usage().unwrap() <= 250_123 + 1_000,
        "power follows the cap"
    );

    // Other GPUs keep their limit.
    assert_eq!(
        nvml.device_by_index(0)
            .unwrap()
            .power_management_limit()
            .unwrap(),
        700_000
    );

    let log = paths.log_lines();
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0]["function"], "nvmlDeviceSetPowerManagementLimit");
    assert_eq!(log[0]["gpu"], 1);
    assert_eq!(log[0]["value"], 250_123);
    assert_eq!(log[0]["result"], 0);
    assert_eq!(log[0]["pid"], std::process::id());
}

#[test]
fn out_of_range_power_limit_is_refused_and_logged() {
    let Some(paths) = isolate(
        "out_of_range_power_limit_is_refused_and_logged",
        TRAINING_4XH100,
    ) else {
        return;
    };
    let nvml = nvml();
    let mut d = nvml.device_by_index(0).unwrap();
    assert!(matches!(
        d.set_power_management_limit(199_999),
        Err(NvmlError::InvalidArg)
    ));
    assert!(matches!(
        d.set_power_management_limit(700_001),
        Err(NvmlError::InvalidArg)
    ));
    assert_eq!(d.power_management_limit().unwrap(), 700_000, "unchanged");
    // The bounds themselves are valid.
    d.set_power_management_limit(200_000).unwrap();
    d.set_power_management_limit(700_000).unwrap();
    let got: Vec<(u64, u64)> = paths
        .log_lines()
        .iter()
        .map(|l| (l["value"].as_u64().unwrap(), l["result"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        got,
        [(199_999, 2), (700_001, 2), (200_000, 0), (700_000, 0)]
    );
}

#[test]
fn locked_clocks_persistence_and_thresholds() {
    let Some(paths) = isolate("locked_clocks_persistence_and_thresholds", TRAINING_4XH100) else {
        return;
    };
    let nvml = nvml();
    let mut d = nvml.device_by_index(2).unwrap();
    eventually(5.0, || {
        (d.utilization_rates().unwrap().gpu > 0).then_some(())
    })
    .unwrap();

    d.set_gpu_locked_clocks(GpuLockedClocksSetting::Numeric {
        min_clock_mhz: 900,
        max_clock_mhz: 1200,
    })
    .unwrap();
    eventually(5.0, || {
        (d.clock_info(Clock::SM).unwrap() <= 1200).then_some(())
    })
    .expect("clock within the lock");
    assert!(matches!(
        d.set_gpu_locked_clocks(GpuLockedClocksSetting::Numeric {
            min_clock_mhz: 1200,
            max_clock_mhz: 900
        }),
        Err(NvmlError::InvalidArg)
    ));
    d.reset_gpu_locked_clocks().unwrap();
    eventually(5.0, || {
        (d.clock_info(Clock::SM).unwrap() > 1200).then_some(())
    })
    .expect("clock free again");

    assert!(!d.is_in_persistent_mode().unwrap());
    d.set_persistent(true).unwrap();
    assert!(d.is_in_persistent_mode().unwrap());

    d.set_temperature_threshold(TemperatureThreshold::GpuMax, 80)
        .unwrap();
    assert_eq!(
        d.temperature_threshold(TemperatureThreshold::GpuMax)
            .unwrap(),
        80
    );
    assert!(matches!(
        d.set_temperature_threshold(TemperatureThreshold::GpuMax, 200),
        Err(NvmlError::InvalidArg)
    ));

    let functions: Vec<String> = paths
        .log_lines()
        .iter()
        .map(|l| format!("{} {}", l["function"].as_str().unwrap(), l["value"]))
        .collect();
    assert_eq!(
        functions,
        [
            "nvmlDeviceSetGpuLockedClocks [900,1200]",
            "nvmlDeviceSetGpuLockedClocks [1200,900]",
            "nvmlDeviceResetGpuLockedClocks null",
            "nvmlDeviceSetPersistenceMode 1",
            "nvmlDeviceSetTemperatureThreshold [3,80]",
            "nvmlDeviceSetTemperatureThreshold [3,200]",
        ]
    );
}

/// Two processes on one node: each sees the other's power-limit change without re-initialising.
#[test]
fn two_processes_see_each_others_changes() {
    let Some(paths) = isolate("two_processes_see_each_others_changes", TRAINING_4XH100) else {
        return;
    };
    let nvml = nvml();
    let mut mine = nvml.device_by_index(0).unwrap();
    let mut other = paths
        .helper("helper_watch_limit")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(other.stdout.take().unwrap())
        .lines()
        .map(|l| l.unwrap());
    let mut expect = |prefix: &str| -> String {
        let line = lines
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("helper never said {prefix}"));
        line[prefix.len()..].trim().to_string()
    };
    assert_eq!(expect("READY"), "700000");

    mine.set_power_management_limit(350_000).unwrap();
    assert_eq!(
        expect("SEEN"),
        "350000",
        "the helper saw this process's change"
    );

    // The helper then capped GPU 3; this process sees it on its next read.
    assert_eq!(expect("SET"), "400000");
    let three = nvml.device_by_index(3).unwrap();
    assert_eq!(three.power_management_limit().unwrap(), 400_000);
    assert!(other.wait().unwrap().success());

    let pids: Vec<u64> = paths
        .log_lines()
        .iter()
        .map(|l| l["pid"].as_u64().unwrap())
        .collect();
    assert_eq!(pids.len(), 2);
    assert_ne!(pids[0], pids[1], "both processes logged their setter");
}

#[test]
#[ignore = "helper: run by two_processes_see_each_others_changes"]
fn helper_watch_limit() {
    if std::env::var("FAKE_NVML_TEST_CHILD").as_deref() != Ok("helper_watch_limit") {
        return;
    }
    let nvml = nvml();
    let d = nvml.device_by_index(0).unwrap();
    let first = d.power_management_limit().unwrap();
    println!("READY {first}");
    let seen = eventually(10.0, || {
        Some(d.power_management_limit().unwrap()).filter(|l| *l != first)
    });
    println!("SEEN {}", seen.expect("the other process's change arrives"));
    nvml.device_by_index(3)
        .unwrap()
        .set_power_management_limit(400_000)
        .unwrap();
    println!("SET 400000");
}

/// A scenario's own processes, with a real pid (the parent test process, alive meanwhile), appear
/// in the lists.
#[test]
fn scenario_processes() {
    let in_child = std::env::var("FAKE_NVML_TEST_CHILD").is_ok();
    let real_pid = if in_child {
        std::os::unix::process::parent_id()
    } else {
        std::process::id()
    };
    let scenario = format!(
        r#"
count = 2
[training]
model = "resnet50"
[[processes]]
gpu = 1
pid = {pid}
name = "train.py"
used_memory_mib = 1024
[[processes]]
gpu = 1
pid = 77
kind = "graphics"
"#,
        pid = real_pid
    );
    let Some(_) = isolate("scenario_processes", &scenario) else {
        return;
    };
    let nvml = nvml();
    assert!(
        nvml.device_by_index(0)
            .unwrap()
            .running_compute_processes()
            .unwrap()
            .is_empty()
    );
    let d = nvml.device_by_index(1).unwrap();
    let compute = d.running_compute_processes().unwrap();
    assert_eq!(compute.len(), 1);
    assert_eq!(compute[0].pid, real_pid);
    assert_eq!(compute[0].used_gpu_memory, UsedGpuMemory::Used(1 << 30));
    let graphics = d.running_graphics_processes().unwrap();
    assert_eq!(graphics.iter().map(|p| p.pid).collect::<Vec<_>>(), [77]);
    assert_eq!(nvml.sys_process_name(real_pid, 64).unwrap(), "train.py");
    assert!(matches!(
        nvml.sys_process_name(12345, 64),
        Err(NvmlError::NotFound)
    ));
}

/// Idle GPUs and another catalog part.
#[test]
fn idle_gpus_and_other_parts() {
    let scenario = r#"
gpus = ["rtx-4090", "a100-sxm-80gb"]
ambient_c = 30.0
"#;
    let Some(_) = isolate("idle_gpus_and_other_parts", scenario) else {
        return;
    };
    let nvml = nvml();
    let rtx = nvml.device_by_index(0).unwrap();
    assert_eq!(rtx.name().unwrap(), gpusim::find("rtx-4090").unwrap().name);
    assert!(rtx.fan_speed(0).unwrap() <= 100, "the 4090 has a fan");
    assert_eq!(rtx.num_fans().unwrap(), 1);
    let a100 = nvml.device_by_index(1).unwrap();
    assert_eq!(
        a100.name().unwrap(),
        gpusim::find("a100-sxm-80gb").unwrap().name
    );
    assert_eq!(a100.architecture().unwrap().to_string(), "Ampere");
    for d in [&rtx, &a100] {
        assert!(
            d.running_compute_processes().unwrap().is_empty(),
            "idle GPUs run nothing"
        );
        eventually(5.0, || {
            (d.utilization_rates().unwrap().gpu == 0).then_some(())
        })
        .unwrap();
        let reasons = d.current_throttle_reasons().unwrap();
        assert!(
            reasons.contains(nvml_wrapper::bitmasks::device::ThrottleReasons::GPU_IDLE),
            "{reasons:?}"
        );
        assert_eq!(
            d.current_pcie_link_gen().unwrap(),
            1,
            "idle links train down"
        );
    }
}

#[test]
fn ecc_errors_from_the_scenario() {
    use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
    let scenario = r#"
gpus = ["h100-sxm", "h100-sxm", "rtx-4090"]
[[per_gpu]]
gpu = 1
ecc_corrected = 7
ecc_uncorrected = 2
"#;
    let Some(_) = isolate("ecc_errors_from_the_scenario", scenario) else {
        return;
    };
    let nvml = nvml();
    let count = |i: u32, e: MemoryError, c: EccCounter| {
        nvml.device_by_index(i).unwrap().total_ecc_errors(e, c)
    };
    assert_eq!(
        count(0, MemoryError::Uncorrected, EccCounter::Volatile).unwrap(),
        0
    );
    assert_eq!(
        count(1, MemoryError::Corrected, EccCounter::Volatile).unwrap(),
        7
    );
    assert_eq!(
        count(1, MemoryError::Uncorrected, EccCounter::Aggregate).unwrap(),
        2
    );
    assert!(matches!(
        count(2, MemoryError::Uncorrected, EccCounter::Volatile),
        Err(NvmlError::NotSupported)
    ));
}

#[test]
fn row_remaps_degraded_links_and_replays_from_the_scenario() {
    use nvml_wrapper::structs::device::FieldId;
    let scenario = r#"
gpus = ["h100-sxm", "h100-sxm", "v100-sxm2", "rtx-4090"]
[training]
model = "resnet50"
[[per_gpu]]
gpu = 1
remapped_correctable = 3
remapped_uncorrectable = 1
remap_pending = true
pcie_link_gen = 4
pcie_link_width = 8
pcie_replays_per_min = 600.0
"#;
    let Some(_) = isolate(
        "row_remaps_degraded_links_and_replays_from_the_scenario",
        scenario,
    ) else {
        return;
    };
    let nvml = nvml();
    // Memory temperature, the replay counter, and the four remap fields, in one call.
    let ids = [82, 94, 142, 143, 144, 145].map(FieldId);
    let fields = |i: u32| -> Vec<Option<u64>> {
        let d = nvml.device_by_index(i).unwrap();
        d.field_values_for(&ids)
            .unwrap()
            .into_iter()
            .map(|s| match s.unwrap().value {
                Ok(nvml_wrapper::enums::device::SampleValue::U32(v)) => Some(u64::from(v)),
                Ok(other) => panic!("unexpected value type {other:?}"),
                Err(NvmlError::NotSupported) => None,
                Err(e) => panic!("field error {e:?}"),
            })
            .collect()
    };
    let healthy = fields(0);
    assert!(
        healthy[0].is_some_and(|t| (20..120).contains(&t)),
        "{healthy:?}"
    );
    assert_eq!(healthy[2..], [Some(0), Some(0), Some(0), Some(0)]);
    let sick = fields(1);
    assert_eq!(sick[2..], [Some(3), Some(1), Some(1), Some(0)]);
    // The replay counter climbs with simulated time (10 a second here).
    let d1 = nvml.device_by_index(1).unwrap();
    let first = d1.pcie_replay_counter().unwrap();
    eventually(10.0, || {
        (d1.pcie_replay_counter().unwrap() > first).then_some(())
    })
    .expect("the replay counter climbs");
    assert_eq!(
        nvml.device_by_index(0)
            .unwrap()
            .pcie_replay_counter()
            .unwrap(),
        0
    );
    // The degraded link while it works; the board's best on the healthy GPU.
    eventually(10.0, || {
        (d1.current_pcie_link_gen().unwrap() == 4).then_some(())
    })
    .expect("a working GPU's link runs at its trained generation");
    assert_eq!(d1.current_pcie_link_width().unwrap(), 8);
    assert_eq!(d1.max_pcie_link_gen().unwrap(), 5);
    assert_eq!(d1.max_pcie_link_width().unwrap(), 16);
    assert_eq!(
        nvml.device_by_index(0)
            .unwrap()
            .current_pcie_link_width()
            .unwrap(),
        16
    );
    // Volta retires pages instead of remapping rows; a GeForce board has neither, nor a
    // memory temperature.
    assert_eq!(fields(2)[2..], [None, None, None, None]);
    let consumer = fields(3);
    assert_eq!(consumer[0], None);
    assert_eq!(consumer[2..], [None, None, None, None]);
}

#[test]
fn retired_pages_on_volta_from_the_scenario() {
    use nvml_wrapper::enum_wrappers::device::RetirementCause;
    let scenario = r#"
gpus = ["v100-sxm2", "v100-sxm2", "a100-sxm-80gb", "rtx-4090"]
[[per_gpu]]
gpu = 1
retired_pages_sbe = 3
retired_pages_dbe = 2
retired_pages_pending = true
"#;
    let Some(_) = isolate("retired_pages_on_volta_from_the_scenario", scenario) else {
        return;
    };
    let nvml = nvml();
    let pages = |i: u32, cause: RetirementCause| {
        nvml.device_by_index(i)
            .unwrap()
            .retired_pages(cause)
            .map(|p| p.iter().map(|p| p.address).collect::<Vec<_>>())
    };
    let pending = |i: u32| nvml.device_by_index(i).unwrap().are_pages_pending_retired();
    // A healthy V100: none, and nothing pending.
    assert!(
        pages(0, RetirementCause::DoubleBitEccError)
            .unwrap()
            .is_empty()
    );
    assert!(!pending(0).unwrap());
    // The count query, then the addresses (nvml-wrapper's two calls), per cause.
    let sbe = pages(1, RetirementCause::MultipleSingleBitEccErrors).unwrap();
    let dbe = pages(1, RetirementCause::DoubleBitEccError).unwrap();
    assert_eq!(sbe.len(), 3);
    assert_eq!(dbe.len(), 2);
    assert!(sbe.iter().all(|a| !dbe.contains(a)), "{sbe:?} {dbe:?}");
    assert!(pending(1).unwrap());
    // A100 remaps rows instead, a GeForce board has neither: NOT_SUPPORTED, not zero.
    for i in [2, 3] {
        assert!(matches!(
            pages(i, RetirementCause::DoubleBitEccError),
            Err(NvmlError::NotSupported)
        ));
        assert!(matches!(pending(i), Err(NvmlError::NotSupported)));
    }
}

#[test]
fn xid_events_arrive_on_an_event_set_and_a_gpu_without_events_says_so() {
    // GPU 0: XID 31 every 0.3 s from the start; GPU 1: one XID 79 at 0.5 s; GPU 2: no events.
    let Some(_) = isolate(
        "xid_events_arrive_on_an_event_set_and_a_gpu_without_events_says_so",
        r#"
count = 3
model = "h100-sxm"
[[faults]]
kind = "xid"
gpu = 0
xid = 31
every_s = 0.3
[[faults]]
kind = "xid"
gpu = 1
xid = 79
at_s = 0.5
[[faults]]
kind = "not_supported"
gpu = 2
functions = ["nvmlDeviceRegisterEvents"]
"#,
    ) else {
        return;
    };
    use nvml_wrapper::bitmasks::event::EventTypes;
    use nvml_wrapper::enums::event::XidError;
    let nvml = nvml();
    let d0 = nvml.device_by_index(0).unwrap();
    let d1 = nvml.device_by_index(1).unwrap();
    let d2 = nvml.device_by_index(2).unwrap();
    let types = d0.supported_event_types().unwrap();
    assert!(types.contains(EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR));
    assert!(matches!(
        d2.supported_event_types(),
        Err(NvmlError::NotSupported)
    ));
    let set = nvml.create_event_set().unwrap();
    let set = d0
        .register_events(EventTypes::CRITICAL_XID_ERROR, set)
        .unwrap();
    let set = d1
        .register_events(
            EventTypes::CRITICAL_XID_ERROR | EventTypes::SINGLE_BIT_ECC_ERROR,
            set,
        )
        .unwrap();
    let mut seen = Vec::new();
    let start = std::time::Instant::now();
    while start.elapsed().as_secs_f64() < 5.0 && !seen.contains(&(1, 79)) {
        match set.wait(200) {
            Ok(e) => {
                assert!(e.event_type.contains(EventTypes::CRITICAL_XID_ERROR));
                let Some(XidError::Value(x)) = e.event_data else {
                    panic!("{e:?}")
                };
                seen.push((e.device.index().unwrap(), x));
            }
            Err(NvmlError::Timeout) => {}
            Err(e) => panic!("{e}"),
        }
    }
    assert!(seen.contains(&(1, 79)), "{seen:?}");
    assert!(
        seen.iter().filter(|s| **s == (0, 31)).count() >= 1,
        "{seen:?}"
    );
    // One-off: 79 comes once; a wait with nothing due times out.
    let quiet = std::time::Instant::now();
    loop {
        match set.wait(100) {
            Ok(e) => assert_ne!(e.device.index().unwrap(), 1, "79 came twice"),
            Err(NvmlError::Timeout) => break,
            Err(e) => panic!("{e}"),
        }
        assert!(quiet.elapsed().as_secs() < 5);
        // GPU 0 repeats every 0.3 s; drop it to see the timeout.
        if quiet.elapsed().as_millis() > 1000 {
            break;
        }
    }
    set.release_events().unwrap();
    // A GPU whose events are off refuses registration.
    let set = nvml.create_event_set().unwrap();
    assert!(
        d2.register_events(EventTypes::CRITICAL_XID_ERROR, set)
            .is_err()
    );
}

#[test]
fn nvlink_and_topology_of_an_hgx_board() {
    use nvml_wrapper::enum_wrappers::device::TopologyLevel;
    use nvml_wrapper::structs::device::FieldId;
    let scenario = r#"
gpus = ["h100-sxm", "h100-sxm", "h100-sxm", "h100-sxm", "h100-sxm", "h100-sxm", "h100-sxm", "rtx-4090"]
[training]
model = "bert-large"
batch_size = 32
[topology]
[[faults]]
kind = "nvlink_down"
gpu = 3
link = 5
"#;
    let Some(_) = isolate("nvlink_and_topology_of_an_hgx_board", scenario) else {
        return;
    };
    let nvml = nvml();
    let d0 = nvml.device_by_index(0).unwrap();
    let d3 = nvml.device_by_index(3).unwrap();
    let l = d0.link_wrapper_for(4);
    assert!(l.is_active().unwrap());
    assert_eq!(l.version().unwrap(), 6, "NVML_NVLINK_VERSION_4_0");
    assert_eq!(l.remote_pci_info().unwrap().bus_id, "00000000:05:00.0");
    assert_eq!(
        d0.link_wrapper_for(17).remote_pci_info().unwrap().bus_id,
        "00000000:08:00.0"
    );
    assert!(!d3.link_wrapper_for(5).is_active().unwrap());
    assert!(matches!(
        d0.link_wrapper_for(18).is_active(),
        Err(NvmlError::InvalidArg)
    ));
    // The RTX 4090 has no NVLink.
    let d7 = nvml.device_by_index(7).unwrap();
    assert!(matches!(
        d7.link_wrapper_for(0).is_active(),
        Err(NvmlError::NotSupported)
    ));

    // Link count and throughput as field values (nvml-wrapper leaves scopeId 0: link 0).
    let read = |d: &nvml_wrapper::Device<'_>| -> Vec<Option<u64>> {
        d.field_values_for(&[FieldId(91), FieldId(138), FieldId(139), FieldId(140)])
            .unwrap()
            .into_iter()
            .map(|s| match s.unwrap().value {
                Ok(nvml_wrapper::enums::device::SampleValue::U32(v)) => Some(u64::from(v)),
                Ok(nvml_wrapper::enums::device::SampleValue::U64(v)) => Some(v),
                Ok(other) => panic!("unexpected value type {other:?}"),
                Err(NvmlError::NotSupported) => None,
                Err(e) => panic!("field error {e:?}"),
            })
            .collect()
    };
    let first = read(&d0);
    assert_eq!(first[0], Some(18));
    std::thread::sleep(std::time::Duration::from_millis(300));
    let later = read(&d0);
    assert!(
        later[1] > first[1],
        "TX climbs with training: {first:?} {later:?}"
    );
    assert_eq!(later[1], later[2], "the all-reduce receives what it sends");
    assert!(later[3] > later[1], "RAW adds protocol overhead");
    assert_eq!(read(&d7), [None, None, None, None]);

    // PCIe: pairs under a switch, halves on two sockets; CPU and NUMA affinity.
    let level = |a: &nvml_wrapper::Device<'_>, b: u32| {
        a.topology_common_ancestor(nvml.device_by_index(b).unwrap())
            .unwrap()
    };
    assert_eq!(level(&d0, 1), TopologyLevel::Single);
    assert_eq!(level(&d0, 2), TopologyLevel::Node);
    assert_eq!(level(&d3, 4), TopologyLevel::System);
    let near: Vec<u32> = d0
        .topology_nearest_gpus(TopologyLevel::Node)
        .unwrap()
        .iter()
        .map(|d| d.index().unwrap())
        .collect();
    assert_eq!(near, [1, 2, 3]);
    assert_eq!(d0.cpu_affinity(2).unwrap(), [(1 << 56) - 1, 0]);
    let d5 = nvml.device_by_index(5).unwrap();
    assert_eq!(
        d5.cpu_affinity(2).unwrap(),
        [!((1 << 56) - 1), (1 << 48) - 1]
    );
    assert_eq!(d5.numa_node_id().unwrap(), 1);
}

#[test]
fn without_topology_nvlink_and_topology_are_not_supported() {
    let Some(_) = isolate(
        "without_topology_nvlink_and_topology_are_not_supported",
        TRAINING_4XH100,
    ) else {
        return;
    };
    let nvml = nvml();
    let d0 = nvml.device_by_index(0).unwrap();
    assert!(matches!(
        d0.link_wrapper_for(0).is_active(),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(
        d0.topology_common_ancestor(nvml.device_by_index(1).unwrap()),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(d0.numa_node_id(), Err(NvmlError::NotSupported)));
}
