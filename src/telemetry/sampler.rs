//! Sampling off the caller's thread: GPUs read on sampling threads ("lanes"), snapshots at the
//! configured rate, and a coordinator that watches the lanes.
//!
//! The first readings are taken in parallel (a lane per GPU, so the first snapshot waits for
//! the slowest GPU only); after them, while every GPU answers promptly, one lane reads them all
//! in turn each period: one thread wake-up per period instead of one per GPU, and that lane
//! assembles the snapshot as it ends its round, so the readings are in it at once. A GPU whose
//! call holds its lane past half a period (a hung or very slow driver call) keeps that lane to
//! itself: the lane's other GPUs move to a new lane at once, and from then on the coordinator
//! assembles each snapshot half a period after the readings began. While one lane reads every
//! GPU, the coordinator sleeps on a timer that lane sets for half a period at the start of each
//! round and clears at its end ([`Watchdog`]): it wakes only for a round that overran. So a worker that hangs
//! inside a driver call holds only its own GPU: the coordinator keeps publishing, with that
//! GPU's last reading marked `stale`, and the other GPUs keep updating. At worst (every GPU
//! slow) each GPU has a lane of its own. Nothing here blocks a reader of [`Sampler::latest`]
//! for longer than a mutex swap.
//!
//! A stale GPU keeps its last reading; a lost one keeps its last known identity (name, UUID,
//! PCI bus id), so that it is still named, and found by UUID, after it fell off the bus.

use super::host::HostSampler;
use super::{GpuSample, NodeInfo, Snapshot, Source, now_s};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, bounded};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

/// How often to sample and when a reading counts as stale.
#[derive(Debug, Clone)]
pub struct SamplerConfig {
    /// Interval between samples of each GPU.
    pub period: Duration,
    /// A GPU whose newest reading is older than this is shown stale. Defaults to three periods,
    /// at least one second.
    pub stale_after: Duration,
    /// Sample the host (CPU, memory, load) too.
    pub host: bool,
}

impl SamplerConfig {
    /// Sample every `period`, stale after three missed periods (at least 1 s).
    pub fn every(period: Duration) -> Self {
        SamplerConfig {
            period,
            stale_after: (period * 3).max(Duration::from_secs(1)),
            host: true,
        }
    }
}

type Slots = Arc<Vec<Mutex<Slot>>>;

/// One GPU's place between its lane and the snapshots.
#[derive(Default)]
struct Slot {
    /// Its newest reading, until a snapshot takes it (moved, not copied: the snapshot after
    /// that copies it from the one before while no newer reading came).
    fresh: Option<GpuSample>,
    /// It has answered at least once.
    answered: bool,
    /// The identity its last reading had (see [`keep_identity`]).
    known: Identity,
}

/// A GPU's name, UUID and PCI bus id, as its last reading had them.
#[derive(Default)]
struct Identity {
    uuid: Option<String>,
    name: Option<String>,
    pci_bus_id: Option<String>,
}

