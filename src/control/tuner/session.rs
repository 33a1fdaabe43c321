//! A search on a live run through the daemon: the session `gpupilot tune energy` and the
//! console's tuner both run. [`prepare`] opens the run as the daemon sees it (its GPUs, or a
//! job's ranks' GPUs, their limits and starting caps) and sets up a [`Tuner`] with the
//! [`TuneSettings`] asked for; [`DaemonRun`] is the [`LiveRun`] that [`drive`](super::live::drive)
//! polls (the GPUs' energy counters read at each poll, samples and steps from the run's metrics
//! reports, caps through the daemon, so every change lands in the node's events and needs the
//! rights any cap needs); [`save_result`] writes the result to the run's directory.
//!
//! A window's edges are reports (their samples and steps are exact there); the energy at an
//! edge comes from the two reads of the counters that bracket it, read after the reports were
//! fetched, so it is interpolated between reads and never extrapolated. A cap is set just
//! after a read and the counters are read again at once, so the bracket that holds a change
//! spans one request; an edge inside it is not used (the next report is). Where the power is
//! steady between two reads the energy is exact; otherwise each edge is off by at most
//! a quarter of the power's swing between the reads times the time between them.
//! [`stop_flag`] turns Ctrl-C, SIGTERM and SIGHUP into a stop, so the caps go back first.
//!
//! The daemon is behind [`TunerDaemon`], which its client implements (`client::tuner`): this
//! module speaks no protocol.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context as _;

use super::job::{JobTally, Scope, energy_of, scope};
use super::joint::{JointTuner, batch_plan};
use super::live::LiveRun;
use super::{Observation, TuneResult, TuneSettings, Tuner, TunerConfig, Unit};
use crate::control::PowerLimits;
use crate::control::jobs::gpu_ranges;
use crate::control::status::ControlStatus;
use crate::profile::VisibleGpus;
use crate::telemetry::{GpuSample, Snapshot};
use crate::training::{KnobName, MetricsPoint, TrainerInfo};

/// File the result is written to, in the run's directory.
pub const RESULT_FILE: &str = "tune-energy.json";

/// How far a GPU's cap may be from the one the search set (the driver keeps milliwatts).
const CAP_SLACK_W: f64 = 1.0;

/// Reads of the energy counters kept (one a poll): a report older than the oldest has no
/// bracket and is no window's edge.
const READS_KEPT: usize = 64;

/// One read of the run's GPUs' energy counters.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Read {
    /// When, on the clock the reports are stamped with (Unix seconds, the daemon's).
    t: f64,
    /// The run's GPUs together, joules.
    energy_j: f64,
    /// A cap was set since the read before: the power between the two is not one cap's.
    after_change: bool,
}

/// What the tuner asks of the daemon: the run, the GPUs' newest samples, the run's metrics
/// reports, the GPUs' power limits, and caps. The daemon's client implements it; a test may
/// fake it.
pub trait TunerDaemon {
    /// The run `spec` names (an id, a unique id prefix, a run name, or `last`).
    fn run(&self, spec: &str) -> anyhow::Result<RunSeen>;
    /// The daemon's newest snapshot; `None` while it has no GPU telemetry.
    fn snapshot(&self) -> anyhow::Result<Option<Snapshot>>;
    /// GPUs `gpus` read now, at the call (a window's energy is the counters read at its
    /// edges). A daemon that cannot read them on demand answers with its newest snapshot's,
    /// each stamped with when it was read; `None` while it has no GPU telemetry.
    fn read_gpus(&self, gpus: &[u32]) -> anyhow::Result<Option<Vec<GpuSample>>> {
        let _ = gpus;
        Ok(self.snapshot()?.map(|s| s.gpus))
    }
    /// The run's metrics reports from `since` on (`u64::MAX`: none, only its trainer's side).
    fn reports(&self, run: &str, since: u64) -> anyhow::Result<Reports>;
    /// Each GPU's power limits, by index; `None` where they cannot be read.
    fn power_limits(&self) -> anyhow::Result<Vec<(u32, Option<PowerLimits>)>>;
    /// Cap `gpus` at `watts`, with `why` for the node's events.
    fn set_cap(&self, gpus: Vec<u32>, watts: f64, why: &str) -> anyhow::Result<()>;
    /// The node's control loops (`gpupilot thermal`): governors and budget.
    fn loops(&self) -> anyhow::Result<ControlStatus>;
    /// Ask run `run`'s trainer for batch size `batch` (`gpupilot set RUN batch-size N`: every
    /// rank of a job at one step). `Ok(false)`: no trainer is attached now, ask again later.
    fn set_batch(&self, run: &str, batch: u32, why: &str) -> anyhow::Result<bool>;
    /// Each GPU's SM clock range and the lock gpupilot set on it, by index (a clock search).
    fn clocks(&self) -> anyhow::Result<Vec<GpuClocks>> {
        Ok(Vec::new())
    }
    /// Lock `gpus`' SM clocks within `[min_mhz, max_mhz]`, with `why` for the node's events.
    fn lock_clocks(
        &self,
        gpus: Vec<u32>,
        min_mhz: u32,
        max_mhz: u32,
        why: &str,
    ) -> anyhow::Result<()> {
        let _ = (gpus, min_mhz, max_mhz, why);
        anyhow::bail!("this daemon cannot lock clocks")
    }
    /// Unlock `gpus`' SM clocks.
    fn reset_clocks(&self, gpus: Vec<u32>, why: &str) -> anyhow::Result<()> {
        let _ = (gpus, why);
        anyhow::bail!("this daemon cannot lock clocks")
    }
}

