//! Sampling off the caller's thread: one worker per GPU, one coordinator that assembles
//! snapshots at the configured rate.
//!
//! A worker that hangs inside a driver call holds only its own GPU: the coordinator keeps
//! publishing, with that GPU's last reading marked `stale`. Nothing here blocks a reader of
//! [`Sampler::latest`] for longer than a mutex swap.

use super::host::HostSampler;
use super::{GpuSample, NodeInfo, Snapshot, Source, now_s};
use crossbeam_channel::{Receiver, Sender, bounded, select, tick};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

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

type Slots = Arc<Vec<Mutex<Option<GpuSample>>>>;

/// A running sampler. Dropping it stops the workers (a worker stuck in a call exits when the
/// call returns).
pub struct Sampler {
    latest: Arc<Mutex<Snapshot>>,
    subscribers: Arc<Mutex<Vec<Sender<Snapshot>>>>,
    stop: Arc<AtomicBool>,
    stop_tx: Sender<()>,
    _stop_rx: Receiver<()>,
}

impl Sampler {
    /// Start sampling `source` in the background. The first snapshot is taken before this
    /// returns only when every GPU answers within one period; otherwise the slow GPUs appear
    /// as stale placeholders until they answer.
    pub fn start(source: Arc<dyn Source>, config: SamplerConfig) -> Sampler {
        let count = source.gpu_count();
        let slots: Slots = Arc::new((0..count).map(|_| Mutex::new(None)).collect());
        let stop = Arc::new(AtomicBool::new(false));
        // Nobody sends on this channel: dropping the sender (in Drop) disconnects it, which
        // wakes every worker blocked in `select!` at once.
        let (stop_tx, stop_rx) = bounded::<()>(0);
        let node = source.node_info();
        let started = std::time::Instant::now();

        for index in 0..count {
            let source = Arc::clone(&source);
            let slots = Arc::clone(&slots);
            let stop = Arc::clone(&stop);
            let stop_rx = stop_rx.clone();
            let period = config.period;
            thread::Builder::new()
                .name(format!("sample-gpu{index}"))
                .spawn(move || gpu_worker(index, source, slots, stop, stop_rx, period))
                .expect("spawning a sampler thread");
        }

        // Give the workers one period to fill their slots, so the first snapshot is complete
        // when the driver is healthy.
        wait_for_slots(&slots, config.period.max(Duration::from_millis(200)));

        let mut host = config.host.then(HostSampler::new);
        let first = assemble(&node, &slots, host.as_mut(), &config);
        let latest = Arc::new(Mutex::new(first));
        let subscribers: Arc<Mutex<Vec<Sender<Snapshot>>>> = Arc::new(Mutex::new(Vec::new()));
        {
            let latest = Arc::clone(&latest);
            let subscribers = Arc::clone(&subscribers);
            let stop = Arc::clone(&stop);
            let stop_rx = stop_rx.clone();
            thread::Builder::new()
                .name("sample-coord".into())
                .spawn(move || {
                    // Workers read at start + k·period; assembling half a period later keeps
                    // each snapshot between two readings, so none is taken twice or skipped.
                    let p = config.period.as_secs_f64();
                    let since = started.elapsed().as_secs_f64();
                    let next = p / 2.0 + ((since - p / 2.0) / p).ceil().max(0.0) * p;
                    select! {
                        recv(stop_rx) -> _ => return,
                        recv(crossbeam_channel::after(Duration::from_secs_f64(next - since))) -> _ => {}
                    }
                    let ticker = tick(config.period);
                    loop {
                        select! {
                            recv(stop_rx) -> _ => break,
                            recv(ticker) -> _ => {}
                        }
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let snap = assemble(&node, &slots, host.as_mut(), &config);
                        *latest.lock().unwrap_or_else(|e| e.into_inner()) = snap.clone();
                        let mut subs = subscribers.lock().unwrap_or_else(|e| e.into_inner());
                        // A subscriber that is behind skips a snapshot rather than stalling us;
                        // one that has gone away is dropped.
                        subs.retain(|tx| {
                            !matches!(
                                tx.try_send(snap.clone()),
                                Err(crossbeam_channel::TrySendError::Disconnected(_))
                            )
                        });
                    }
                })
                .expect("spawning the sampler coordinator");
        }
        Sampler {
            latest,
            subscribers,
            stop,
            stop_tx,
            _stop_rx: stop_rx,
        }
    }

    /// The newest snapshot.
    pub fn latest(&self) -> Snapshot {
        self.latest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// A channel that receives every new snapshot (a slow reader skips some; it never blocks
    /// the sampler).
    pub fn subscribe(&self) -> Receiver<Snapshot> {
        let (tx, rx) = bounded(2);
        self.subscribers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(tx);
        rx
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Replace our sender so the real one drops now and disconnects the stop channel.
        let (dead, _) = bounded(0);
        drop(std::mem::replace(&mut self.stop_tx, dead));
    }
}

fn gpu_worker(
    index: usize,
    source: Arc<dyn Source>,
    slots: Slots,
    stop: Arc<AtomicBool>,
    stop_rx: Receiver<()>,
    period: Duration,
) {
    let ticker = tick(period);
    loop {
        let sample = source.sample_gpu(index);
        if stop.load(Ordering::Relaxed) {
            break;
        }
        *slots[index].lock().unwrap_or_else(|e| e.into_inner()) = Some(sample);
        select! {
            recv(stop_rx) -> _ => break,
            recv(ticker) -> _ => {}
        }
    }
}

fn wait_for_slots(slots: &Slots, limit: Duration) {
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        if slots
            .iter()
            .all(|s| s.lock().unwrap_or_else(|e| e.into_inner()).is_some())
        {
            return;
        }
        thread::sleep(Duration::from_millis(5));
    }
}

fn assemble(
    node: &NodeInfo,
    slots: &Slots,
    host: Option<&mut HostSampler>,
    config: &SamplerConfig,
) -> Snapshot {
    let now = now_s();
    let stale_s = config.stale_after.as_secs_f64();
    let gpus = slots
        .iter()
        .enumerate()
        .map(|(i, slot)| {
            match slot.lock().unwrap_or_else(|e| e.into_inner()).clone() {
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
    use std::time::Instant;

    /// GPU 1 hangs in its first call until released; GPU 0 answers with a counter.
    struct Hanging {
        calls: AtomicU64,
        release: Mutex<Option<Receiver<()>>>,
    }

    impl Source for Hanging {
        fn node_info(&self) -> NodeInfo {
            NodeInfo::default()
        }
        fn gpu_count(&self) -> usize {
            2
        }
        fn sample_gpu(&self, index: usize) -> GpuSample {
            if index == 1 {
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
        let (release_tx, release_rx) = bounded(1);
        let src = Arc::new(Hanging {
            calls: AtomicU64::new(0),
            release: Mutex::new(Some(release_rx)),
        });
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
}