/// What takes each snapshot on the thread that assembles it.
type Sink = Box<dyn FnMut(Arc<Snapshot>) + Send>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A running sampler. Dropping it stops the lanes (a lane stuck in a call exits when the call
/// returns).
pub struct Sampler {
    publisher: Arc<Publisher>,
    watchdog: Arc<Watchdog>,
    stop: Arc<AtomicBool>,
    stop_tx: Sender<()>,
    _stop_rx: Receiver<()>,
}

impl Sampler {
    /// Start sampling `source` in the background. The first snapshot is taken before this
    /// returns only when every GPU answers within one period; otherwise the slow GPUs appear
    /// as stale placeholders until they answer.
    pub fn start(source: Arc<dyn Source>, config: SamplerConfig) -> Sampler {
        Sampler::start_inner(source, config, None)
    }

    /// [`start`](Self::start), with `sink` given every snapshot on the thread that assembles
    /// it (the first one on the caller's, before this returns): no thread of the caller's is
    /// woken to take it. A sink that takes longer than a period delays the snapshots after
    /// it, and, while one lane reads every GPU (it assembles the snapshots then), that lane's
    /// next readings.
    pub fn start_with_sink(
        source: Arc<dyn Source>,
        config: SamplerConfig,
        sink: impl FnMut(Arc<Snapshot>) + Send + 'static,
    ) -> Sampler {
        Sampler::start_inner(source, config, Some(Box::new(sink)))
    }

    fn start_inner(source: Arc<dyn Source>, config: SamplerConfig, sink: Option<Sink>) -> Sampler {
        let count = source.gpu_count();
        let slots: Slots = Arc::new((0..count).map(|_| Mutex::default()).collect());
        let stop = Arc::new(AtomicBool::new(false));
        // Nobody sends on this channel: dropping the sender (in Drop) disconnects it, which
        // wakes every lane and the coordinator at once.
        let (stop_tx, stop_rx) = bounded::<()>(0);
        let started = Instant::now();
        let period = config.period;
        let publisher = Arc::new(Publisher {
            node: source.node_info(),
            stale_after: config.stale_after,
            period,
            started,
            slots: Arc::clone(&slots),
            stop: Arc::clone(&stop),
            latest: Mutex::default(),
            subscribers: Mutex::default(),
            assembly: Mutex::new(Assembly {
                host: None,
                sink,
                prev: Arc::default(),
                published: None,
            }),
        });

        let watchdog = Arc::new(Watchdog::new(Arc::clone(&stop)));

        let mut lanes = Lanes {
            lanes: Vec::new(),
            ctx: Arc::new(LaneContext {
                source,
                slots: Arc::clone(&slots),
                stop: Arc::clone(&stop),
                stop_rx: stop_rx.clone(),
                started,
                period,
                publisher: Arc::clone(&publisher),
                watchdog: Arc::clone(&watchdog),
            }),
        };
        // The first readings in parallel, one lane per GPU: the first snapshot waits for the
        // slowest GPU, not for all of them in turn.
        for gpu in 0..count {
            lanes.spawn(vec![gpu]);
        }
        // Give the lanes one period to fill their slots, so the first snapshot is complete
        // when the driver is healthy.
        wait_for_slots(&slots, period.max(Duration::from_millis(200)));
        // From now on one lane reads every GPU that answered; one still in a call keeps its
        // lane to itself.
        lanes.merge_idle();

        publisher.first(config.host.then(HostSampler::new));
        {
            let publisher = Arc::clone(&publisher);
            let watchdog = Arc::clone(&watchdog);
            let stop = Arc::clone(&stop);
            let stop_rx = stop_rx.clone();
            thread::Builder::new()
                .name("sample-coord".into())
                .spawn(move || {
                    // Half a period after a round of readings began, a lane still in a call
                    // is held up by one GPU and the others go on without it, and the round's
                    // snapshot is assembled here if no lane did (a lane that reads every GPU
                    // assembles it as it ends the round). Lanes read at start + k·period, so
                    // each snapshot is between two readings.
                    let half = period / 2;
                    loop {
                        if lanes.solo() && watchdog.armed_by_lane() {
                            // Only a round that overran wakes us (or the sampler's stop).
                            watchdog.wait();
                        } else {
                            let since = started.elapsed();
                            let wait = match since.checked_sub(half) {
                                Some(e) => until_next_reading(e, period),
                                None => half - since,
                            };
                            match stop_rx.recv_timeout(wait) {
                                Err(RecvTimeoutError::Timeout) => {}
                                // Disconnected: the sampler stopped (nobody ever sends).
                                _ => break,
                            }
                        }
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        lanes.split_held(half);
                        let round = round_of(started.elapsed().saturating_sub(half), period);
                        publisher.publish(round);
                    }
                })
                .expect("spawning the sampler coordinator");
        }
        Sampler {
            publisher,
            watchdog,
            stop,
            stop_tx,
            _stop_rx: stop_rx,
        }
    }

    /// The newest snapshot.
    pub fn latest(&self) -> Arc<Snapshot> {
        Arc::clone(&lock(&self.publisher.latest))
    }

    /// A channel that receives every new snapshot (a slow reader skips some; it never blocks
    /// the sampler).
    pub fn subscribe(&self) -> Receiver<Arc<Snapshot>> {
        let (tx, rx) = bounded(2);
        lock(&self.publisher.subscribers).push(tx);
        rx
    }
}

/// Where snapshots are assembled and published, by the lane that reads every GPU or by the
/// coordinator.
struct Publisher {
    node: NodeInfo,
    stale_after: Duration,
    period: Duration,
    started: Instant,
    slots: Slots,
    stop: Arc<AtomicBool>,
    latest: Mutex<Arc<Snapshot>>,
    subscribers: Mutex<Vec<Sender<Arc<Snapshot>>>>,
    /// Held while one snapshot is assembled and handed out: one at a time, in order.
    assembly: Mutex<Assembly>,
}

struct Assembly {
    host: Option<HostSampler>,
    sink: Option<Sink>,
    /// The snapshot published last: a GPU with no new reading is copied from it.
    prev: Arc<Snapshot>,
    /// The round of readings (`started + k·period`) the last snapshot was for; None before
    /// the first.
    published: Option<u64>,
}

impl Publisher {
    /// The first snapshot, on the caller's thread (its sink sees it before any other).
    fn first(&self, host: Option<HostSampler>) {
        let mut a = lock(&self.assembly);
        a.host = host;
        let round = round_of(self.started.elapsed(), self.period);
        self.hand_out(&mut a, round);
    }

    /// The snapshot of round `round`, unless one was published for it (or a later one).
    fn publish(&self, round: u64) {
        let mut a = lock(&self.assembly);
        if a.published.is_none_or(|p| p >= round) || self.stop.load(Ordering::Relaxed) {
            return;
        }
        self.hand_out(&mut a, round);
    }

    fn hand_out(&self, a: &mut Assembly, round: u64) {
        // One copy of each snapshot, shared by the latest and every subscriber.
        let snap = Arc::new(assemble(
            &self.node,
            &self.slots,
            &a.prev,
            a.host.as_mut(),
            self.stale_after,
        ));
        a.published = Some(round);
        a.prev = Arc::clone(&snap);
        *lock(&self.latest) = Arc::clone(&snap);
        let mut subs = lock(&self.subscribers);
        // A subscriber that is behind skips a snapshot rather than stalling us; one that has
        // gone away is dropped.
        subs.retain(|tx| {
            !matches!(
                tx.try_send(Arc::clone(&snap)),
                Err(crossbeam_channel::TrySendError::Disconnected(_))
            )
        });
        drop(subs);
        if let Some(sink) = a.sink.as_mut() {
            sink(snap);
        }
    }
}

/// The round of readings (`k` of `started + k·period`) under way `elapsed` after the start.
fn round_of(elapsed: Duration, period: Duration) -> u64 {
    u64::try_from(elapsed.as_nanos() / period.as_nanos().max(1)).unwrap_or(u64::MAX)
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.watchdog.ring();
        // Replace our sender so the real one drops now and disconnects the stop channel.
        let (dead, _) = bounded(0);
        drop(std::mem::replace(&mut self.stop_tx, dead));
    }
}

