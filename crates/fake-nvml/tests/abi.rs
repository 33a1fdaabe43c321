//! The C ABI itself, called raw (what nvml-wrapper cannot express): calls before init, null
//! pointers, foreign handles, init refcounting, error strings, and the exported symbol table.

mod common;

use std::ffi::{CStr, c_char, c_uint};
use std::process::Command;

use common::{isolate, lib};
use libloading::{Library, Symbol};
use nvidia_ml::symbols::EXPORTED;

type Device = *mut std::ffi::c_void;
type Ret = c_uint;

struct Api {
    lib: Library,
}

impl Api {
    fn load() -> Api {
        // SAFETY: loading our own library; its initialisers do nothing.
        Api {
            lib: unsafe { Library::new(lib()).unwrap() },
        }
    }

    fn sym<T>(&self, name: &str) -> Symbol<'_, T> {
        // SAFETY: each call site names the nvml.h signature of the symbol.
        unsafe {
            self.lib
                .get(name.as_bytes())
                .unwrap_or_else(|e| panic!("{name}: {e}"))
        }
    }

    fn init(&self) -> Ret {
        unsafe { self.sym::<unsafe extern "C" fn() -> Ret>("nvmlInit_v2")() }
    }

    fn shutdown(&self) -> Ret {
        unsafe { self.sym::<unsafe extern "C" fn() -> Ret>("nvmlShutdown")() }
    }

    fn count(&self, out: *mut c_uint) -> Ret {
        unsafe {
            self.sym::<unsafe extern "C" fn(*mut c_uint) -> Ret>("nvmlDeviceGetCount_v2")(out)
        }
    }

    fn handle(&self, i: c_uint) -> (Ret, Device) {
        let mut d: Device = std::ptr::null_mut();
        let f = self.sym::<unsafe extern "C" fn(c_uint, *mut Device) -> Ret>(
            "nvmlDeviceGetHandleByIndex_v2",
        );
        (unsafe { f(i, &mut d) }, d)
    }

    fn power(&self, d: Device, out: *mut c_uint) -> Ret {
        unsafe {
            self.sym::<unsafe extern "C" fn(Device, *mut c_uint) -> Ret>("nvmlDeviceGetPowerUsage")(
                d, out,
            )
        }
    }

    fn name(&self, d: Device, buf: &mut [u8]) -> Ret {
        let f = self
            .sym::<unsafe extern "C" fn(Device, *mut c_char, c_uint) -> Ret>("nvmlDeviceGetName");
        unsafe { f(d, buf.as_mut_ptr().cast(), buf.len() as c_uint) }
    }

    fn error_string(&self, r: Ret) -> String {
        let f = self.sym::<unsafe extern "C" fn(Ret) -> *const c_char>("nvmlErrorString");
        unsafe { CStr::from_ptr(f(r)) }
            .to_str()
            .unwrap()
            .to_string()
    }
}

#[test]
fn contract_of_every_call() {
    let Some(_) = isolate("contract_of_every_call", "count = 2\n") else {
        return;
    };
    let api = Api::load();
    let mut n: c_uint = 0;
    assert_eq!(api.count(&mut n), 1, "UNINITIALIZED before init");
    assert_eq!(api.shutdown(), 1, "shutdown without init");
    assert_eq!(
        api.error_string(15),
        "GPU is lost",
        "error strings work without init"
    );
    assert_eq!(api.error_string(999), "Unknown Error");
    assert_eq!(api.error_string(12345), "Unknown Error");

    // Nested init: the library stays up until the last shutdown.
    assert_eq!(api.init(), 0);
    assert_eq!(api.init(), 0);
    assert_eq!(api.count(&mut n), 0);
    assert_eq!(n, 2);
    assert_eq!(
        api.count(std::ptr::null_mut()),
        2,
        "INVALID_ARGUMENT for a null output"
    );

    let (r0, h0) = api.handle(0);
    let (r1, h0_again) = api.handle(0);
    let (_, h1) = api.handle(1);
    assert_eq!((r0, r1), (0, 0));
    assert_eq!(h0, h0_again, "handles are stable");
    assert_ne!(h0, h1);
    assert_eq!(api.handle(2).0, 2, "index past the end");

    let mut mw: c_uint = 0;
    assert_eq!(api.power(h0, &mut mw), 0);
    assert!(mw > 0);
    assert_eq!(api.power(h0, std::ptr::null_mut()), 2);
    let mut junk = 0u64;
    assert_eq!(
        api.power((&raw mut junk).cast(), &mut mw),
        2,
        "a handle we never issued"
    );
    assert_eq!(api.power(std::ptr::null_mut(), &mut mw), 2);

    let mut small = [0u8; 4];
    assert_eq!(api.name(h0, &mut small), 7, "INSUFFICIENT_SIZE");
    let mut buf = [0u8; 96];
    assert_eq!(api.name(h0, &mut buf), 0);
    let name = CStr::from_bytes_until_nul(&buf).unwrap().to_str().unwrap();
    // `count` without `model`: the default node's part.
    let default_part = gpusim::find(&gpusim::NodeConfig::default().gpus[0]).unwrap();
    assert_eq!(name, default_part.name);

    assert_eq!(api.shutdown(), 0);
    assert_eq!(
        api.power(h0, &mut mw),
        0,
        "still up after the inner shutdown"
    );
    assert_eq!(api.shutdown(), 0);
    assert_eq!(
        api.power(h0, &mut mw),
        1,
        "UNINITIALIZED after the last shutdown"
    );
    assert_eq!(api.shutdown(), 1);
    // And it comes back.
    assert_eq!(api.init(), 0);
    assert_eq!(api.power(h0, &mut mw), 0);
    assert_eq!(api.shutdown(), 0);
}

