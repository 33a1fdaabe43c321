//! Injected faults: which calls fail, stall or lie, decided from the scenario alone.
//!
//! Pure lookups, no state: the same scenario and the same (function, GPU, time) always give the
//! same answer in every process.

use std::time::Duration;

/// One `[[faults]]` entry of a scenario.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// From `at_s` (simulated seconds since the node started) every call on `gpu` returns
    /// `NVML_ERROR_GPU_IS_LOST`.
    GpuLost { gpu: usize, at_s: f64 },
    /// The named functions return `NVML_ERROR_NOT_SUPPORTED` (on `gpu`, or on every GPU).
    NotSupported {
        functions: Vec<String>,
        gpu: Option<usize>,
    },
    /// The named functions sleep `delay_ms` before answering.
    Slow {
        functions: Vec<String>,
        delay_ms: u64,
        gpu: Option<usize>,
    },
    /// Setters (all, or the named ones) return `NVML_ERROR_NO_PERMISSION`.
    NoPermission {
        functions: Option<Vec<String>>,
        gpu: Option<usize>,
    },
    /// The power limit reads as 0 mW (current and enforced), an odd value consumers must survive.
    PowerLimitZero { gpu: Option<usize> },
}

/// All faults of a scenario.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Faults {
    entries: Vec<Fault>,
}

/// Whether a fault's function list names `called`: exactly, or as the unversioned family
/// name of a `_vN` symbol (`nvmlDeviceGetMemoryInfo` also covers `nvmlDeviceGetMemoryInfo_v2`).
fn names(list: &[String], called: &str) -> bool {
    let family = strip_version(called);
    list.iter().any(|f| f == called || f == family)
}

/// `nvmlDeviceGetCount_v2` → `nvmlDeviceGetCount`; other names unchanged.
pub fn strip_version(name: &str) -> &str {
    if let Some(pos) = name.rfind("_v") {
        let digits = &name[pos + 2..];
        if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
            return &name[..pos];
        }
    }
    name
}

/// Whether a fault scoped to `scope` applies to a call on `gpu` (`None`: a system call).
fn on(scope: Option<usize>, gpu: Option<usize>) -> bool {
    match scope {
        None => true,
        Some(s) => gpu == Some(s),
    }
}

impl Faults {
    pub fn new(entries: Vec<Fault>) -> Faults {
        Faults { entries }
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether `gpu` has fallen off the bus at simulated time `t_s`.
    pub fn lost(&self, gpu: usize, t_s: f64) -> bool {
        self.entries
            .iter()
            .any(|f| matches!(f, Fault::GpuLost { gpu: g, at_s } if *g == gpu && t_s >= *at_s))
    }

    pub fn not_supported(&self, function: &str, gpu: Option<usize>) -> bool {
        self.entries.iter().any(|f| {
            matches!(f, Fault::NotSupported { functions, gpu: scope } if on(*scope, gpu) && names(functions, function))
        })
    }

    /// Total stall before `function` answers (several matching entries add up).
    pub fn delay(&self, function: &str, gpu: Option<usize>) -> Option<Duration> {
        let ms: u64 = self
            .entries
            .iter()
            .filter_map(|f| match f {
                Fault::Slow {
                    functions,
                    delay_ms,
                    gpu: scope,
                } if on(*scope, gpu) && names(functions, function) => Some(*delay_ms),
                _ => None,
            })
            .sum();
        (ms > 0).then(|| Duration::from_millis(ms))
    }

    /// Whether the setter `function` is refused on `gpu`.
    pub fn no_permission(&self, function: &str, gpu: Option<usize>) -> bool {
        self.entries.iter().any(|f| match f {
            Fault::NoPermission {
                functions,
                gpu: scope,
            } => on(*scope, gpu) && functions.as_ref().is_none_or(|list| names(list, function)),
            _ => false,
        })
    }

    pub fn power_limit_zero(&self, gpu: usize) -> bool {
        self.entries
            .iter()
            .any(|f| matches!(f, Fault::PowerLimitZero { gpu: scope } if on(*scope, Some(gpu))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_suffix() {
        assert_eq!(strip_version("nvmlDeviceGetCount_v2"), "nvmlDeviceGetCount");
        assert_eq!(
            strip_version("nvmlDeviceGetComputeRunningProcesses_v3"),
            "nvmlDeviceGetComputeRunningProcesses"
        );
        assert_eq!(
            strip_version("nvmlDeviceGetTemperatureV"),
            "nvmlDeviceGetTemperatureV"
        );
        assert_eq!(strip_version("nvmlInit"), "nvmlInit");
        assert_eq!(strip_version("x_v"), "x_v");
    }

    #[test]
    fn scoping_and_families() {
        let f = Faults::new(vec![
            Fault::GpuLost { gpu: 2, at_s: 5.0 },
            Fault::NotSupported {
                functions: vec!["nvmlDeviceGetMemoryInfo".into()],
                gpu: Some(1),
            },
            Fault::Slow {
                functions: vec!["nvmlDeviceGetPowerUsage".into()],
                delay_ms: 30,
                gpu: None,
            },
            Fault::NoPermission {
                functions: None,
                gpu: Some(0),
            },
            Fault::PowerLimitZero { gpu: Some(3) },
        ]);
        assert!(!f.lost(2, 4.9));
        assert!(f.lost(2, 5.0));
        assert!(!f.lost(1, 100.0));
        assert!(f.not_supported("nvmlDeviceGetMemoryInfo_v2", Some(1)));
        assert!(!f.not_supported("nvmlDeviceGetMemoryInfo", Some(0)));
        assert!(!f.not_supported("nvmlDeviceGetMemoryInfo", None));
        assert_eq!(
            f.delay("nvmlDeviceGetPowerUsage", Some(3)),
            Some(Duration::from_millis(30))
        );
        assert_eq!(f.delay("nvmlDeviceGetTemperature", Some(3)), None);
        assert!(f.no_permission("nvmlDeviceSetPowerManagementLimit", Some(0)));
        assert!(!f.no_permission("nvmlDeviceSetPowerManagementLimit", Some(1)));
        assert!(f.power_limit_zero(3));
        assert!(!f.power_limit_zero(0));
    }
}
