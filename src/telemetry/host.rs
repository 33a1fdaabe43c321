//! The host around the GPUs: CPU, memory, load, and per-process CPU and RSS (sysinfo).

use super::HostSample;
use sysinfo::{
    CpuRefreshKind, MemoryRefreshKind, Pid, ProcessRefreshKind, ProcessesToUpdate, RefreshKind,
    System,
};

/// Samples the host. CPU percentages need two refreshes apart in time; the first sample after
/// `new` reports CPU as absent rather than a meaningless zero.
pub struct HostSampler {
    /// None where the OS gives sysinfo nothing to read (no /proc): every host value is absent.
    sys: Option<System>,
    primed: bool,
}

/// CPU and resident memory of one process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcessStat {
    /// Percent of one core (can exceed 100 for a multi-threaded process).
    pub cpu_pct: f64,
    pub rss_bytes: u64,
}

impl HostSampler {
    pub fn new() -> HostSampler {
        let sys = System::new_with_specifics(
            RefreshKind::nothing()
                .with_cpu(CpuRefreshKind::nothing().with_usage())
                .with_memory(MemoryRefreshKind::nothing().with_ram()),
        )
        .ok();
        HostSampler { sys, primed: false }
    }

    /// Refresh and read CPU, memory and load.
    pub fn sample(&mut self) -> HostSample {
        let Some(sys) = self.sys.as_mut() else {
            return HostSample::default();
        };
        sys.refresh_cpu_usage();
        sys.refresh_memory_specifics(MemoryRefreshKind::nothing().with_ram());
        let cpu_pct = self.primed.then(|| sys.global_cpu_usage() as f64);
        self.primed = true;
        let load = System::load_average().ok();
        let total = sys.total_memory();
        HostSample {
            cpu_pct,
            cpu_count: Some(sys.cpus().len()).filter(|&n| n > 0),
            memory_used_bytes: (total > 0).then(|| sys.used_memory()),
            memory_total_bytes: (total > 0).then_some(total),
            load_1m: load.as_ref().map(|l| l.one),
            load_5m: load.as_ref().map(|l| l.five),
            load_15m: load.as_ref().map(|l| l.fifteen),
        }
    }

    /// CPU and RSS of the given processes (those that exist). CPU is measured since the
    /// previous call that named the same process; the first call reports 0 CPU.
    pub fn processes(&mut self, pids: &[u32]) -> Vec<(u32, ProcessStat)> {
        let Some(sys) = self.sys.as_mut() else {
            return Vec::new();
        };
        let pids: Vec<Pid> = pids.iter().map(|&p| Pid::from_u32(p)).collect();
        sys.refresh_processes_specifics(
            ProcessesToUpdate::Some(&pids),
            true,
            ProcessRefreshKind::nothing().with_cpu().with_memory(),
        );
        pids.iter()
            .filter_map(|pid| {
                sys.process(*pid).map(|p| {
                    (
                        pid.as_u32(),
                        ProcessStat {
                            cpu_pct: p.cpu_usage() as f64,
                            rss_bytes: p.memory(),
                        },
                    )
                })
            })
            .collect()
    }
}

impl Default for HostSampler {
    fn default() -> Self {
        Self::new()
    }
}

/// This machine's host name, or "localhost" when it has none.
pub fn hostname() -> String {
    System::host_name().unwrap_or_else(|_| "localhost".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_sample_reads_memory_and_primes_cpu() {
        let mut h = HostSampler::new();
        let first = h.sample();
        assert_eq!(first.cpu_pct, None, "first CPU reading has no interval yet");
        let total = first.memory_total_bytes.expect("total memory");
        assert!(total > 64 << 20);
        assert!(first.memory_used_bytes.unwrap() <= total);
        std::thread::sleep(std::time::Duration::from_millis(250));
        let second = h.sample();
        let cpu = second.cpu_pct.expect("cpu after two refreshes");
        assert!((0.0..=100.0).contains(&cpu), "{cpu}");
    }

    #[test]
    fn process_stats_for_self() {
        let mut h = HostSampler::new();
        let me = std::process::id();
        let stats = h.processes(&[me, u32::MAX - 1]);
        assert_eq!(stats.len(), 1, "only the live process is reported");
        assert_eq!(stats[0].0, me);
        assert!(stats[0].1.rss_bytes > 1 << 20);
    }
}