/// The versioned structs check their version field, as the real library does.
#[test]
fn versioned_structs() {
    let Some(_) = isolate("versioned_structs", "count = 1\n") else {
        return;
    };
    #[repr(C)]
    struct MemoryV2 {
        version: c_uint,
        total: u64,
        reserved: u64,
        free: u64,
        used: u64,
    }
    #[repr(C)]
    struct TemperatureV1 {
        version: c_uint,
        sensor: c_uint,
        temperature: i32,
    }
    let api = Api::load();
    assert_eq!(api.init(), 0);
    let (_, h) = api.handle(0);
    let mem =
        api.sym::<unsafe extern "C" fn(Device, *mut MemoryV2) -> Ret>("nvmlDeviceGetMemoryInfo_v2");
    let mut m = MemoryV2 {
        version: (40 | (2 << 24)),
        total: 0,
        reserved: 0,
        free: 0,
        used: 0,
    };
    assert_eq!(unsafe { mem(h, &mut m) }, 0);
    assert_eq!(m.total, gpusim::find("h100-sxm").unwrap().memory_bytes);
    assert_eq!(m.used + m.free + m.reserved, m.total);
    m.version = 1;
    assert_eq!(unsafe { mem(h, &mut m) }, 25, "ARGUMENT_VERSION_MISMATCH");

    let temp = api.sym::<unsafe extern "C" fn(Device, *mut TemperatureV1) -> Ret>(
        "nvmlDeviceGetTemperatureV",
    );
    let mut t = TemperatureV1 {
        version: 12 | (1 << 24),
        sensor: 0,
        temperature: -1,
    };
    assert_eq!(unsafe { temp(h, &mut t) }, 0);
    assert!(t.temperature >= 20, "{}", t.temperature);
    t.sensor = 9;
    assert_eq!(unsafe { temp(h, &mut t) }, 2);
    assert_eq!(api.shutdown(), 0);
}

/// What nvtop refuses to start without (its `gpuinfo_nvidia_init`), one name per line.
const NVTOP_REQUIRED: &[&str] = &[
    "nvmlInit_v2",
    "nvmlShutdown",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlErrorString",
    "nvmlDeviceGetName",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetTemperatureThreshold",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetMaxClockInfo",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetFanSpeed",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetEncoderUtilization",
    "nvmlDeviceGetDecoderUtilization",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetProcessUtilization",
];

/// What nvml-wrapper, pynvml (gpustat, nvitop) reach for at start or per refresh.
const CLIENTS_USE: &[&str] = &[
    "nvmlInit",
    "nvmlInitWithFlags",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetHandleByPciBusId_v2",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetCudaDriverVersion",
    "nvmlSystemGetCudaDriverVersion_v2",
    "nvmlSystemGetNVMLVersion",
    "nvmlSystemGetProcessName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetPowerManagementLimit",
    "nvmlDeviceGetPowerManagementLimitConstraints",
    "nvmlDeviceGetPowerManagementDefaultLimit",
    "nvmlDeviceSetPowerManagementLimit",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetRunningProcessDetailList",
    "nvmlDeviceGetBAR1MemoryInfo",
    "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceGetPerformanceState",
    "nvmlDeviceGetComputeMode",
    "nvmlDeviceGetDisplayMode",
    "nvmlDeviceGetDisplayActive",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetFanSpeed_v2",
    "nvmlDeviceSetGpuLockedClocks",
    "nvmlDeviceResetGpuLockedClocks",
];

#[test]
fn peers_find_every_symbol_they_need() {
    let api = Api::load();
    for name in NVTOP_REQUIRED.iter().chain(CLIENTS_USE).chain(EXPORTED) {
        // SAFETY: only resolving, never calling.
        let found = unsafe { api.lib.get::<*const ()>(name.as_bytes()) };
        assert!(found.is_ok(), "{name} is not exported");
    }
}

/// The dynamic symbol table holds exactly the listed functions: nothing missing, no Rust
/// internals leaking out.
#[test]
fn dynamic_symbols_are_exactly_the_list() {
    let out = match Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(lib())
        .output()
    {
        Ok(o) if o.status.success() => o,
        _ => {
            eprintln!("nm is not available; skipping the symbol-table comparison");
            return;
        }
    };
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(" T "))
        .filter_map(|l| l.split_whitespace().last().map(str::to_string))
        .collect();
    names.sort();
    assert_eq!(names, EXPORTED);

    let soname = Command::new("readelf").args(["-d"]).arg(lib()).output();
    if let Ok(o) = soname {
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            text.contains("Library soname: [libnvidia-ml.so.1]"),
            "{text}"
        );
    }
}