/// One GPU's SM clocks as a clock search needs them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuClocks {
    pub index: u32,
    /// The range a lock may name, MHz; `None` where it cannot be read.
    pub range: Option<(u32, u32)>,
    /// The lock gpupilot set, `[min, max]` MHz (`None`: unlocked).
    pub locked: Option<[u32; 2]>,
}

/// A run, as the tuner needs to know it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSeen {
    /// Its full id.
    pub id: String,
    /// Its profile's name (searches on runs of one profile learn from each other).
    pub name: String,
    /// Its directory, where the result goes.
    pub dir: std::path::PathBuf,
    /// The GPUs it sees: its `CUDA_VISIBLE_DEVICES` (`all` when unset).
    pub gpus: String,
    /// Whether it is training now.
    pub running: bool,
    /// Whether its last attempt ended and the next is scheduled (its restart policy's backoff).
    pub restarting: bool,
    /// Its attempt (one more per restart: an out-of-memory restarts it).
    pub attempt: u32,
}

impl RunSeen {
    /// Training, or between two attempts: a search on it goes on.
    pub fn live(&self) -> bool {
        self.running || self.restarting
    }

    /// The attempt it trains in, or the one it starts next when between two: an attempt that
    /// ends is counted once, whether the restart comes at once or after a backoff.
    fn attempt_now(&self) -> u32 {
        self.attempt + u32::from(self.restarting)
    }
}

/// A run's metrics reports from some point on, and its trainer's side.
#[derive(Debug, Clone, PartialEq)]
pub struct Reports {
    /// The reports, oldest first.
    pub points: Vec<MetricsPoint>,
    /// Where the next reports start (the `since` of the next call).
    pub next: u64,
    /// Whether this is a job of several ranks, and their GPUs.
    pub trainer: TrainerInfo,
}

/// Run `spec` seen through `daemon`, and a search on it as `settings` ask, ready to
/// [`drive`](super::live::drive) (the console's tuner starts the same way, with the default
/// settings).
pub fn prepare<D: TunerDaemon>(
    daemon: D,
    spec: &str,
    settings: &TuneSettings,
) -> anyhow::Result<(DaemonRun<D>, Tuner)> {
    let mut run = DaemonRun::open(daemon, spec)?;
    let Some(first) = run.limits.first() else {
        anyhow::bail!(
            "run {} uses no GPU the daemon sees: no power cap to tune",
            run.id
        );
    };
    let (min_w, max_w, default_w) = run.limits.iter().fold(
        (first.min_w, first.max_w, first.default_w),
        |(lo, hi, d), l| (lo.max(l.min_w), hi.min(l.max_w), d.min(l.default_w)),
    );
    let mut cfg = TunerConfig::new(min_w, default_w, max_w, first.current_w, run.gpus.len())
        .with_settings(settings);
    cfg.max_power_w = run.limits.iter().map(|l| l.max_w).sum();
    run.unit = cfg.window.unit;
    let tuner = Tuner::new(cfg)?;
    Ok((run, tuner))
}

/// Put each GPU of `start_locks` back as it was before a clock search: unlocked where it had
/// no lock (one request for all of them), its own lock where it had one.
pub fn restore_locks<D: TunerDaemon>(
    daemon: &D,
    start_locks: &BTreeMap<u32, Option<[u32; 2]>>,
    why: &str,
) -> anyhow::Result<()> {
    let unlocked: Vec<u32> = start_locks
        .iter()
        .filter(|(_, l)| l.is_none())
        .map(|(g, _)| *g)
        .collect();
    if !unlocked.is_empty() {
        daemon.reset_clocks(unlocked, why)?;
    }
    for (g, l) in start_locks {
        if let Some([lo, hi]) = l {
            daemon.lock_clocks(vec![*g], *lo, *hi, why)?;
        }
    }
    Ok(())
}

/// The clock search on `run` (`--knob clocks|both`), scored as `caps` (the cap search's
/// configuration: eta, window, the cost's max power): from the highest clock the run's GPUs
/// share (unlocked, every saving's reference) down to half of it ([`super::knob`]).
pub fn prepare_clocks<D: TunerDaemon>(
    run: &mut DaemonRun<D>,
    caps: &TunerConfig,
    settings: &TuneSettings,
) -> anyhow::Result<Tuner> {
    let all = run.daemon.clocks()?;
    let mut range: Option<(u32, u32)> = None;
    for g in &run.gpus {
        let r = all
            .iter()
            .find(|c| c.index == *g)
            .and_then(|c| c.range)
            .with_context(|| {
                format!("GPU {g}'s SM clock range cannot be read, so its clocks cannot be tuned")
            })?;
        range = Some(range.map_or(r, |(lo, hi)| (lo.max(r.0), hi.min(r.1))));
        let locked = all.iter().find(|c| c.index == *g).and_then(|c| c.locked);
        run.start_locks.insert(*g, locked);
    }
    let (min, max) = range.context("the run uses no GPU: no clocks to tune")?;
    anyhow::ensure!(
        min < max,
        "the run's GPUs share no SM clock range ({min}..{max} MHz)"
    );
    let (floor, step) = super::knob::clock_plan(f64::from(min), f64::from(max), settings.step_mhz);
    run.clock_range = Some((min, max));
    // A lock in force is where the search starts and what a stop puts back.
    let start = run
        .start_locks
        .values()
        .flatten()
        .map(|l| f64::from(l[1]))
        .fold(f64::from(max), f64::min);
    let cfg = TunerConfig {
        min_w: floor,
        max_w: f64::from(max),
        default_w: f64::from(max),
        start_w: start.max(floor),
        step_w: step,
        prior_w: None,
        ..caps.clone()
    };
    Ok(Tuner::new(cfg)?)
}

