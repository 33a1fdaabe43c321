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
    /// From `at_s` simulated seconds, readings no driver should give but some do: the energy
    /// counter reads `energy_offset_mj` off the truth (wrapping round 2^64, as the `u64` it
    /// is), and the power limit (current and enforced) reads `power_limit_mw`.
    WildReadings {
        gpu: Option<usize>,
        at_s: f64,
        energy_offset_mj: Option<i64>,
        power_limit_mw: Option<u32>,
    },
    /// A critical XID event on `gpu` (or every GPU) at `at_s` simulated seconds, and again every
    /// `every_s` after that when set: what an event set registered for XIDs delivers.
    Xid {
        gpu: Option<usize>,
        xid: u64,
        at_s: f64,
        every_s: Option<f64>,
    },
}

/// Repeats of one XID fault delivered at most per look: a waiter that comes back after a long
/// pause gets the newest ones, not an unbounded backlog.
const MAX_REPEATS: u64 = 64;

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

    /// The XIDs `gpu` raises in `(after_s, upto_s]` simulated seconds, as (time, xid), oldest
    /// first.
    pub fn xids_between(&self, gpu: usize, after_s: f64, upto_s: f64) -> Vec<(f64, u64)> {
        let mut out = Vec::new();
        for f in &self.entries {
            let Fault::Xid {
                gpu: scope,
                xid,
                at_s,
                every_s,
            } = f
            else {
                continue;
            };
            if !on(*scope, Some(gpu)) || upto_s < *at_s {
                continue;
            }
            match every_s {
                None => {
                    if after_s < *at_s {
                        out.push((*at_s, *xid));
                    }
                }
                Some(every) => {
                    // Occurrences at at_s + k·every, k ≥ 0.
                    let last = ((upto_s - at_s) / every).floor() as u64;
                    let first = if after_s < *at_s {
                        0
                    } else {
                        ((after_s - at_s) / every).floor() as u64 + 1
                    };
                    let first = first.max(last.saturating_sub(MAX_REPEATS - 1));
                    for k in first..=last {
                        out.push((at_s + k as f64 * every, *xid));
                    }
                }
            }
        }
        out.sort_by(|a, b| a.0.total_cmp(&b.0));
        out
    }

    /// The first XID `gpu` raises after `t_s`, in simulated seconds.
    pub fn next_xid_after(&self, gpu: usize, t_s: f64) -> Option<f64> {
        self.entries
            .iter()
            .filter_map(|f| match f {
                Fault::Xid {
                    gpu: scope,
                    at_s,
                    every_s,
                    ..
                } if on(*scope, Some(gpu)) => match every_s {
                    _ if t_s < *at_s => Some(*at_s),
                    None => None,
                    Some(every) => Some(at_s + (((t_s - at_s) / every).floor() + 1.0) * every),
                },
                _ => None,
            })
            .reduce(f64::min)
    }

    /// What `gpu`'s energy counter reads off by at simulated time `t_s`, millijoules (several
    /// matching entries add up).
    pub fn energy_offset_mj(&self, gpu: usize, t_s: f64) -> i64 {
        self.entries
            .iter()
            .filter_map(|f| match f {
                Fault::WildReadings {
                    gpu: scope,
                    at_s,
                    energy_offset_mj: Some(o),
                    ..
                } if on(*scope, Some(gpu)) && t_s >= *at_s => Some(*o),
                _ => None,
            })
            .fold(0i64, |a, o| a.wrapping_add(o))
    }

    /// What `gpu`'s power limit reads at simulated time `t_s` under a `wild_readings` fault,
    /// milliwatts (the first matching entry's).
    pub fn wild_power_limit_mw(&self, gpu: usize, t_s: f64) -> Option<u32> {
        self.entries.iter().find_map(|f| match f {
            Fault::WildReadings {
                gpu: scope,
                at_s,
                power_limit_mw: Some(mw),
                ..
            } if on(*scope, Some(gpu)) && t_s >= *at_s => Some(*mw),
            _ => None,
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
    fn xids_once_and_repeating() {
        let f = Faults::new(vec![
            Fault::Xid {
                gpu: Some(1),
                xid: 79,
                at_s: 10.0,
                every_s: None,
            },
            Fault::Xid {
                gpu: None,
                xid: 13,
                at_s: 2.0,
                every_s: Some(5.0),
            },
        ]);
        assert_eq!(f.xids_between(1, 0.0, 9.9), vec![(2.0, 13), (7.0, 13)]);
        assert_eq!(f.xids_between(1, 7.0, 12.0), vec![(10.0, 79), (12.0, 13)]);
        assert_eq!(f.xids_between(1, 10.0, 11.0), vec![], "delivered once");
        assert_eq!(f.xids_between(0, 7.0, 12.0), vec![(12.0, 13)]);
        assert_eq!(f.xids_between(0, 0.0, 1.9), vec![]);
        assert_eq!(f.next_xid_after(1, 0.0), Some(2.0));
        assert_eq!(f.next_xid_after(1, 7.5), Some(10.0));
        assert_eq!(f.next_xid_after(0, 7.0), Some(12.0));
        assert_eq!(f.next_xid_after(0, 7.5), Some(12.0));
        // A long pause gets the newest repeats, bounded.
        let many = f.xids_between(0, 0.0, 1e6);
        assert_eq!(many.len() as u64, MAX_REPEATS);
        assert_eq!(many.last(), Some(&(999_997.0, 13)));
        assert!(Faults::default().next_xid_after(0, 0.0).is_none());
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
            Fault::NotSupported {
                functions: vec!["nvmlDeviceGetFanSpeed_v2".into()],
                gpu: None,
            },
        ]);
        // A versioned name is that version alone: the call before it still answers.
        assert!(f.not_supported("nvmlDeviceGetFanSpeed_v2", Some(0)));
        assert!(!f.not_supported("nvmlDeviceGetFanSpeed", Some(0)));
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
