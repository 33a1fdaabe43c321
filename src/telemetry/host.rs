//! The host around the GPUs: CPU, memory and load from /proc, and per-process CPU and RSS
//! (sysinfo).
//!
//! The host goes with every snapshot, so its three /proc files are opened once and read again
//! from the start each time (no open, no close, no allocation per sample), and parsed here. They
//! are read at their own pace, whatever the sampling rate: the CPU times every [`HOST_PERIOD`],
//! the memory and the load every [`HOST_PERIOD`] half a period later, so that a sample at 1 Hz
//! reads one of the two, and the figures between are the last ones read. /proc/stat and
//! /proc/meminfo are the costliest reads of a sample on a quiet machine (the kernel writes every
//! CPU's and every interrupt's counts; the more of them, the costlier), and the host figures
//! move slowly enough for top's 3 s and htop's 1.5 s. The figures are computed as sysinfo
//! computes them (the same fields, the same arithmetic), so they match what `sysinfo::System`
//! reports for the same readings.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use super::HostSample;
use sysinfo::{Pid, ProcessRefreshKind, ProcessesToUpdate, System};

/// How often each /proc file is read (see the module doc).
pub const HOST_PERIOD: Duration = Duration::from_secs(2);

/// Samples the host. CPU percentages need two readings apart in time; until the second, CPU is
/// absent rather than a meaningless zero.
pub struct HostSampler {
    stat: Option<File>,
    meminfo: Option<File>,
    loadavg: Option<File>,
    /// Where each file is read: zeroed once, at its length (only a file longer than it grows
    /// it), so that a read writes the file's bytes and nothing else.
    buf: Vec<u8>,
    cpu: CpuUsage,
    /// `cpuN` lines in /proc/stat at the first reading.
    cpu_count: usize,
    /// When /proc/stat was last read, and whether twice (a percentage is there).
    cpu_read: Instant,
    cpu_ready: bool,
    /// When /proc/meminfo and /proc/loadavg were last read (as if half a period earlier at the
    /// start, so that the two take turns).
    memory_read: Instant,
    memory: Memory,
    load: Option<[f64; 3]>,
    period: Duration,
    /// For [`HostSampler::processes`] only, made at its first call.
    procs: Option<System>,
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
        HostSampler::every(HOST_PERIOD)
    }

    /// Reading each file every `period` (see the module doc); the first readings now.
    pub fn every(period: Duration) -> HostSampler {
        let open = |path: &str| File::open(path).ok();
        let now = Instant::now();
        let mut h = HostSampler {
            stat: open("/proc/stat"),
            meminfo: open("/proc/meminfo"),
            loadavg: open("/proc/loadavg"),
            buf: vec![0; 8192],
            cpu: CpuUsage::default(),
            cpu_count: 0,
            cpu_read: now,
            cpu_ready: false,
            memory_read: now.checked_sub(period / 2).unwrap_or(now),
            memory: Memory::default(),
            load: None,
            period,
            procs: None,
        };
        // The first CPU reading, for the percentage from the next.
        h.read_cpu();
        h.read_memory();
        h
    }

    /// Report CPU, memory and load, reading what is due (see the module doc).
    pub fn sample(&mut self) -> HostSample {
        self.sample_at(Instant::now())
    }

    fn sample_at(&mut self, now: Instant) -> HostSample {
        if self.due(self.cpu_read, now) {
            self.read_cpu();
            self.cpu_read = now;
            self.cpu_ready = true;
        } else if self.due(self.memory_read, now) {
            self.read_memory();
            self.memory_read = now;
        }
        let cpu_pct =
            (self.cpu_ready && self.stat.is_some()).then_some(f64::from(self.cpu.percent));
        let total = self.memory.total;
        let load = self.load;
        HostSample {
            cpu_pct,
            cpu_count: Some(self.cpu_count).filter(|&n| n > 0),
            memory_used_bytes: (total > 0).then(|| self.memory.used()),
            memory_total_bytes: (total > 0).then_some(total),
            load_1m: load.map(|l| l[0]),
            load_5m: load.map(|l| l[1]),
            load_15m: load.map(|l| l[2]),
        }
    }

    /// Whether a file last read at `last` is due at `now`: a period on, less an eighth of one,
    /// as sample times jitter by a few milliseconds and a reading a whole period late would
    /// make the figures twice as old.
    fn due(&self, last: Instant, now: Instant) -> bool {
        now.saturating_duration_since(last) >= self.period - self.period / 8
    }

    fn read_cpu(&mut self) {
        let Some(n) = read_all(self.stat.as_ref(), &mut self.buf) else {
            return;
        };
        if let Some((times, cpus)) = parse_stat(&self.buf[..n]) {
            self.cpu.set(times);
            if self.cpu_count == 0 {
                self.cpu_count = cpus;
            }
        }
    }

    /// /proc/meminfo and /proc/loadavg.
    fn read_memory(&mut self) {
        if let Some(n) = read_all(self.meminfo.as_ref(), &mut self.buf) {
            self.memory.parse(&self.buf[..n]);
        }
        self.load = read_all(self.loadavg.as_ref(), &mut self.buf)
            .map(|n| parse_loadavg(&String::from_utf8_lossy(&self.buf[..n])));
    }

    /// CPU and RSS of the given processes (those that exist). CPU is measured since the
    /// previous call that named the same process; the first call reports 0 CPU.
    pub fn processes(&mut self, pids: &[u32]) -> Vec<(u32, ProcessStat)> {
        if self.procs.is_none() {
            self.procs = System::new().ok();
        }
        // None where the OS gives sysinfo nothing to read.
        let Some(sys) = self.procs.as_mut() else {
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

/// Read all of `file` from its start into the start of `buf`: its length, or None when there
/// is no file or it fails. `buf` keeps its length (and grows only for a longer file), so the
/// bytes past the file's are left as they were.
///
/// A /proc file fills a read as far as it has data (the kernel's seq_file goes on until the
/// buffer is full or the file ends), so a read that leaves room is the end: no second read,
/// which would make the kernel generate the file again only to say so.
fn read_all(file: Option<&File>, buf: &mut Vec<u8>) -> Option<usize> {
    let file = file?;
    let mut len = 0;
    loop {
        if len == buf.len() {
            buf.resize(buf.len() + 4096, 0);
        }
        match file.read_at(&mut buf[len..], len as u64) {
            Ok(n) => {
                len += n;
                if len < buf.len() {
                    return Some(len);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}

/// The aggregate `cpu` line's ten times (user … guest_nice; absent ones 0) and the number of
/// `cpuN` lines that follow it. None when the file does not start with the `cpu ` line.
fn parse_stat(text: &[u8]) -> Option<([u64; 10], usize)> {
    let mut lines = text.split(|&b| b == b'\n');
    let first = lines.next()?;
    if !first.starts_with(b"cpu ") {
        return None;
    }
    let mut times = [0u64; 10];
    let fields = first
        .split(|&b| b == b' ')
        .filter(|f| !f.is_empty())
        .skip(1);
    for (t, f) in times.iter_mut().zip(fields) {
        *t = std::str::from_utf8(f)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
    }
    let cpus = lines.take_while(|l| l.starts_with(b"cpu")).count();
    Some((times, cpus))
}

/// One reading of the aggregate CPU times, as sysinfo keeps them (guest time is taken out of
/// user and nice, where the kernel counts it too).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct CpuTimes {
    user: u64,
    nice: u64,
    system: u64,
    idle: u64,
    iowait: u64,
    irq: u64,
    softirq: u64,
    steal: u64,
    guest: u64,
    guest_nice: u64,
}

impl CpuTimes {
    fn from_fields(f: [u64; 10]) -> CpuTimes {
        let [
            user,
            nice,
            system,
            idle,
            iowait,
            irq,
            softirq,
            steal,
            guest,
            guest_nice,
        ] = f;
        CpuTimes {
            user: user.saturating_sub(guest),
            nice: nice.saturating_sub(guest_nice),
            system,
            idle,
            iowait,
            irq,
            softirq,
            steal,
            guest,
            guest_nice,
        }
    }
    fn system_time(&self) -> u64 {
        self.system
            .saturating_add(self.irq)
            .saturating_add(self.softirq)
    }
    fn virtual_time(&self) -> u64 {
        self.guest.saturating_add(self.guest_nice)
    }
    fn total_time(&self) -> u64 {
        self.user
            .saturating_add(self.nice)
            .saturating_add(self.system_time())
            .saturating_add(self.idle.saturating_add(self.iowait))
            .saturating_add(self.virtual_time())
            .saturating_add(self.steal)
    }
}

/// Busy percentage of the whole machine between the last two readings (sysinfo's
/// `global_cpu_usage`, in the same f32 arithmetic).
#[derive(Debug, Default)]
struct CpuUsage {
    now: CpuTimes,
    percent: f32,
}

impl CpuUsage {
    fn set(&mut self, fields: [u64; 10]) {
        let old = self.now;
        let new = CpuTimes::from_fields(fields);
        self.now = new;
        let (total_new, total_old) = (new.total_time(), old.total_time());
        let total = if total_new > total_old {
            (total_new - total_old) as f32
        } else {
            1.0
        };
        let nice = new.nice.saturating_sub(old.nice) as f32 / total;
        let user = new.user.saturating_sub(old.user) as f32 / total;
        let system = new.system_time().saturating_sub(old.system_time()) as f32 / total;
        let steal = new.steal.saturating_sub(old.steal);
        let guest = new.virtual_time().saturating_sub(old.virtual_time());
        let irq = (steal + guest) as f32 / total;
        self.percent = ((nice + user + system + irq) * 100.0).min(100.0);
    }
}

/// The /proc/meminfo fields the used-memory figure needs, in bytes. A field missing from a
/// reading keeps its last value.
#[derive(Debug, Default, PartialEq)]
struct Memory {
    total: u64,
    free: u64,
    available: Option<u64>,
    buffers: u64,
    cached: u64,
    shmem: u64,
    reclaimable: u64,
}

impl Memory {
    /// Reads the fields from the text of /proc/meminfo (all near its top: the lines after
    /// the last of them are not looked at).
    fn parse(&mut self, text: &[u8]) {
        const KEYS: [&[u8]; 7] = [
            b"MemTotal",
            b"MemFree",
            b"MemAvailable",
            b"Buffers",
            b"Cached",
            b"Shmem",
            b"SReclaimable",
        ];
        let mut available = None;
        let mut seen = 0u8;
        for line in text.split(|&b| b == b'\n') {
            let Some(colon) = line.iter().position(|&b| b == b':') else {
                continue;
            };
            let (key, value) = (&line[..colon], &line[colon + 1..]);
            let Some(k) = KEYS.iter().position(|&w| w == key) else {
                continue;
            };
            let value = value.trim_ascii_start();
            let digits = &value[..value.iter().position(|&b| b == b' ').unwrap_or(value.len())];
            let Some(kib) = std::str::from_utf8(digits)
                .ok()
                .and_then(|d| d.parse::<u64>().ok())
            else {
                continue;
            };
            // "kB" in the file, KiB in fact.
            let bytes = kib.saturating_mul(1024);
            match k {
                0 => self.total = bytes,
                1 => self.free = bytes,
                2 => available = Some(bytes),
                3 => self.buffers = bytes,
                4 => self.cached = bytes,
                5 => self.shmem = bytes,
                _ => self.reclaimable = bytes,
            }
            seen |= 1 << k;
            if seen == 0x7f {
                break;
            }
        }
        // Kernels before 3.14 have no MemAvailable: estimated from the rest.
        self.available = Some(available.unwrap_or_else(|| {
            self.free
                .saturating_add(self.buffers)
                .saturating_add(self.cached)
                .saturating_add(self.reclaimable)
                .saturating_sub(self.shmem)
        }));
    }

    fn used(&self) -> u64 {
        self.total.saturating_sub(self.available.unwrap_or(0))
    }
}

/// The 1, 5 and 15 minute load averages (missing ones 0).
fn parse_loadavg(text: &str) -> [f64; 3] {
    let mut load = [0.0; 3];
    let values = text
        .trim()
        .split(' ')
        .take(3)
        .filter_map(|v| v.parse::<f64>().ok());
    for (l, v) in load.iter_mut().zip(values) {
        *l = v;
    }
    load
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT_1: &str = "cpu  10132153 290696 3084719 46828483 16683 0 25195 0 175628 0\n\
                          cpu0 1393280 32966 572056 13343292 6130 0 17875 0 23933 0\n\
                          cpu1 1335140 34637 481394 13297246 3404 0 5001 0 44131 0\n\
                          intr 1462898 0 0 0\n\
                          ctxt 4291235\n\
                          btime 1769000000\n";
    const STAT_2: &str = "cpu  10132353 290716 3084819 46829183 16693 0 25205 7 175700 0\n\
                          cpu0 1393380 32976 572106 13343642 6135 0 17880 3 23969 0\n\
                          cpu1 1335240 34647 481444 13297596 3409 0 5006 4 44167 0\n\
                          intr 1462999 0 0 0\n";

    const MEMINFO: &str = "MemTotal:       32780440 kB\n\
                           MemFree:         1201432 kB\n\
                           MemAvailable:   20418300 kB\n\
                           Buffers:          774920 kB\n\
                           Cached:         17339420 kB\n\
                           SwapCached:            0 kB\n\
                           Shmem:            712068 kB\n\
                           SReclaimable:    1320704 kB\n\
                           HugePages_Total:       0\n";

    #[test]
    fn the_stat_line_and_the_cpu_count() {
        let (times, cpus) = parse_stat(STAT_1.as_bytes()).unwrap();
        assert_eq!(
            times,
            [
                10132153, 290696, 3084719, 46828483, 16683, 0, 25195, 0, 175628, 0
            ]
        );
        assert_eq!(cpus, 2);
        // An old kernel with fewer columns: the missing ones are 0.
        let (times, cpus) = parse_stat(b"cpu 1 2 3 4\ncpu0 1 2 3 4\n").unwrap();
        assert_eq!(times, [1, 2, 3, 4, 0, 0, 0, 0, 0, 0]);
        assert_eq!(cpus, 1);
        assert_eq!(parse_stat(b"intr 1 2\n"), None);
        assert_eq!(parse_stat(b""), None);
    }

    #[test]
    fn cpu_percentage_between_two_readings() {
        let mut u = CpuUsage::default();
        u.set(parse_stat(STAT_1.as_bytes()).unwrap().0);
        u.set(parse_stat(STAT_2.as_bytes()).unwrap().0);
        // Deltas: user 200-72 guest = 128, nice 20, system 100+10 softirq = 110, idle 700,
        // iowait 10, steal 7, guest 72: busy 128+20+110+7+72 = 337 of 1047.
        let by_hand = 337.0 / 1047.0 * 100.0;
        assert!(
            (f64::from(u.percent) - by_hand).abs() < 1e-4,
            "{} against {by_hand}",
            u.percent
        );
        // Sysinfo's own arithmetic, term by term in f32.
        let t = 1047.0f32;
        assert_eq!(
            u.percent,
            (20.0 / t + 128.0 / t + 110.0 / t + 79.0 / t) * 100.0
        );
        // Times that went backwards (a counter reset) give no division by zero.
        u.set(parse_stat(STAT_1.as_bytes()).unwrap().0);
        assert!(u.percent.is_finite() && (0.0..=100.0).contains(&u.percent));
    }

    #[test]
    fn memory_used_is_total_less_available() {
        let mut m = Memory::default();
        m.parse(MEMINFO.as_bytes());
        assert_eq!(m.total, 32780440 * 1024);
        assert_eq!(m.used(), (32780440 - 20418300) * 1024);
        // Without MemAvailable: free + buffers + cached + reclaimable - shmem.
        let old: String = MEMINFO
            .lines()
            .filter(|l| !l.starts_with("MemAvailable"))
            .map(|l| format!("{l}\n"))
            .collect();
        let mut m = Memory::default();
        m.parse(old.as_bytes());
        let avail = 1201432 + 774920 + 17339420 + 1320704 - 712068;
        assert_eq!(m.used(), (32780440 - avail) * 1024);
    }

    #[test]
    fn a_file_is_read_whole_and_alone() {
        let dir = tempfile::tempdir().unwrap();
        let long: Vec<u8> = (0..20_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        std::fs::write(dir.path().join("long"), &long).unwrap();
        std::fs::write(dir.path().join("short"), b"0.52 1.07 1.30 2/611 1\n").unwrap();
        let open = |name: &str| File::open(dir.path().join(name)).unwrap();
        let mut buf = vec![0; 8192];
        // Longer than the buffer: it grows, and holds all of it.
        let n = read_all(Some(&open("long")), &mut buf).unwrap();
        assert_eq!(&buf[..n], &long[..]);
        // Then a short one: its bytes, none of the long one's after them.
        let n = read_all(Some(&open("short")), &mut buf).unwrap();
        assert_eq!(&buf[..n], b"0.52 1.07 1.30 2/611 1\n");
        // Exactly the buffer's length: read to its end, not cut at the buffer.
        let exact = vec![b'x'; buf.len()];
        std::fs::write(dir.path().join("exact"), &exact).unwrap();
        let n = read_all(Some(&open("exact")), &mut buf).unwrap();
        assert_eq!(&buf[..n], &exact[..]);
        assert_eq!(read_all(None, &mut buf), None);
    }

    #[test]
    fn load_averages() {
        assert_eq!(
            parse_loadavg("0.52 1.07 1.30 2/611 123456\n"),
            [0.52, 1.07, 1.30]
        );
        assert_eq!(parse_loadavg("0.52\n"), [0.52, 0.0, 0.0]);
    }

    #[test]
    fn the_same_figures_as_sysinfo() {
        use sysinfo::{CpuRefreshKind, MemoryRefreshKind, RefreshKind};
        let mut h = HostSampler::new();
        let mut sys = System::new_with_specifics(
            RefreshKind::nothing()
                .with_cpu(CpuRefreshKind::nothing().with_usage())
                .with_memory(MemoryRefreshKind::nothing().with_ram()),
        )
        .unwrap();
        assert_eq!(Some(sys.cpus().len()), h.sample().cpu_count);
        // Memory moves between two reads; the figures must agree within what moved.
        let ours = h.sample();
        sys.refresh_memory_specifics(MemoryRefreshKind::nothing().with_ram());
        assert_eq!(ours.memory_total_bytes, Some(sys.total_memory()));
        let used = ours.memory_used_bytes.unwrap() as f64;
        assert!((used - sys.used_memory() as f64).abs() < 64e6, "{used}");
        let load = System::load_average().unwrap();
        assert!((ours.load_15m.unwrap() - load.fifteen).abs() < 0.05);
    }

    #[test]
    fn host_sample_reads_memory_and_primes_cpu() {
        let mut h = HostSampler::every(Duration::from_millis(200));
        let first = h.sample();
        assert_eq!(first.cpu_pct, None, "first CPU reading has no interval yet");
        let total = first.memory_total_bytes.expect("total memory");
        assert!(total > 64 << 20);
        assert!(first.memory_used_bytes.unwrap() <= total);
        assert!(first.load_1m.is_some());
        std::thread::sleep(Duration::from_millis(250));
        let second = h.sample();
        let cpu = second.cpu_pct.expect("cpu after two refreshes");
        assert!((0.0..=100.0).contains(&cpu), "{cpu}");
    }

    #[test]
    fn each_file_is_read_once_a_period_and_the_two_take_turns() {
        let period = Duration::from_secs(2);
        let mut h = HostSampler::every(period);
        let t0 = h.cpu_read;
        assert_eq!(
            t0 - h.memory_read,
            period / 2,
            "memory as if read a second before"
        );
        // What each sample reads, at `at` (ms after the start).
        let mut reads = |at: &[u64]| -> String {
            at.iter()
                .map(|&ms| {
                    let before = (h.cpu_read, h.memory_read);
                    h.sample_at(t0 + Duration::from_millis(ms));
                    match (h.cpu_read != before.0, h.memory_read != before.1) {
                        (true, false) => 'c',
                        (false, true) => 'm',
                        (false, false) => '-',
                        (true, true) => panic!("both read at {ms} ms"),
                    }
                })
                .collect()
        };
        // Once a second, with a few milliseconds of jitter either way: one file each time, in
        // turn, each every two seconds.
        assert_eq!(reads(&[1_003, 1_998, 3_001, 3_996, 5_002, 6_000]), "mcmcmc");
        // Ten times a second: each file every two seconds, a second apart, nothing between.
        let at: Vec<u64> = (61..=100).map(|i| i * 100).collect();
        let got = reads(&at);
        assert_eq!(got.matches('c').count(), 2, "{got}");
        assert_eq!(got.matches('m').count(), 2, "{got}");
        let first = |c| got.find(c).unwrap();
        assert_eq!(first('c').abs_diff(first('m')), 10, "{got}");
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