/// The joint search of batch size and cap on `run` (`--with batch-size`), its caps as
/// `tuner`'s: the batches within the run's batch-size range (its profile's, else its
/// trainer's) and no larger than `fits` (the memory headroom predicted), from the batch it
/// trains at.
pub fn joint<D: TunerDaemon>(
    run: &mut DaemonRun<D>,
    tuner: &Tuner,
    fits: Option<u32>,
) -> anyhow::Result<JointTuner> {
    let Some((start, min, max)) = run.batch_knob else {
        anyhow::bail!(
            "run {} has no batch size the tuner can change: its trainer must be attached (the \
             gpupilot SDK) and its profile give a [knobs.batch_size] range (min, max)",
            run.id
        );
    };
    let max = fits.map_or(max, |f| f.min(max)).max(start);
    let plan = batch_plan(start, min, max);
    run.start_batch = Some(start);
    Ok(JointTuner::new(tuner.config().clone(), plan, start)?)
}

/// The largest batch predicted to fit on `gpus` (their memory now, at batch `batch`): the
/// advisor's bound when it has one batch size to go by (all memory in use scales with the
/// batch) at `fit_share` of the smallest GPU's memory. `None` without memory figures.
pub fn batch_fits(gpus: &[GpuSample], batch: u32, fit_share: f64) -> Option<u32> {
    let used = gpus.iter().filter_map(|g| g.memory_used_bytes).max()? as f64;
    let total = gpus.iter().filter_map(|g| g.memory_total_bytes).min()? as f64;
    if used <= 0.0 || batch == 0 {
        return None;
    }
    let per_sample = used / f64::from(batch);
    Some(
        (fit_share * total / per_sample)
            .floor()
            .min(f64::from(u32::MAX)) as u32,
    )
}

/// Write `result` to the run's directory ([`RESULT_FILE`]); where it went.
pub fn save_result<D: TunerDaemon>(
    run: &DaemonRun<D>,
    result: &TuneResult,
) -> anyhow::Result<std::path::PathBuf> {
    let path = run.dir.join(RESULT_FILE);
    // Replaced in one step, never written through a link put in its place.
    let text = serde_json::to_string_pretty(result)? + "\n";
    crate::config::safe_fs::write_atomic(&path, text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// Ctrl-C, SIGTERM and SIGHUP (the terminal went away) turn it true instead of ending the
/// process, so the caps can be put back first.
pub fn stop_flag() -> Arc<AtomicBool> {
    use tokio::signal::unix::SignalKind;
    flag_on(vec![
        SignalKind::interrupt(),
        SignalKind::terminate(),
        SignalKind::hangup(),
    ])
}

/// A flag that any of `kinds` turns true instead of ending the process.
pub fn flag_on(kinds: Vec<tokio::signal::unix::SignalKind>) -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let set = Arc::clone(&flag);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("tune-signals".into())
        .spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .build()
            else {
                let _ = ready_tx.send(());
                return;
            };
            rt.block_on(async move {
                use tokio::signal::unix::signal;
                let mut streams = Vec::new();
                for k in kinds {
                    if let Ok(s) = signal(k) {
                        streams.push(s);
                    }
                }
                let _ = ready_tx.send(());
                let waits = streams.iter_mut().map(|s| Box::pin(s.recv()));
                let _ = futures::future::select_all(waits).await;
                set.store(true, Ordering::SeqCst);
            });
        });
    if spawned.is_ok() {
        let _ = ready_rx.recv();
    }
    flag
}