/// What every lane shares.
struct LaneContext {
    source: Arc<dyn Source>,
    slots: Slots,
    stop: Arc<AtomicBool>,
    stop_rx: Receiver<()>,
    /// Readings are taken at `started + k·period`.
    started: Instant,
    period: Duration,
    /// A lane that reads every GPU publishes each round's snapshot as it ends the round.
    publisher: Arc<Publisher>,
    /// … and sets this for half a period while its round lasts.
    watchdog: Arc<Watchdog>,
}

/// The coordinator's alarm while one lane reads every GPU: a timer (timerfd) the lane sets for
/// half a period as each round begins and clears as it ends, so that the coordinator, blocked
/// on it, wakes only when a round overran (or the sampler stops), not once a period to find
/// nothing to do. Setting and clearing it are system calls on the lane's thread; no thread is
/// woken by them.
struct Watchdog {
    /// None where no timer could be had: the coordinator then wakes every period.
    timer: Option<rustix::fd::OwnedFd>,
    /// Held to set or clear the timer with `stop` read under it, so that the alarm a stop
    /// rings is never cleared by a lane.
    guard: Mutex<()>,
    stop: Arc<AtomicBool>,
}

impl Watchdog {
    fn new(stop: Arc<AtomicBool>) -> Watchdog {
        use rustix::time::{TimerfdClockId, TimerfdFlags, timerfd_create};
        let timer = timerfd_create(TimerfdClockId::Monotonic, TimerfdFlags::CLOEXEC);
        if let Err(e) = &timer {
            tracing::debug!("no timerfd for the sampler's watchdog ({e}): it wakes every period");
        }
        Watchdog {
            timer: timer.ok(),
            guard: Mutex::new(()),
            stop,
        }
    }