/// The run, seen through the daemon.
pub struct DaemonRun<D: TunerDaemon> {
    daemon: D,
    pub id: String,
    pub dir: std::path::PathBuf,
    pub gpus: Vec<u32>,
    limits: Vec<PowerLimits>,
    /// Each GPU's cap before the search.
    start_w: BTreeMap<u32, f64>,
    /// A job of several ranks: how many (None: one process).
    ranks: Option<u32>,
    /// Its ranks did not say their GPUs: the GPUs the run sees stand in.
    gpus_from_run: bool,
    unit: Unit,
    since: u64,
    /// The samples and the step, from the reports (every rank's).
    tally: JobTally,
    /// The newest reads of the run's GPUs' energy counters, oldest first.
    reads: Vec<Read>,
    /// A cap was set since the last read.
    cap_changed: bool,
    /// Reports newer than the newest read: counted once a read brackets them.
    held: Vec<MetricsPoint>,
    /// The batch-size knob when the search opened: (value, min, max).
    batch_knob: Option<(u32, u32, u32)>,
    /// A joint search's starting batch: what a stop puts back.
    pub start_batch: Option<u32>,
    /// The batch asked last, and whether the trainer took the request (`false`: no trainer
    /// attached then; asked again at the next poll).
    asked_batch: Option<(u32, bool)>,
    /// Each rank's newest batch in its reports.
    batches: BTreeMap<Option<u32>, u32>,
    /// The run's attempt when last seen: a restart while a batch is tried is its out-of-memory.
    attempt: Option<u32>,
    oom: bool,
    /// A batch change was asked: a stop puts the starting batch back.
    batch_changed: bool,
    /// The cap the search set last and measures at (None before its first, and once the
    /// starting caps are back): checked on the GPUs at every observation.
    trial: Option<f64>,
    /// A clock search: the SM clock range the run's GPUs share, MHz, each GPU's lock before
    /// it, the top of the lock it set last, and whether it locked any.
    clock_range: Option<(u32, u32)>,
    pub start_locks: BTreeMap<u32, Option<[u32; 2]>>,
    trial_clock: Option<f64>,
    clocks_changed: bool,
}

/// An error when the node's control loops may move the caps of `gpus`: a thermal governor on
/// one of them, or a node budget. Their caps would not be the search's (a cap set under them
/// is a ceiling they hold the GPU below), and what the search starts from and puts back would
/// be what they hold the GPUs at, not the caps the operator set.
fn loops_leave_alone(loops: &ControlStatus, gpus: &[u32]) -> anyhow::Result<()> {
    let governed: Vec<u32> = loops
        .governors
        .iter()
        .map(|g| g.gpu)
        .filter(|g| gpus.contains(g))
        .collect();
    let off = "turn it off for the search";
    if !governed.is_empty() {
        anyhow::bail!(
            "a thermal governor moves the power cap of GPU {}, so the search's caps would not be \
             the GPUs': {off} (`gpupilot thermal off --gpu {}`)",
            gpu_ranges(&governed),
            governed
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",")
        );
    }
    if let Some(b) = &loops.budget {
        anyhow::bail!(
            "a node budget of {:.0} W shares the power caps, so the search's caps would not be \
             the GPUs': {off} (`gpupilot budget off`)",
            b.budget_w
        );
    }
    Ok(())
}

impl<D: TunerDaemon> DaemonRun<D> {
    fn open(daemon: D, spec: &str) -> anyhow::Result<DaemonRun<D>> {
        let info = daemon.run(spec)?;
        let attempt = info.attempt_now();
        let snap = daemon.snapshot()?.context(
            "the daemon has no GPU telemetry: the tuner needs the GPUs' energy counters",
        )?;
        // The trainer side only (no reports): whether this is a job, and its ranks' GPUs.
        let trainer = daemon.reports(&info.id, u64::MAX)?.trainer;
        let batch_knob = trainer
            .knobs
            .iter()
            .find(|k| k.knob == KnobName::BatchSize)
            .and_then(|k| {
                let v = u32::try_from(k.value?).ok()?;
                let r = k.range.as_ref()?;
                let max = r.max.map_or(Some(u32::MAX), |m| u32::try_from(m).ok())?;
                Some((v, u32::try_from(r.min).ok()?.max(1), max))
            });
        let scope = scope(&trainer).map_err(|e| anyhow::anyhow!("run {}: {e}", info.id))?;
        if VisibleGpus::parse(Some(&info.gpus)).is_none() {
            anyhow::bail!(
                "run {} sees no GPU (its CUDA_VISIBLE_DEVICES is empty: `gpus = []` in its \
                 profile, or set so): there is no power cap to tune",
                info.id
            );
        }
        let (gpus, ranks, gpus_from_run) = match scope {
            Scope::Run => (run_gpus(&info.gpus, &snap.gpus)?, None, false),
            Scope::Job { gpus, ranks } if gpus.is_empty() => {
                (run_gpus(&info.gpus, &snap.gpus)?, Some(ranks), true)
            }
            Scope::Job { gpus, ranks } => {
                if let Some(g) = gpus
                    .iter()
                    .find(|g| !snap.gpus.iter().any(|s| s.index == **g))
                {
                    anyhow::bail!(
                        "run {}: a rank trains on GPU {g}, which is not a GPU this daemon sees",
                        info.id
                    );
                }
                (gpus, Some(ranks), false)
            }
        };
        loops_leave_alone(&daemon.loops()?, &gpus)?;
        let settings = daemon.power_limits()?;
        let mut limits = Vec::new();
        let mut start_w = BTreeMap::new();
        for i in &gpus {
            let l = settings
                .iter()
                .find(|(index, _)| index == i)
                .and_then(|(_, power)| *power)
                .with_context(|| {
                    format!("GPU {i}'s power limits cannot be read, so its cap cannot be tuned")
                })?;
            start_w.insert(*i, l.current_w);
            limits.push(l);
        }
        Ok(DaemonRun {
            daemon,
            id: info.id,
            dir: info.dir,
            gpus,
            limits,
            start_w,
            ranks,
            gpus_from_run,
            unit: Unit::Steps,
            since: 0,
            tally: JobTally::from_now(),
            reads: Vec::new(),
            cap_changed: false,
            held: Vec::new(),
            batch_knob,
            start_batch: None,
            asked_batch: None,
            batches: BTreeMap::new(),
            attempt: Some(attempt),
            oom: false,
            batch_changed: false,
            trial: None,
            clock_range: None,
            start_locks: BTreeMap::new(),
            trial_clock: None,
            clocks_changed: false,
        })
    }

    /// The batch size the run trains at, as its knob said when the search opened.
    pub fn batch_now(&self) -> Option<u32> {
        self.batch_knob.map(|k| k.0)
    }

    /// Where the node's GPU figures come from (`nvml`, `sim`), from the newest snapshot.
    pub fn telemetry_source(&self) -> Option<String> {
        let snap = self.daemon.snapshot().ok()??;
        Some(snap.node.source).filter(|s| !s.is_empty())
    }

    /// The run's GPUs in the newest snapshot (for the memory headroom).
    pub fn gpu_samples(&self) -> anyhow::Result<Vec<GpuSample>> {
        let snap = self.daemon.snapshot()?.context("no GPU telemetry")?;
        Ok(snap
            .gpus
            .into_iter()
            .filter(|g| self.gpus.contains(&g.index))
            .collect())
    }

    fn ask_batch(&mut self, batch: u32, why: &str) -> Result<(), String> {
        let taken = self
            .daemon
            .set_batch(&self.id, batch, why)
            .map_err(|e| format!("{e:#}"))?;
        self.asked_batch = Some((batch, taken));
        self.batch_changed = true;
        Ok(())
    }

    /// An attempt of `run` ended while the joint search runs (restarted at once, or waiting to
    /// be): the trainer ran out of memory (or crashed) at the batch being tried, and the next
    /// one starts anew. Not when the batch asked last never reached a trainer: that attempt
    /// ended at another batch (one a restart carried over, before the search could ask).
    fn note_attempt(&mut self, run: &RunSeen) {
        let attempt = run.attempt_now();
        if self.attempt.is_some_and(|a| a != attempt) && self.start_batch.is_some() {
            self.oom |= self.batch_taken_now();
            self.batches.clear();
        }
        self.attempt = Some(attempt);
    }

    /// Whether the batch asked last reached a trainer (true when none was asked).
    fn batch_taken_now(&self) -> bool {
        self.asked_batch.is_none_or(|(_, taken)| taken)
    }

    /// The batch every rank reports (`None` while they differ), and whether the batch asked
    /// was refused (a rank that knows it would not fit) since the last look.
    fn batch_seen(&mut self, trainer: &TrainerInfo, points: &[MetricsPoint]) -> Option<u32> {
        for p in points {
            if let Some(b) = p.report.batch_size.and_then(|b| u32::try_from(b).ok()) {
                self.batches.insert(p.rank, b);
            }
        }
        if let Some((asked, true)) = self.asked_batch {
            let knob = trainer.knobs.iter().find(|k| k.knob == KnobName::BatchSize);
            let refused = knob.is_some_and(|k| {
                k.pending.is_none()
                    && k.value != Some(i64::from(asked))
                    && k.last_outcome
                        .as_deref()
                        .is_some_and(|o| o.starts_with("rejected") || o.starts_with("called off"))
            });
            if refused {
                self.oom = true;
                self.asked_batch = None;
            }
        }
        let mut all = self.batches.values();
        let first = *all.next()?;
        all.all(|b| *b == first).then_some(first)
    }

    /// What is tuned, for people: `run r1 on GPU 0,1`, or for a job `job r1 (4 ranks) on GPUs
    /// 0-3 together, one cap for all`.
    pub fn what(&self) -> String {
        match self.ranks {
            None => format!("run {} on GPU {}", self.id, gpu_ranges(&self.gpus)),
            Some(n) => format!(
                "job {} ({n} ranks) on GPUs {} together, one cap for all{}",
                self.id,
                gpu_ranges(&self.gpus),
                if self.gpus_from_run {
                    " (its ranks do not say their GPUs: the run's GPUs)"
                } else {
                    ""
                }
            ),
        }
    }

    /// Each GPU's cap before the search: what a stop puts back.
    pub fn start_caps(&self) -> &BTreeMap<u32, f64> {
        &self.start_w
    }

    /// A search resumed after a restart: the caps to put back are those from before it began,
    /// not the caps it left set.
    pub fn set_start_caps(&mut self, start_w: BTreeMap<u32, f64>) {
        self.start_w = start_w;
    }

    /// An error when a GPU of the run is not at `w`, the cap the search set and measures: the
    /// power it measured would be another cap's. The loops keep a cap set from outside as a
    /// ceiling, not a setting: a GPU the thermal governor or the node budget holds lower stays
    /// there.
    fn check_trial(&self, w: f64) -> Result<(), String> {
        let limits = self.daemon.power_limits().map_err(|e| e.to_string())?;
        for (g, l) in limits {
            let Some(l) = l.filter(|_| self.gpus.contains(&g)) else {
                continue;
            };
            if (l.current_w - w).abs() <= CAP_SLACK_W {
                continue;
            }
            let how = if l.current_w < w {
                "the thermal governor or the node budget holds it lower (turn them off for the \
                 search: `gpupilot thermal off`, `gpupilot budget off`), or someone set it"
            } else {
                "someone raised it"
            };
            return Err(format!(
                "GPU {g}'s power cap is {:.0} W, not the {w:.0} W the search is measuring: {how}",
                l.current_w
            ));
        }
        Ok(())
    }