    /// Whether the lanes set the timer (else the coordinator wakes every period).
    fn armed_by_lane(&self) -> bool {
        self.timer.is_some()
    }

    /// Fire in `after` (zero: never), unless the sampler stopped.
    fn set(&self, after: Duration) {
        let Some(timer) = &self.timer else { return };
        let _g = lock(&self.guard);
        if self.stop.load(Ordering::Relaxed) {
            return;
        }
        arm(timer, after);
    }

    /// The sampler stops: wake the coordinator now.
    fn ring(&self) {
        let Some(timer) = &self.timer else { return };
        let _g = lock(&self.guard);
        arm(timer, Duration::from_nanos(1));
    }

    /// Until the timer fires.
    fn wait(&self) {
        let Some(timer) = &self.timer else { return };
        let mut expirations = [0u8; 8];
        loop {
            match rustix::io::read(timer, &mut expirations) {
                Err(rustix::io::Errno::INTR) => continue,
                // A read that fails (it should not) must not spin: as a tick.
                Err(_) => thread::sleep(Duration::from_millis(100)),
                Ok(_) => {}
            }
            return;
        }
    }
}

fn arm(timer: &rustix::fd::OwnedFd, after: Duration) {
    use rustix::time::{Itimerspec, TimerfdTimerFlags, Timespec, timerfd_settime};
    let zero = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    let spec = Itimerspec {
        it_interval: zero,
        it_value: Timespec::try_from(after).unwrap_or(zero),
    };
    if let Err(e) = timerfd_settime(timer, TimerfdTimerFlags::empty(), &spec) {
        tracing::debug!("setting the sampler's watchdog: {e}");
    }
}

/// One lane: the GPUs it reads in turn, and where its current round of readings is.
#[derive(Debug)]
struct Lane {
    /// Ascending.
    gpus: Vec<usize>,
    /// The GPU in a driver call now.
    busy: Option<usize>,
    /// When the current round of readings began.
    round: Instant,
}

/// The lanes, as the coordinator keeps them.
struct Lanes {
    lanes: Vec<Arc<Mutex<Lane>>>,
    ctx: Arc<LaneContext>,
}

impl Lanes {
    fn spawn(&mut self, gpus: Vec<usize>) {
        debug_assert!(!gpus.is_empty(), "a lane with no GPU ends at once");
        let lane = Arc::new(Mutex::new(Lane {
            gpus,
            busy: None,
            round: Instant::now(),
        }));
        self.lanes.push(Arc::clone(&lane));
        let ctx = Arc::clone(&self.ctx);
        thread::Builder::new()
            .name("sample-gpus".into())
            .spawn(move || run_lane(&lane, &ctx))
            .expect("spawning a sampler thread");
    }

    /// One lane reads every GPU.
    fn solo(&self) -> bool {
        match self.lanes.as_slice() {
            [one] => lock(one).gpus.len() == self.ctx.slots.len(),
            _ => false,
        }
    }

    /// Move the GPUs of every lane that is not in a call onto one lane; the lanes left with
    /// none end before their next round.
    fn merge_idle(&mut self) {
        let mut kept: Option<&Arc<Mutex<Lane>>> = None;
        let mut moved = Vec::new();
        for lane in &self.lanes {
            let mut l = lock(lane);
            if l.busy.is_some() {
                continue;
            }
            match kept {
                None => kept = Some(lane),
                Some(_) => moved.append(&mut l.gpus),
            }
        }
        if let Some(kept) = kept {
            // A round under way reads the moved GPUs above where it is, the next one all.
            let mut l = lock(kept);
            l.gpus.extend(moved);
            l.gpus.sort_unstable();
        }
        self.lanes.retain(|l| !lock(l).gpus.is_empty());
    }

    /// Every lane whose round began `after` ago or more and is still in a call keeps only the
    /// GPU in that call; its other GPUs move to a new lane.
    fn split_held(&mut self, after: Duration) {
        let mut moved = Vec::new();
        for lane in &self.lanes {
            let mut l = lock(lane);
            let Some(held) = l.busy else { continue };
            if l.gpus.len() < 2 || l.round.elapsed() < after {
                continue;
            }
            let rest: Vec<usize> = l.gpus.iter().copied().filter(|&g| g != held).collect();
            l.gpus = vec![held];
            tracing::info!(
                "GPU {held} has held its sampling thread for {:.0?}: GPUs {rest:?} are read on \
                 another thread from now on",
                l.round.elapsed()
            );
            moved.push(rest);
        }
        for gpus in moved {
            self.spawn(gpus);
        }
    }
}