    /// An error when a GPU of the run is not locked at the clock the search set and measures.
    fn check_trial_clock(&self, mhz: f64) -> Result<(), String> {
        let Some((min, max)) = self.clock_range else {
            return Ok(());
        };
        let want = (mhz < f64::from(max)).then_some([min, mhz.round() as u32]);
        for c in self.daemon.clocks().map_err(|e| e.to_string())? {
            if self.gpus.contains(&c.index) && c.locked != want {
                return Err(format!(
                    "GPU {}'s SM clocks are {}, not the {} the search is measuring: someone \
                     changed them",
                    c.index,
                    c.locked.map_or("unlocked".into(), |l| format!(
                        "locked {}–{} MHz",
                        l[0], l[1]
                    )),
                    want.map_or("unlocked clocks".into(), |l| format!(
                        "{}–{} MHz",
                        l[0], l[1]
                    ))
                ));
            }
        }
        Ok(())
    }

    /// Put each GPU's SM clocks back as they were before the search.
    fn restore_clocks(&mut self) -> Result<(), String> {
        if !std::mem::take(&mut self.clocks_changed) {
            return Ok(());
        }
        self.trial_clock = None;
        restore_locks(
            &self.daemon,
            &self.start_locks,
            "energy tuner: search stopped, clocks restored",
        )
        .map_err(|e| e.to_string())
    }

    fn cap(&self, gpus: Vec<u32>, watts: f64, why: &str) -> Result<(), String> {
        self.daemon
            .set_cap(gpus, watts, why)
            .map_err(|e| e.to_string())
    }

    /// Read the run's GPUs' energy counters now (a read no newer than the last is dropped: a
    /// daemon answering from its snapshots may not have a new one).
    fn read_energy(&mut self) -> Result<(), String> {
        let Some(gpus) = self
            .daemon
            .read_gpus(&self.gpus)
            .map_err(|e| e.to_string())?
        else {
            return Ok(());
        };
        let energy_j = energy_of(&self.gpus, &gpus)?;
        let times: Vec<f64> = gpus
            .iter()
            .filter(|g| self.gpus.contains(&g.index))
            .map(|g| g.time_s)
            .collect();
        let t = times.iter().sum::<f64>() / times.len().max(1) as f64;
        if self.reads.last().is_none_or(|r| r.t < t) {
            self.reads.push(Read {
                t,
                energy_j,
                after_change: std::mem::take(&mut self.cap_changed),
            });
            if self.reads.len() > READS_KEPT {
                self.reads.remove(0);
            }
        }
        Ok(())
    }

    /// Energy of the run's GPUs at `t`, between the two reads that bracket it; `None` when no
    /// two do (`t` before the oldest read or after the newest) or a cap changed between them.
    fn energy_at(&self, t: f64) -> Option<f64> {
        let i = self.reads.iter().position(|r| r.t >= t)?;
        let b = self.reads[i];
        if b.t == t {
            return Some(b.energy_j);
        }
        let a = *self.reads.get(i.checked_sub(1)?)?;
        if b.after_change {
            return None;
        }
        Some(a.energy_j + (b.energy_j - a.energy_j) * (t - a.t) / (b.t - a.t))
    }
}

impl<D: TunerDaemon> LiveRun for DaemonRun<D> {
    fn observe(&mut self) -> Result<Option<Observation>, String> {
        // A budget or a governor turned on mid-search would hold the GPUs below it: what is
        // measured from now on would be another cap's.
        if let Some(w) = self.trial {
            self.check_trial(w)?;
        }
        if let Some(f) = self.trial_clock {
            self.check_trial_clock(f)?;
        }
        let m = self
            .daemon
            .reports(&self.id, self.since)
            .map_err(|e| e.to_string())?;
        self.since = m.next;
        if self.start_batch.is_some() {
            // A joint search looks for an attempt that ended here too, so that the batch to go
            // back to is asked at once: while the run waits for its next attempt, that attempt
            // starts with it.
            let run = self.daemon.run(&self.id).map_err(|e| e.to_string())?;
            self.note_attempt(&run);
        }
        if let Some((b, false)) = self.asked_batch {
            // No trainer was attached to take it (a run restarting): ask again.
            self.ask_batch(b, "energy tuner: trying a batch size")?;
        }
        let batch = self.batch_seen(&m.trainer, &m.points);
        // After the reports: every report fetched lies before this read.
        self.read_energy()?;
        self.held.extend(m.points);
        let newest = self.reads.last().map_or(f64::NEG_INFINITY, |r| r.t);
        let ready = self.held.iter().take_while(|p| p.t <= newest).count();
        if ready == 0 && !self.oom {
            return Ok(None);
        }
        let ready: Vec<MetricsPoint> = self.held.drain(..ready).collect();
        self.tally.absorb_all(&ready);
        let Some(t) = self.tally.last_t() else {
            return Ok(None);
        };
        if self.unit == Unit::Steps && self.tally.step().is_none() {
            return Err(
                "the run's metrics carry no step counter: tune it with a window in seconds (--seconds N)"
                    .into(),
            );
        }
        let Some(energy_j) = self.energy_at(t) else {
            return Ok(None);
        };
        Ok(Some(Observation {
            // The daemon stamps reports with its clock; the tuner only needs differences.
            time_s: t,
            steps: self.tally.step().map(|s| s as f64),
            energy_j,
            samples: self.tally.samples(),
            batch,
            oom: std::mem::take(&mut self.oom),
        }))
    }

    fn set_cap(&mut self, watts: f64) -> Result<(), String> {
        self.cap(self.gpus.clone(), watts, "energy tuner: trying a cap")?;
        // Checked at the next observation, before any of it is counted.
        self.trial = Some(watts);
        // The read before the change was the observation's: reading again now closes the
        // bracket that holds it. A read that fails here fails again at the next observation,
        // which says so; meanwhile the change stays marked on the next read.
        self.cap_changed = true;
        let _ = self.read_energy();
        Ok(())
    }

    fn set_clock(&mut self, mhz: f64) -> Result<(), String> {
        let (min, max) = self
            .clock_range
            .ok_or("the search read no clock range for the run's GPUs")?;
        let why = "energy tuner: trying an SM clock lock";
        let set = if mhz >= f64::from(max) {
            self.daemon.reset_clocks(self.gpus.clone(), why)
        } else {
            self.daemon
                .lock_clocks(self.gpus.clone(), min, mhz.round() as u32, why)
        };
        set.map_err(|e| e.to_string())?;
        self.clocks_changed = true;
        self.trial_clock = Some(mhz);
        // As for a cap: the power between the reads either side of the change is no one
        // clock's.
        self.cap_changed = true;
        let _ = self.read_energy();
        Ok(())
    }

    fn set_batch(&mut self, batch: u32) -> Result<(), String> {
        self.ask_batch(batch, "energy tuner: trying a batch size")
    }

    fn restore(&mut self) -> Result<(), String> {
        self.trial = None;
        self.restore_clocks()?;
        // The caps first: a batch that cannot go back (the run ended) must not keep them.
        // GPUs that started at the same cap go back in one request.
        let mut by_cap: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
        for (gpu, w) in &self.start_w {
            by_cap.entry(w.to_bits()).or_default().push(*gpu);
        }
        for (bits, gpus) in by_cap {
            self.cap(
                gpus,
                f64::from_bits(bits),
                "energy tuner: search stopped, cap restored",
            )?;
        }
        if let (Some(b), true) = (self.start_batch, self.batch_changed) {
            let missed = match self
                .ask_batch(b, "energy tuner: search stopped, batch size restored")
            {
                Err(e) => Some(e),
                Ok(()) if !self.batch_taken_now() => Some(format!(
                    "no trainer is attached to take it (`gpupilot set {} batch-size {b}` once one is)",
                    self.id
                )),
                Ok(()) => None,
            };
            if let Some(e) = missed {
                // A run that ended has no batch to put back.
                if self.daemon.run(&self.id).is_ok_and(|r| r.live()) {
                    return Err(format!("putting batch size {b} back: {e}"));
                }
            }
        }
        Ok(())
    }

    fn batch_taken(&mut self) -> Result<bool, String> {
        if let Some((b, false)) = self.asked_batch {
            self.ask_batch(b, "energy tuner: trying a batch size")?;
        }
        Ok(self.batch_taken_now())
    }

    fn alive(&mut self) -> Result<bool, String> {
        let run = self.daemon.run(&self.id).map_err(|e| e.to_string())?;
        self.note_attempt(&run);
        // Between two attempts the search waits for the next (bounded by the polls without
        // reports); a batch asked meanwhile is the one the next attempt starts with.
        Ok(run.live())
    }
}

/// The GPU indices a run uses, from its `gpus` (its `CUDA_VISIBLE_DEVICES`: indices or UUIDs;
/// `all` when unset). An empty list is no GPU, not every GPU.
pub fn run_gpus(visible: &str, gpus: &[GpuSample]) -> anyhow::Result<Vec<u32>> {
    VisibleGpus::parse(Some(visible))
        .resolve(gpus.iter().map(|g| (g.index, g.uuid.as_deref())))
        .map_err(|e| anyhow::anyhow!("the run's {e}"))
}