/// Read the lane's GPUs in turn at `started + k·period` until the sampler stops.
fn run_lane(lane: &Mutex<Lane>, ctx: &LaneContext) {
    loop {
        let solo = {
            let mut l = lock(lane);
            if l.gpus.is_empty() {
                // Its GPUs went to another lane (see `Lanes::merge_idle`).
                return;
            }
            l.round = Instant::now();
            l.gpus.len() == ctx.slots.len()
        };
        if solo {
            ctx.watchdog.set(ctx.period / 2);
        }
        let round = round_of(ctx.started.elapsed(), ctx.period);
        let mut next = 0;
        loop {
            // The lane's GPUs may change between two calls (see `Lanes::split_held`).
            let gpu = {
                let mut l = lock(lane);
                let Some(&gpu) = l.gpus.iter().find(|&&g| g >= next) else {
                    break;
                };
                l.busy = Some(gpu);
                gpu
            };
            let sample = ctx.source.sample_gpu(gpu);
            lock(lane).busy = None;
            if ctx.stop.load(Ordering::Relaxed) {
                return;
            }
            let mut slot = lock(&ctx.slots[gpu]);
            let slot = &mut *slot;
            let sample = keep_identity(slot.answered.then_some(&slot.known), sample);
            slot.known.remember(&sample);
            slot.answered = true;
            slot.fresh = Some(sample);
            next = gpu + 1;
        }
        if solo {
            ctx.watchdog.set(Duration::ZERO);
        }
        // Every GPU's reading is in: the round's snapshot needs no other thread.
        if lock(lane).gpus.len() == ctx.slots.len() {
            ctx.publisher.publish(round);
        }
        let wait = until_next_reading(ctx.started.elapsed(), ctx.period);
        match ctx.stop_rx.recv_timeout(wait) {
            Err(RecvTimeoutError::Timeout) => {}
            // Disconnected: the sampler stopped (nobody ever sends).
            _ => return,
        }
    }
}

/// From `elapsed` since the start to the next reading time (a multiple of `period`), strictly
/// after now.
fn until_next_reading(elapsed: Duration, period: Duration) -> Duration {
    let p = period.as_nanos().max(1);
    let e = elapsed.as_nanos();
    let next = (e / p + 1) * p;
    Duration::from_nanos(u64::try_from(next - e).unwrap_or(u64::MAX))
}

/// A GPU that fell off the bus is still the GPU it was: where a reading lacks its name, UUID or
/// PCI bus id (NVML answers GPU_IS_LOST even to those), they are carried over from the last one
/// that had them (`prev`, what the GPU's last reading was known as), so `status`, alerts and
/// `/metrics` series keyed on the UUID follow the GPU.
fn keep_identity(prev: Option<&Identity>, mut s: GpuSample) -> GpuSample {
    if let Some(p) = prev {
        if s.uuid.is_none() {
            s.uuid.clone_from(&p.uuid);
        }
        // A GPU whose UUID changed is another GPU: nothing else of the old one is its.
        if s.uuid == p.uuid {
            if s.name.is_none() {
                s.name.clone_from(&p.name);
            }
            if s.pci_bus_id.is_none() {
                s.pci_bus_id.clone_from(&p.pci_bus_id);
            }
        }
    }
    s
}

impl Identity {
    /// Take `s`'s identity (into the strings already here: no allocation while it is the same).
    fn remember(&mut self, s: &GpuSample) {
        self.uuid.clone_from(&s.uuid);
        self.name.clone_from(&s.name);
        self.pci_bus_id.clone_from(&s.pci_bus_id);
    }
}