#[cfg(test)]
mod windows;

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// A daemon whose run goes through `states` (running, restarting, attempt), one per look at
    /// the run, the last one staying; one GPU, no reports.
    struct Restarts {
        states: RefCell<Vec<(bool, bool, u32)>>,
    }

    impl TunerDaemon for Restarts {
        fn run(&self, spec: &str) -> anyhow::Result<RunSeen> {
            let mut states = self.states.borrow_mut();
            let (running, restarting, attempt) = if states.len() > 1 {
                states.remove(0)
            } else {
                states[0]
            };
            Ok(RunSeen {
                id: spec.into(),
                name: "p".into(),
                dir: std::path::PathBuf::new(),
                gpus: "all".into(),
                running,
                restarting,
                attempt,
            })
        }
        fn snapshot(&self) -> anyhow::Result<Option<Snapshot>> {
            Ok(Some(Snapshot {
                gpus: vec![GpuSample::default()],
                ..Default::default()
            }))
        }
        fn reports(&self, _: &str, since: u64) -> anyhow::Result<Reports> {
            Ok(Reports {
                points: Vec::new(),
                next: since,
                trainer: TrainerInfo::default(),
            })
        }
        fn power_limits(&self) -> anyhow::Result<Vec<(u32, Option<PowerLimits>)>> {
            let l = PowerLimits {
                current_w: 700.0,
                enforced_w: None,
                default_w: 700.0,
                min_w: 200.0,
                max_w: 700.0,
            };
            Ok(vec![(0, Some(l))])
        }
        fn set_cap(&self, _: Vec<u32>, _: f64, _: &str) -> anyhow::Result<()> {
            Ok(())
        }
        fn loops(&self) -> anyhow::Result<ControlStatus> {
            Ok(ControlStatus::default())
        }
        fn set_batch(&self, _: &str, _: u32, _: &str) -> anyhow::Result<bool> {
            Ok(true)
        }
    }

    #[test]
    fn an_attempt_that_ends_mid_joint_search_is_one_out_of_memory() {
        // Attempt 0 trains, ends and waits for its restart (two looks), attempt 1 trains, then
        // attempt 2 comes at once (on_oom = "halve_batch": no backoff to see).
        let states = vec![
            (true, false, 0),
            (true, false, 0),
            (false, true, 0),
            (false, true, 0),
            (true, false, 1),
            (true, false, 2),
            (false, false, 2),
        ];
        let daemon = Restarts {
            states: RefCell::new(states),
        };
        let mut run = DaemonRun::open(daemon, "r1").unwrap();
        run.start_batch = Some(64);
        let mut looks = Vec::new();
        for _ in 0..6 {
            let live = run.alive().unwrap();
            looks.push((live, std::mem::take(&mut run.oom)));
        }
        assert_eq!(
            looks,
            [
                (true, false),
                // Waiting for its next attempt: live, and the attempt's end is counted now...
                (true, true),
                (true, false),
                // ...not again when the attempt waited for starts.
                (true, false),
                (true, true),
                // Ended for good.
                (false, false),
            ]
        );
        // An attempt that ends before the batch asked last reached a trainer ended at another.
        let daemon = Restarts {
            states: RefCell::new(vec![(true, false, 0), (false, true, 0), (true, false, 1)]),
        };
        let mut run = DaemonRun::open(daemon, "r1").unwrap();
        run.start_batch = Some(64);
        run.asked_batch = Some((128, false));
        assert!(run.alive().unwrap());
        assert!(!run.oom);
        run.asked_batch = Some((128, true));
        assert!(run.alive().unwrap());
        assert!(!run.oom, "the same attempt, started");
    }

    #[test]
    fn a_search_leaves_gpus_alone_only_where_no_loop_moves_their_caps() {
        use crate::control::governor::{Mode, Target};
        use crate::control::status::{BudgetStatus, GovernorStatus};
        let governor = |gpu| GovernorStatus {
            gpu,
            target: Target::Celsius(78.0),
            target_c: Some(78.0),
            mode: Mode::Tracking,
            cap_w: Some(600.0),
            user_cap_w: Some(700.0),
            last: None,
            by: "alice".into(),
        };
        let mut loops = ControlStatus {
            governors: vec![governor(2), governor(3)],
            ..Default::default()
        };
        // A governor on another GPU is no matter.
        assert!(loops_leave_alone(&loops, &[0, 1]).is_ok());
        let e = loops_leave_alone(&loops, &[1, 3]).unwrap_err().to_string();
        assert!(
            e.contains("moves the power cap of GPU 3") && e.contains("thermal off --gpu 3`"),
            "{e}"
        );
        loops.governors.clear();
        loops.budget = Some(BudgetStatus {
            budget_w: 2800.0,
            total_w: 2800.0,
            demand_w: 3000.0,
            caps: vec![(0, 700.0)],
            infeasible: None,
            by: "alice".into(),
        });
        let e = loops_leave_alone(&loops, &[0]).unwrap_err().to_string();
        assert!(e.contains("a node budget of 2800 W"), "{e}");
    }

    #[test]
    fn visible_devices_name_gpus_by_index_or_uuid() {
        let gpus: Vec<GpuSample> = (0..3)
            .map(|i| GpuSample {
                index: i,
                uuid: Some(format!("GPU-{i}aaa")),
                ..Default::default()
            })
            .collect();
        assert_eq!(run_gpus("all", &gpus).unwrap(), [0, 1, 2]);
        // `gpus = []`, CUDA_VISIBLE_DEVICES="" or ",": no GPU, never every GPU.
        assert!(run_gpus("", &gpus).unwrap().is_empty());
        assert!(run_gpus(",", &gpus).unwrap().is_empty());
        assert_eq!(run_gpus("2,0", &gpus).unwrap(), [2, 0]);
        assert_eq!(run_gpus("GPU-1", &gpus).unwrap(), [1]);
        let e = run_gpus("7", &gpus).unwrap_err().to_string();
        assert!(e.contains("`7`"), "{e}");
    }
}