fn wait_for_slots(slots: &Slots, limit: Duration) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if slots.iter().all(|s| lock(s).answered) {
            return;
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// The snapshot now: each GPU's new reading (taken out of its slot), else its last one again
/// (from `prev`), marked stale when it is older than `stale_after`.
fn assemble(
    node: &NodeInfo,
    slots: &Slots,
    prev: &Snapshot,
    host: Option<&mut HostSampler>,
    stale_after: Duration,
) -> Snapshot {
    let now = now_s();
    let stale_s = stale_after.as_secs_f64();
    let gpus = slots
        .iter()
        .enumerate()
        .map(|(i, slot)| {
            let last = {
                let mut slot = lock(slot);
                match slot.fresh.take() {
                    Some(s) => Some(s),
                    None if slot.answered => prev.gpus.get(i).cloned(),
                    None => None,
                }
            };
            match last {
                Some(mut s) => {
                    s.stale = now - s.time_s > stale_s;
                    s
                }
                // Never answered yet: a placeholder that says so, every value absent.
                None => GpuSample {
                    index: i as u32,
                    stale: true,
                    time_s: now,
                    ..GpuSample::default()
                },
            }
        })
        .collect();
    Snapshot {
        time_s: now,
        node: node.clone(),
        gpus,
        host: host.map(|h| h.sample()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
        let end = Instant::now() + limit;
        while Instant::now() < end {
            if f() {
                return true;
            }
            thread::sleep(Duration::from_millis(10));
        }
        false
    }

    #[test]
    fn hung_gpu_goes_stale_while_others_keep_sampling() {
        // GPU 1 hangs in its first call until released; GPU 0 answers with a counter.
        let (src, release_tx) = Counting::new(2, Some(1));
        let config = SamplerConfig {
            period: Duration::from_millis(20),
            stale_after: Duration::from_millis(100),
            host: false,
        };
        let sampler = Sampler::start(src, config);
        let first = sampler.latest();
        assert_eq!(first.gpus.len(), 2);
        assert!(first.gpus[1].stale, "never answered: a stale placeholder");
        assert_eq!(
            first.gpus[1].power_w, None,
            "placeholder values are absent, not zero"
        );

        let rx = sampler.subscribe();
        let p0 = first.gpus[0].power_w.unwrap();
        assert!(
            wait_until(Duration::from_secs(3), || {
                let s = rx.recv_timeout(Duration::from_secs(1)).unwrap();
                !s.gpus[0].stale && s.gpus[0].power_w.unwrap() > p0 + 3.0 && s.gpus[1].stale
            }),
            "GPU 0 must keep updating while GPU 1 hangs"
        );
        // Released, GPU 1 recovers.
        release_tx.send(()).unwrap();
        assert!(wait_until(Duration::from_secs(3), || !sampler
            .latest()
            .gpus[1]
            .stale));
    }

    /// GPUs that answer at once, or (`hang`) one that hangs in every call until released;
    /// records which threads call.
    struct Counting {
        gpus: usize,
        hang: Option<usize>,
        release: Mutex<Option<Receiver<()>>>,
        threads: Mutex<std::collections::HashSet<thread::ThreadId>>,
        calls: AtomicU64,
    }

    impl Counting {
        fn new(gpus: usize, hang: Option<usize>) -> (Arc<Counting>, Sender<()>) {
            let (tx, rx) = bounded(1);
            let src = Counting {
                gpus,
                hang,
                release: Mutex::new(Some(rx)),
                threads: Mutex::default(),
                calls: AtomicU64::new(0),
            };
            (Arc::new(src), tx)
        }
        /// How many threads have called since the last `forget_threads`.
        fn threads(&self) -> usize {
            self.threads.lock().unwrap().len()
        }
        fn forget_threads(&self) {
            self.threads.lock().unwrap().clear();
        }
    }

    impl Source for Counting {
        fn node_info(&self) -> NodeInfo {
            NodeInfo::default()
        }
        fn gpu_count(&self) -> usize {
            self.gpus
        }
        fn sample_gpu(&self, index: usize) -> GpuSample {
            self.threads.lock().unwrap().insert(thread::current().id());
            if Some(index) == self.hang {
                let rx = self.release.lock().unwrap().take();
                if let Some(rx) = rx {
                    let _ = rx.recv();
                }
            }
            let n = self.calls.fetch_add(1, Ordering::Relaxed);
            GpuSample {
                index: index as u32,
                time_s: now_s(),
                power_w: Some(n as f64),
                ..GpuSample::default()
            }
        }
    }

    fn config(period_ms: u64) -> SamplerConfig {
        SamplerConfig {
            period: Duration::from_millis(period_ms),
            stale_after: Duration::from_millis(period_ms * 5),
            host: false,
        }
    }

    #[test]
    fn one_thread_reads_every_gpu_while_all_answer() {
        let (src, _release) = Counting::new(8, None);
        let sampler = Sampler::start(Arc::clone(&src) as Arc<dyn Source>, config(20));
        let first = sampler.latest();
        assert!(first.gpus.iter().all(|g| !g.stale && g.power_w.is_some()));
        assert_eq!(src.threads(), 8, "the first readings, one thread per GPU");
        src.forget_threads();
        let rx = sampler.subscribe();
        for _ in 0..5 {
            let s = rx.recv_timeout(Duration::from_secs(2)).unwrap();
            assert!(s.gpus.iter().all(|g| !g.stale), "{s:?}");
        }
        assert!(src.calls.load(Ordering::Relaxed) >= 8 * 5);
        assert_eq!(src.threads(), 1, "then one lane for eight healthy GPUs");
    }

    #[test]
    fn a_gpu_that_hangs_first_holds_only_its_own_thread() {
        // GPU 0 is read first: it hangs before the others are read at all.
        let (src, release) = Counting::new(3, Some(0));
        let sampler = Sampler::start(Arc::clone(&src) as Arc<dyn Source>, config(100));
        let first = sampler.latest();
        assert!(first.gpus[0].stale && first.gpus[0].power_w.is_none());
        assert!(
            first.gpus[1..]
                .iter()
                .all(|g| !g.stale && g.power_w.is_some()),
            "the others make the first snapshot: {first:?}"
        );
        src.forget_threads();
        let rx = sampler.subscribe();
        let p1 = first.gpus[1].power_w.unwrap();
        assert!(
            wait_until(Duration::from_secs(3), || {
                let s = rx.recv_timeout(Duration::from_secs(1)).unwrap();
                s.gpus[0].stale && !s.gpus[2].stale && s.gpus[1].power_w.unwrap() > p1 + 4.0
            }),
            "GPUs 1 and 2 must keep updating while GPU 0 hangs"
        );
        assert_eq!(
            src.threads(),
            1,
            "one lane for the rest; the hung one is still in its call"
        );
        release.send(()).unwrap();
        assert!(wait_until(Duration::from_secs(3), || !sampler
            .latest()
            .gpus[0]
            .stale));
    }

    #[test]
    fn a_gpu_that_hangs_later_is_left_behind_within_a_period() {
        struct Later(Arc<Counting>, AtomicBool);
        impl Source for Later {
            fn node_info(&self) -> NodeInfo {
                NodeInfo::default()
            }
            fn gpu_count(&self) -> usize {
                self.0.gpu_count()
            }
            fn sample_gpu(&self, index: usize) -> GpuSample {
                // GPU 1 answers until `hang` is set, then hangs once.
                if index == 1 && !self.1.load(Ordering::Relaxed) {
                    self.0
                        .threads
                        .lock()
                        .unwrap()
                        .insert(thread::current().id());
                    return GpuSample {
                        index: 1,
                        time_s: now_s(),
                        ..GpuSample::default()
                    };
                }
                self.0.sample_gpu(index)
            }
        }
        let (counting, release) = Counting::new(4, Some(1));
        let src = Arc::new(Later(Arc::clone(&counting), AtomicBool::new(false)));
        let sampler = Sampler::start(Arc::clone(&src) as Arc<dyn Source>, config(50));
        assert!(sampler.latest().gpus.iter().all(|g| !g.stale));
        let rx = sampler.subscribe();
        counting.forget_threads();
        for _ in 0..3 {
            rx.recv_timeout(Duration::from_secs(1)).unwrap();
        }
        assert_eq!(counting.threads(), 1, "one lane for four healthy GPUs");
        src.1.store(true, Ordering::Relaxed);
        // Stale after 5 periods (250 ms); GPU 3 is read after the hung GPU 1 on its lane.
        assert!(
            wait_until(Duration::from_secs(3), || {
                let s = rx.recv_timeout(Duration::from_secs(1)).unwrap();
                s.gpus[1].stale
            }),
            "GPU 1 goes stale"
        );
        let before = rx.recv_timeout(Duration::from_secs(1)).unwrap();
        let mut after = before.clone();
        for _ in 0..4 {
            after = rx.recv_timeout(Duration::from_secs(1)).unwrap();
        }
        for g in [0, 2, 3] {
            assert!(!after.gpus[g].stale, "GPU {g}: {after:?}");
            assert!(
                after.gpus[g].time_s > before.gpus[g].time_s,
                "GPU {g} updates"
            );
        }
        assert_eq!(counting.threads(), 2);
        release.send(()).unwrap();
    }

    #[test]
    fn a_lost_gpu_keeps_its_last_known_identity() {
        /// GPU 0 reads normally once, then is lost (NVML gives not even its UUID).
        struct Falls(AtomicU64);
        impl Source for Falls {
            fn node_info(&self) -> NodeInfo {
                NodeInfo::default()
            }
            fn gpu_count(&self) -> usize {
                1
            }
            fn sample_gpu(&self, index: usize) -> GpuSample {
                let n = self.0.fetch_add(1, Ordering::SeqCst);
                let known = GpuSample {
                    index: index as u32,
                    time_s: now_s(),
                    name: Some("NVIDIA H100 80GB HBM3".into()),
                    uuid: Some("GPU-1234".into()),
                    pci_bus_id: Some("00000000:18:00.0".into()),
                    power_w: Some(300.0),
                    ..GpuSample::default()
                };
                if n == 0 {
                    known
                } else {
                    GpuSample {
                        index: index as u32,
                        time_s: now_s(),
                        lost: true,
                        ..GpuSample::default()
                    }
                }
            }
        }
        let src = Arc::new(Falls(AtomicU64::new(0)));
        let sampler = Sampler::start(Arc::clone(&src) as Arc<dyn Source>, config(20));
        assert!(wait_until(Duration::from_secs(3), || sampler.latest().gpus
            [0]
        .lost));
        let g = sampler.latest().gpus[0].clone();
        assert_eq!(g.uuid.as_deref(), Some("GPU-1234"));
        assert_eq!(g.name.as_deref(), Some("NVIDIA H100 80GB HBM3"));
        assert_eq!(g.pci_bus_id.as_deref(), Some("00000000:18:00.0"));
        assert_eq!(g.power_w, None, "only the identity is carried over");
    }

    #[test]
    fn a_stopped_sampler_lets_go_of_its_sink() {
        // One lane reads both GPUs, so the coordinator sleeps on the lane's timer: the stop
        // must wake it too, or it holds the sink forever.
        let (src, _release) = Counting::new(2, None);
        let (tx, rx) = bounded::<()>(0);
        let sampler = Sampler::start_with_sink(src, config(50), move |_| {
            let _ = &tx;
        });
        thread::sleep(Duration::from_millis(200));
        drop(sampler);
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(2)),
            Err(RecvTimeoutError::Disconnected),
            "the sink is dropped once the sampler's threads have stopped"
        );
    }

    #[test]
    fn the_first_readings_are_taken_in_parallel() {
        /// Each GPU's first call waits (up to 5 s) for every GPU to be in its first call.
        struct Together {
            in_call: AtomicU64,
            met: AtomicU64,
        }
        impl Source for Together {
            fn node_info(&self) -> NodeInfo {
                NodeInfo::default()
            }
            fn gpu_count(&self) -> usize {
                4
            }
            fn sample_gpu(&self, index: usize) -> GpuSample {
                if self.in_call.load(Ordering::SeqCst) < 4 {
                    self.in_call.fetch_add(1, Ordering::SeqCst);
                    if wait_until(Duration::from_secs(5), || {
                        self.in_call.load(Ordering::SeqCst) >= 4
                    }) {
                        self.met.fetch_add(1, Ordering::SeqCst);
                    }
                }
                GpuSample {
                    index: index as u32,
                    time_s: now_s(),
                    power_w: Some(1.0),
                    ..GpuSample::default()
                }
            }
        }
        let src = Arc::new(Together {
            in_call: AtomicU64::new(0),
            met: AtomicU64::new(0),
        });
        let sampler = Sampler::start(Arc::clone(&src) as Arc<dyn Source>, config(2000));
        assert_eq!(src.met.load(Ordering::SeqCst), 4, "all four read at once");
        assert!(sampler.latest().gpus.iter().all(|g| !g.stale));
    }
}
