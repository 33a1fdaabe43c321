//! Energy-tuning jobs: the search of `tune energy` (`control::tuner`) run by the daemon, so
//! that no client has to live for it. The CLI and the console start a job (`tune_start`) and
//! watch it (`tune_status`, the `tune` node events); `tune_stop` ends it and puts the starting
//! caps back.
//!
//! A job runs on a thread of its own with its own connection to this daemon (the session of
//! `control::tuner::session` over the daemon's client, exactly as a client would search): every
//! cap goes through `power_cap`, so it lands in the node's events and needs the rights any cap
//! needs. When this daemon may not set caps (a user's daemon, not root) and a system daemon
//! answers, the caps go to the system daemon instead, as `gpupilot --system power cap` would.
//! The one thing a job does not ask over the socket is the GPUs' energy counters: it reads
//! them from the daemon's telemetry source at each poll, at the moment it needs them (a
//! snapshot may be a second old at the default rate, and a window is a few seconds).
//!
//! Each job's record ([`TuneJob`]) is rewritten under `$STATE/tune/` at every step (files
//! opened without following links, read back bounded). A daemon that starts finds the jobs the
//! last one left unfinished: one that was killed mid-search (its caps still at a probe) or
//! stopped (it put the caps back first). Where the run still trains, the job resumes, reusing
//! the caps already measured (`resumed` event); otherwise the starting caps come back
//! (`restored`). A run that ends mid-search, a stop, or a refused cap put the caps back too.
//!
//! Lock order: the job table, then one job's record; neither is held across a request to the
//! daemon or a wait.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use super::base::{RequestError, lock};
use super::events::NodeLog;
use crate::client::{Client, ClientError};
use crate::config::Paths;
use crate::config::safe_fs;
use crate::control::PowerLimits;
use crate::control::tuner::live::{Outcome, drive};
use crate::control::tuner::record::{JobState, MAX_RECORD_BYTES, TuneJob};
use crate::control::tuner::record::{saving_line, suggestion};
use crate::control::tuner::session::{
    DaemonRun, GpuClocks, Reports, RunSeen, TunerDaemon, batch_fits, joint, prepare,
    prepare_clocks, restore_locks, save_result,
};
use crate::control::tuner::{
    JointTuner, Knob, KnobSearch, Progress, Search, TuneSettings, Tuner, TunerConfig,
};
use crate::protocol::{ErrorCode, NodeEvent};
use crate::telemetry::{GpuSample, Snapshot, Source};
use crate::time::rfc3339;

/// Between two polls of the run's counters.
const POLL: Duration = Duration::from_secs(1);
/// How long `tune_stop` waits for the caps to be back.
const STOP_WAIT: Duration = Duration::from_secs(20);
/// How long a daemon that stops waits for its jobs to put their caps back.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(8);
/// How long a resumed job waits for the run's trainer to attach again.
const RESUME_WAIT: Duration = Duration::from_secs(60);
/// The most job records a daemon reads at start (older ones are left on disk, unread).
const MAX_RECORDS: usize = 256;

/// One job: its record, shared with its thread, and the flag that stops it.
struct Slot {
    job: Arc<Mutex<TuneJob>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// The daemon's tuning jobs. See the module doc.
pub struct Tuning {
    paths: Paths,
    dir: PathBuf,
    events: Arc<NodeLog>,
    jobs: Mutex<BTreeMap<String, Slot>>,
    /// The daemon is stopping: a job that ends now is suspended, not cancelled.
    stopping: Arc<AtomicBool>,
    /// Where the jobs read the energy counters (the daemon's telemetry source).
    counters: Arc<OnceLock<Arc<dyn Source>>>,
}

/// What a job's thread needs besides its record.
#[derive(Clone)]
struct Ctx {
    paths: Paths,
    dir: PathBuf,
    events: Arc<NodeLog>,
    stopping: Arc<AtomicBool>,
    counters: Arc<OnceLock<Arc<dyn Source>>>,
}

impl Tuning {
    /// The jobs recorded under `$STATE/tune`, read but not started (see [`Tuning::resume`]).
    pub fn new(paths: Paths, events: Arc<NodeLog>) -> Tuning {
        let dir = paths.state.join("tune");
        let mut jobs = BTreeMap::new();
        for job in read_records(&dir) {
            jobs.insert(
                job.id.clone(),
                Slot {
                    job: Arc::new(Mutex::new(job)),
                    stop: Arc::new(AtomicBool::new(false)),
                    thread: None,
                },
            );
        }
        Tuning {
            paths,
            dir,
            events,
            jobs: Mutex::new(jobs),
            stopping: Arc::new(AtomicBool::new(false)),
            counters: Arc::new(OnceLock::new()),
        }
    }

    /// The jobs read the GPUs' energy counters from `source` (the daemon's telemetry); set
    /// once, before [`Tuning::resume`]. Without it they read the daemon's snapshots.
    pub fn reads_from(&self, source: Arc<dyn Source>) {
        let _ = self.counters.set(source);
    }

    fn ctx(&self) -> Ctx {
        Ctx {
            paths: self.paths.clone(),
            dir: self.dir.clone(),
            events: Arc::clone(&self.events),
            stopping: Arc::clone(&self.stopping),
            counters: Arc::clone(&self.counters),
        }
    }

    /// Go on with the jobs the last daemon left unfinished (call once the socket answers).
    pub fn resume(&self) {
        let mut jobs = lock(&self.jobs);
        for slot in jobs.values_mut() {
            let state = lock(&slot.job).state;
            if state.is_final() {
                continue;
            }
            let (job, stop, ctx) = (Arc::clone(&slot.job), Arc::clone(&slot.stop), self.ctx());
            slot.thread = std::thread::Builder::new()
                .name("tune-job".into())
                .spawn(move || resume_job(&ctx, &job, &stop))
                .ok();
        }
    }

    /// `tune_start`: prepare the search on `run` (its GPUs, their limits and caps, through this
    /// daemon), record it, and start it on its thread.
    pub fn start(&self, run: &str, settings: TuneSettings) -> Result<TuneJob, RequestError> {
        // The command line's bounds, whoever wrote the request.
        check_settings(&settings).map_err(|e| RequestError::new(ErrorCode::BadRequest, e))?;
        let internal = |e: String| RequestError::new(ErrorCode::Internal, e);
        let client = JobDaemon::connect(&self.paths)
            .map_err(internal)?
            .reading(self.counters.get().cloned());
        let seen = client
            .run(run)
            .map_err(|e| RequestError::new(ErrorCode::UnknownRun, format!("{e:#}")))?;
        let id = TuneJob::id_for(&seen.id);
        if let Some(s) = lock(&self.jobs).get(&id) {
            if !lock(&s.job).state.is_final() {
                return Err(RequestError::new(
                    ErrorCode::BadState,
                    format!(
                        "run {} is being tuned already (job {id}): `gpupilot tune status {id}`, or \
                         `gpupilot tune stop {id}` first",
                        seen.id
                    ),
                ));
            }
        }
        let (mut live, mut tuner) = prepare(client, &seen.id, &settings)
            .map_err(|e| RequestError::new(ErrorCode::BadRequest, format!("{e:#}")))?;
        // The last result for this profile, on GPUs of the same limits and at the same eta,
        // brackets the golden search first.
        let prior = self
            .prior(&seen.name, tuner.config())
            .map(|(w, job)| (w, format!("{job} (same profile)")))
            .or_else(|| curve_prior(&self.paths.state, &live, tuner.config()));
        if let (Some((w, from)), None) = (&prior, settings.prior_w) {
            let cfg = TunerConfig {
                prior_w: Some(*w),
                ..tuner.config().clone()
            };
            tuner = Tuner::new(cfg)
                .map_err(|e| RequestError::new(ErrorCode::BadRequest, e.to_string()))?;
            tracing::info!(
                "tuning {}: starting from {w:.0} W, the result of {from}",
                seen.id
            );
        }
        let bad = |e: anyhow::Error| RequestError::new(ErrorCode::BadRequest, format!("{e:#}"));
        let search: Box<dyn Search> = match settings.knob {
            Knob::Cap if settings.with_batch => Box::new(self.joint(&mut live, &tuner)?),
            Knob::Cap => Box::new(tuner),
            Knob::Clocks => {
                let clocks = prepare_clocks(&mut live, tuner.config(), &settings).map_err(bad)?;
                Box::new(KnobSearch::clocks(clocks))
            }
            Knob::Both => {
                let clocks = prepare_clocks(&mut live, tuner.config(), &settings).map_err(bad)?;
                Box::new(KnobSearch::both(tuner, clocks))
            }
        };
        for (other, s) in lock(&self.jobs).iter() {
            let j = lock(&s.job);
            if !j.state.is_final() && j.gpus.iter().any(|g| live.gpus.contains(g)) {
                return Err(RequestError::new(
                    ErrorCode::BadState,
                    format!(
                        "job {other} tunes GPU {} already: one search per GPU at a time",
                        j.gpus
                            .iter()
                            .filter(|g| live.gpus.contains(g))
                            .map(u32::to_string)
                            .collect::<Vec<_>>()
                            .join(",")
                    ),
                ));
            }
        }
        let job = TuneJob {
            id: id.clone(),
            run: live.id.clone(),
            name: seen.name.clone(),
            what: match (&prior, settings.prior_w) {
                (Some((w, from)), None) => format!(
                    "{}; the search starts around {w:.0} W, the best cap of {from}",
                    live.what()
                ),
                _ => live.what(),
            },
            gpus: live.gpus.clone(),
            start_w: live.start_caps().iter().map(|(g, w)| (*g, *w)).collect(),
            settings,
            state: JobState::Running,
            started: rfc3339(SystemTime::now()),
            progress: Some(search.progress()),
            result: None,
            why: None,
            restored: None,
            resumed: 0,
            saved: None,
            start_batch: live.start_batch,
            start_locks: live
                .start_locks
                .iter()
                .filter_map(|(g, l)| Some((*g, (*l)?)))
                .collect(),
        };
        let ctx = self.ctx();
        ctx.save(&job)
            .map_err(|e| internal(format!("recording the job: {e}")))?;
        ctx.event(&job, "started", None, None, Some(job.what.clone()));
        let shared = Arc::new(Mutex::new(job.clone()));
        let stop = Arc::new(AtomicBool::new(false));
        let (j, s) = (Arc::clone(&shared), Arc::clone(&stop));
        let thread = std::thread::Builder::new()
            .name("tune-job".into())
            .spawn(move || run_search(&ctx, &j, &s, live, search))
            .map_err(|e| internal(format!("starting the job: {e}")))?;
        lock(&self.jobs).insert(
            id,
            Slot {
                job: shared,
                stop,
                thread: Some(thread),
            },
        );
        Ok(job)
    }

    /// The joint search on `live` (`--with batch-size`): its batches within the run's range and
    /// the memory headroom the advisor's rule predicts from the run's GPUs now.
    fn joint(
        &self,
        live: &mut DaemonRun<JobDaemon>,
        tuner: &Tuner,
    ) -> Result<JointTuner, RequestError> {
        let bad = |e: anyhow::Error| RequestError::new(ErrorCode::BadRequest, format!("{e:#}"));
        let fit_share = crate::advisor::Thresholds::default().headroom_fit_share;
        let fits = live.gpu_samples().ok().and_then(|g| {
            let start = live.batch_now()?;
            batch_fits(&g, start, fit_share)
        });
        joint(live, tuner, fits).map_err(bad)
    }

    /// The best cap of the newest finished job on a run of profile `name`, with the same
    /// limits and eta as `cfg`, and that job's id.
    fn prior(&self, name: &str, cfg: &TunerConfig) -> Option<(f64, String)> {
        if cfg.strategy != crate::control::tuner::Strategy::Golden || name.is_empty() {
            return None;
        }
        let jobs = lock(&self.jobs);
        jobs.values()
            .filter_map(|s| {
                let j = lock(&s.job);
                let r = j.result.as_ref().filter(|r| r.knob.is_cap())?;
                let same = j.name == name
                    && (r.eta - cfg.eta).abs() < 1e-9
                    && (r.default_w - cfg.default_w).abs() < 0.5
                    && r.curve
                        .iter()
                        .all(|p| p.cap_w >= cfg.min_w - 0.5 && p.cap_w <= cfg.max_w + 0.5);
                same.then(|| (j.started.clone(), r.best.cap_w, j.id.clone()))
            })
            .max_by(|a, b| a.0.cmp(&b.0))
            .map(|(_, w, id)| (w, id))
    }

    /// `tune_status`: every job, or the one `spec` names (a job id or a run's id).
    pub fn status(&self, spec: Option<&str>) -> Result<Vec<TuneJob>, RequestError> {
        let jobs = lock(&self.jobs);
        let all: Vec<TuneJob> = jobs.values().map(|s| lock(&s.job).clone()).collect();
        match spec {
            None => Ok(all),
            Some(spec) => {
                let found: Vec<TuneJob> = all.into_iter().filter(|j| names(j, spec)).collect();
                if found.is_empty() {
                    return Err(no_job(spec));
                }
                Ok(found)
            }
        }
    }

    /// `tune_stop`: stop the job `spec` names and wait (bounded) until its caps are back.
    pub fn stop(&self, spec: &str) -> Result<TuneJob, RequestError> {
        let (job, thread) = {
            let mut jobs = lock(&self.jobs);
            let Some(slot) = jobs.values_mut().find(|s| names(&lock(&s.job), spec)) else {
                return Err(no_job(spec));
            };
            if lock(&slot.job).state.is_final() {
                return Ok(lock(&slot.job).clone());
            }
            slot.stop.store(true, Ordering::SeqCst);
            (Arc::clone(&slot.job), slot.thread.take())
        };
        if let Some(t) = thread {
            join_within(t, STOP_WAIT);
        }
        let j = lock(&job).clone();
        Ok(j)
    }

    /// The daemon is stopping: each running job puts its caps back and is suspended, for the
    /// next daemon to resume.
    pub fn stopping(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        let threads: Vec<JoinHandle<()>> = {
            let mut jobs = lock(&self.jobs);
            jobs.values_mut()
                .filter_map(|s| {
                    s.stop.store(true, Ordering::SeqCst);
                    s.thread.take()
                })
                .collect()
        };
        let until = Instant::now() + SHUTDOWN_WAIT;
        for t in threads {
            join_within(t, until.saturating_duration_since(Instant::now()));
        }
    }
}

/// A search's settings within the bounds the command line takes (`protocol::bounds`).
fn check_settings(s: &TuneSettings) -> Result<(), String> {
    use crate::protocol::bounds;
    bounds::ETA.check(s.eta)?;
    bounds::STEP_W.check(s.step_w)?;
    bounds::WARMUP.check(s.window.warmup)?;
    bounds::WINDOW.check(s.window.measure)?;
    if let Some(w) = s.prior_w {
        bounds::CAP_W.named("expected best cap in watts").check(w)?;
    }
    if let Some(f) = s.step_mhz {
        bounds::STEP_MHZ.check(f)?;
    }
    if s.with_batch && s.knob != Knob::Cap {
        return Err(format!(
            "--with batch-size searches the batch with the power cap only, not with --knob {}",
            s.knob.name()
        ));
    }
    Ok(())
}

fn names(j: &TuneJob, spec: &str) -> bool {
    j.id == spec || j.run == spec || (spec.len() >= 4 && j.run.starts_with(spec))
}

fn no_job(spec: &str) -> RequestError {
    RequestError::new(
        ErrorCode::BadRequest,
        format!("no tuning job is named {spec} (a job id, or its run): `gpupilot tune status`"),
    )
}

/// Wait for `t` at most `within`; a thread still running then is left to finish on its own.
fn join_within(t: JoinHandle<()>, within: Duration) {
    let until = Instant::now() + within;
    while !t.is_finished() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    if t.is_finished() {
        let _ = t.join();
    }
}

impl Ctx {
    fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Rewrite the job's record.
    fn save(&self, job: &TuneJob) -> std::io::Result<()> {
        safe_fs::own_dir(&self.dir, safe_fs::DirKind::Private)?;
        let text = serde_json::to_string_pretty(job).map_err(std::io::Error::other)?;
        safe_fs::write_atomic(&self.path(&job.id), text.as_bytes())
    }

    fn save_logged(&self, job: &TuneJob) {
        if let Err(e) = self.save(job) {
            tracing::warn!("recording tuning job {}: {e}", job.id);
        }
    }

    fn event(
        &self,
        job: &TuneJob,
        change: &str,
        cap_w: Option<f64>,
        cost: Option<f64>,
        why: Option<String>,
    ) {
        self.event_from(job, change, None, cap_w, cost, why)
    }

    /// [`event`](Self::event) of a step that moved the caps from `old_w`.
    fn event_from(
        &self,
        job: &TuneJob,
        change: &str,
        old_w: Option<f64>,
        cap_w: Option<f64>,
        cost: Option<f64>,
        why: Option<String>,
    ) {
        self.events.record(NodeEvent::Tune {
            job: job.id.clone(),
            run: job.run.clone(),
            change: change.into(),
            gpus: job.gpus.clone(),
            old_w,
            cap_w,
            cost,
            why,
        });
    }

    /// The job's progress changed: record it, and say each new cap and each measured one.
    fn progress(&self, shared: &Mutex<TuneJob>, p: &Progress) {
        let mut job = lock(shared);
        let before = job.progress.clone();
        let new_cap = before.as_ref().and_then(|b| b.cap_w) != p.cap_w;
        let measured = before.as_ref().map_or(0, |b| b.curve.len()) < p.curve.len();
        let phase = before.as_ref().map(|b| b.phase) != Some(p.phase);
        job.progress = Some(p.clone());
        // A clock search's values are MHz: its events say `clock` and `clock_measured`.
        let clocks = p.knob == Knob::Clocks;
        if measured {
            if let Some(last) = p.curve.last() {
                let change = if clocks { "clock_measured" } else { "measured" };
                self.event(&job, change, Some(last.cap_w), Some(last.cost), None);
            }
        }
        if new_cap {
            if let Some(w) = p.cap_w {
                let same_knob = before.as_ref().is_some_and(|b| b.knob == p.knob);
                if clocks {
                    let old = before.as_ref().and_then(|b| b.cap_w).filter(|_| same_knob);
                    self.event_from(&job, "clock", old, Some(w), None, None);
                } else {
                    // The cap before: the last one tried, or the first GPU's cap at the start.
                    let old_w = before
                        .as_ref()
                        .filter(|_| same_knob)
                        .and_then(|b| b.cap_w)
                        .or_else(|| job.start_w.first().map(|&(_, w)| w));
                    self.event_from(&job, "cap", old_w, Some(w), None, None);
                }
            }
        }
        let batch = |p: Option<&Progress>| p.and_then(|p| p.batch.as_ref()).and_then(|b| b.current);
        let new_batch = batch(before.as_ref()) != batch(Some(p));
        if new_batch {
            if let Some(b) = batch(Some(p)) {
                self.event(
                    &job,
                    "batch",
                    p.cap_w,
                    None,
                    Some(format!("trying batch size {b}")),
                );
            }
        }
        let oom = |p: Option<&Progress>| p.and_then(|p| p.batch.as_ref()).and_then(|b| b.oom);
        if let (None, Some(o)) = (oom(before.as_ref()), oom(Some(p))) {
            self.event(
                &job,
                "oom",
                None,
                None,
                Some(format!(
                    "batch size {o} ran out of memory: the last good batch is back, and batch \
                     {o} and larger are avoided"
                )),
            );
        }
        if new_cap || measured || phase || new_batch {
            self.save_logged(&job);
        }
    }

    /// The search ended as `outcome` says: the job's final (or suspended) state.
    fn finish(
        &self,
        shared: &Mutex<TuneJob>,
        live: &DaemonRun<JobDaemon>,
        outcome: Result<Outcome, String>,
    ) {
        let mut job = lock(shared);
        match outcome {
            Ok(Outcome::Done(result)) => {
                job.saved = Some(
                    save_result(live, &result)
                        .map(|p| p.display().to_string())
                        .map_err(|e| format!("{e:#}")),
                );
                job.state = JobState::Done;
                job.why = Some(result.summary());
                let price = crate::control::settings::load(&self.paths.config)
                    .ok()
                    .and_then(|s| s.price);
                let mut said = result.summary();
                if let Some(line) = saving_line(&result, price.as_ref()) {
                    said.push_str(&format!("; {line}"));
                }
                said.push_str(&format!("; {}", suggestion(&result).replace("\n\n", "\n")));
                let done = if result.knob == Knob::Clocks {
                    "clock_done"
                } else {
                    "done"
                };
                self.event(
                    &job,
                    done,
                    Some(result.best.cap_w),
                    Some(result.best.cost),
                    Some(said),
                );
                job.result = Some(*result);
            }
            Ok(Outcome::Cancelled { why, restored }) => {
                let suspended = self.stopping.load(Ordering::SeqCst);
                job.state = if suspended {
                    JobState::Suspended
                } else {
                    JobState::Cancelled
                };
                let why = if suspended {
                    "the daemon stopped".to_string()
                } else {
                    why
                };
                let said = match &restored {
                    Ok(()) => format!("{why}; the starting caps are back"),
                    Err(e) => format!("{why}; putting the starting caps back failed: {e}"),
                };
                self.event(
                    &job,
                    if suspended { "suspended" } else { "cancelled" },
                    None,
                    None,
                    Some(said),
                );
                job.why = Some(why);
                job.restored = Some(restored);
            }
            Err(e) => {
                job.state = JobState::Failed;
                self.event(&job, "failed", None, None, Some(e.clone()));
                job.why = Some(e);
            }
        }
        self.save_logged(&job);
    }
}

/// A job's search, from its first cap (or, resumed, its next) to its end.
fn run_search(
    ctx: &Ctx,
    shared: &Mutex<TuneJob>,
    stop: &AtomicBool,
    mut live: DaemonRun<JobDaemon>,
    mut tuner: Box<dyn Search>,
) {
    let outcome = drive(
        tuner.as_mut(),
        &mut live,
        stop,
        || std::thread::sleep(POLL),
        |p| ctx.progress(shared, p),
    );
    ctx.finish(shared, &live, outcome);
}

/// A job the last daemon left unfinished: resume it if its run still trains, else put its
/// starting caps back (when the last daemon died before it could).
fn resume_job(ctx: &Ctx, shared: &Mutex<TuneJob>, stop: &AtomicBool) {
    let job = lock(shared).clone();
    let deadline = Instant::now() + RESUME_WAIT;
    let why = loop {
        if stop.load(Ordering::SeqCst) {
            break "stopped before it could resume".to_string();
        }
        if job.settings.knob != Knob::Cap {
            break format!(
                "a search of the SM clocks starts over: `gpupilot tune energy {} --knob {}`",
                job.run,
                job.settings.knob.name()
            );
        }
        let reading = ctx.counters.get().cloned();
        let attempt = JobDaemon::connect(&ctx.paths).and_then(|d| {
            let d = d.reading(reading);
            match d.run(&job.run) {
                Ok(r) if !r.live() => return Err("the run is not training any more".into()),
                Ok(_) => {}
                Err(e) => return Err(format!("{e:#}")),
            }
            prepare(d, &job.run, &job.settings).map_err(|e| format!("{e:#}"))
        });
        match attempt {
            Ok((mut live, tuner)) if live.gpus == job.gpus => {
                live.set_start_caps(job.start_caps());
                live.start_batch = job.start_batch;
                // From a known state: the starting caps (and batch) first (a daemon killed
                // mid-search left a probe's), then the search goes on from what was measured.
                if let Err(e) = restore(&ctx.paths, &job.start_caps(), batch_to_restore(&job)) {
                    // A trainer that reconnects to this daemon takes the batch once it does.
                    if e.starts_with(NO_TRAINER) && Instant::now() < deadline {
                        std::thread::sleep(POLL);
                        continue;
                    }
                    break e;
                }
                let cfg = TunerConfig {
                    start_w: job
                        .start_w
                        .first()
                        .map_or(tuner.config().start_w, |(_, w)| *w),
                    ..tuner.config().clone()
                };
                let batch = job.progress.as_ref().and_then(|p| p.batch.clone());
                let tuner: Box<dyn Search> = match (Tuner::new(cfg.clone()), job.start_batch, batch)
                {
                    (Err(e), ..) => break e.to_string(),
                    (Ok(_), Some(start), Some(b)) => {
                        match JointTuner::new(cfg, b.planned.clone(), start) {
                            Ok(t) => Box::new(t.resumed(job.measured(), Some(&b))),
                            Err(e) => break e.to_string(),
                        }
                    }
                    (Ok(t), ..) => Box::new(t.with_points(job.measured())),
                };
                let measured = job.measured().len();
                {
                    let mut j = lock(shared);
                    j.state = JobState::Running;
                    j.resumed += 1;
                    ctx.event(
                        &j,
                        "resumed",
                        None,
                        None,
                        Some(format!(
                            "a daemon restarted mid-search; the run still trains: the search goes on, \
                             {measured} cap(s) measured already"
                        )),
                    );
                    ctx.save_logged(&j);
                }
                run_search(ctx, shared, stop, live, tuner);
                return;
            }
            Ok((live, _)) => {
                break format!(
                    "the run's GPUs changed ({:?} then, {:?} now)",
                    job.gpus, live.gpus
                );
            }
            Err(e) if e.contains("not training") || Instant::now() >= deadline => break e,
            Err(_) => std::thread::sleep(POLL),
        }
    };
    // Not resumed: a job the last daemon left mid-search still has a probe's cap set.
    let restored = match job.state {
        JobState::Running => restore(&ctx.paths, &job.start_caps(), batch_to_restore(&job))
            .and_then(|()| restore_clocks(&ctx.paths, &job)),
        _ => Ok(()),
    };
    let mut j = lock(shared);
    j.state = JobState::Cancelled;
    let said = match &restored {
        Ok(()) => format!("not resumed ({why}); the starting caps are back"),
        Err(e) => format!("not resumed ({why}); putting the starting caps back failed: {e}"),
    };
    ctx.event(&j, "restored", None, None, Some(said));
    j.why = Some(format!("not resumed: {why}"));
    j.restored = Some(restored);
    ctx.save_logged(&j);
}

/// A clock search's GPUs back to their locks from before it (unlocked where they had none).
fn restore_clocks(paths: &Paths, job: &TuneJob) -> Result<(), String> {
    if job.settings.knob == Knob::Cap {
        return Ok(());
    }
    let d = JobDaemon::connect(paths)?;
    // The record keeps the GPUs that were locked; the job's others were not.
    let start_locks = job
        .gpus
        .iter()
        .map(|g| {
            let lock = job
                .start_locks
                .iter()
                .find(|(l, _)| l == g)
                .map(|(_, r)| *r);
            (*g, lock)
        })
        .collect();
    restore_locks(
        &d,
        &start_locks,
        "energy tuner: search not resumed, clocks restored",
    )
    .map_err(|e| format!("{e:#}"))
}

/// Said when a batch cannot go back for want of a trainer to take it.
const NO_TRAINER: &str = "no trainer is attached to the run";

/// A joint search's run and starting batch, when it has one to put back.
fn batch_to_restore(job: &TuneJob) -> Option<(&str, u32)> {
    job.start_batch.map(|b| (job.run.as_str(), b))
}

/// Put each GPU's starting cap back, and a joint search's starting batch (when a trainer is
/// attached to take it: a run that ended has no batch to put back).
fn restore(
    paths: &Paths,
    start_w: &BTreeMap<u32, f64>,
    batch: Option<(&str, u32)>,
) -> Result<(), String> {
    let d = JobDaemon::connect(paths)?;
    let mut by_cap: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    for (gpu, w) in start_w {
        by_cap.entry(w.to_bits()).or_default().push(*gpu);
    }
    for (bits, gpus) in by_cap {
        d.set_cap(
            gpus,
            f64::from_bits(bits),
            "energy tuner: search not resumed, cap restored",
        )
        .map_err(|e| format!("{e:#}"))?;
    }
    if let Some((run, b)) = batch {
        let running = d.run(run).is_ok_and(|r| r.live());
        if running {
            // Not taken: no trainer attached yet (a daemon that just restarted); the caller
            // waits for one that reconnects.
            let taken = d
                .set_batch(
                    run,
                    b,
                    "energy tuner: search interrupted, batch size restored",
                )
                .map_err(|e| format!("{e:#}"))?;
            if !taken {
                return Err(format!(
                    "{NO_TRAINER}: batch size {b} could not be put back (`gpupilot set {run} \
                     batch-size {b}` once it attaches)"
                ));
            }
        }
    }
    Ok(())
}

/// Every job record under `dir`, read bounded and without following links; a file that is
/// not one is left alone (and said in the log).
fn read_records(dir: &Path) -> Vec<TuneJob> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.flatten().take(MAX_RECORDS) {
        let path = e.path();
        if path.extension().and_then(|x| x.to_str()) != Some("json") {
            continue;
        }
        match read_record(&path) {
            Ok(j) => out.push(j),
            Err(e) => tracing::warn!("tuning job record {}: {e}", path.display()),
        }
    }
    out
}

fn read_record(path: &Path) -> Result<TuneJob, String> {
    let f = safe_fs::open_read(path).map_err(|e| e.to_string())?;
    let mut text = String::new();
    f.take(MAX_RECORD_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| e.to_string())?;
    if text.len() as u64 > MAX_RECORD_BYTES {
        return Err(format!("longer than {MAX_RECORD_BYTES} bytes"));
    }
    serde_json::from_str(&text).map_err(|e| e.to_string())
}

/// This daemon as a job sees it: its own socket, and for caps it may not set, the system
/// daemon's.
pub struct JobDaemon {
    own: Client,
    own_socket: PathBuf,
    system: Mutex<Option<Client>>,
    /// The daemon's telemetry source: the energy counters read on demand.
    counters: Option<Arc<dyn Source>>,
}

impl JobDaemon {
    fn connect(paths: &Paths) -> Result<JobDaemon, String> {
        let own = Client::connect(paths)
            .map_err(|e| format!("the tuning job cannot reach its daemon: {e}"))?;
        Ok(JobDaemon {
            own,
            own_socket: crate::ipc::socket_path(paths),
            system: Mutex::new(None),
            counters: None,
        })
    }

    /// Read the GPUs on demand from `counters` (the daemon's telemetry source), not from the
    /// snapshots.
    fn reading(self, counters: Option<Arc<dyn Source>>) -> JobDaemon {
        JobDaemon { counters, ..self }
    }

    /// The system daemon, for a cap this (user's) daemon may not set; `None` when this is the
    /// system daemon or none answers.
    fn system(&self) -> Option<()> {
        let mut slot = lock(&self.system);
        if slot.is_some() {
            return Some(());
        }
        let sys = Paths::system_from_env();
        if crate::ipc::socket_path(&sys) == self.own_socket
            || !crate::client::system::system_daemon_answers()
        {
            return None;
        }
        *slot = Some(crate::client::system::connect(&sys).ok()?);
        Some(())
    }

    /// `change` through this daemon, or through the system daemon where this one may not make
    /// it (a user's daemon, not root) and one answers.
    fn or_system(&self, change: impl Fn(&Client) -> anyhow::Result<()>) -> anyhow::Result<()> {
        let Err(e) = change(&self.own) else {
            return Ok(());
        };
        let refused = matches!(
            e.downcast_ref::<ClientError>(),
            Some(ClientError::Daemon {
                code: ErrorCode::NoPermission,
                ..
            })
        );
        if !refused || self.system().is_none() {
            return Err(e);
        }
        let slot = lock(&self.system);
        match slot.as_ref() {
            Some(sys) => change(sys).map_err(|s| s.context("through the system daemon")),
            None => Err(e),
        }
    }
}

impl TunerDaemon for JobDaemon {
    fn run(&self, spec: &str) -> anyhow::Result<RunSeen> {
        TunerDaemon::run(&self.own, spec)
    }
    fn snapshot(&self) -> anyhow::Result<Option<Snapshot>> {
        self.own.snapshot()
    }
    /// Read from the telemetry source now, on this job's thread (a call the sampler makes
    /// too: the source answers from any thread); a GPU the source does not have is left out.
    fn read_gpus(&self, gpus: &[u32]) -> anyhow::Result<Option<Vec<GpuSample>>> {
        let Some(source) = &self.counters else {
            return Ok(self.own.snapshot()?.map(|s| s.gpus));
        };
        let count = source.gpu_count();
        Ok(Some(
            gpus.iter()
                .filter(|g| (**g as usize) < count)
                .map(|g| source.sample_gpu(*g as usize))
                .collect(),
        ))
    }
    fn reports(&self, run: &str, since: u64) -> anyhow::Result<Reports> {
        self.own.reports(run, since)
    }
    fn power_limits(&self) -> anyhow::Result<Vec<(u32, Option<PowerLimits>)>> {
        self.own.power_limits()
    }
    fn set_batch(&self, run: &str, batch: u32, why: &str) -> anyhow::Result<bool> {
        self.own.set_batch(run, batch, why)
    }
    /// This daemon's loops, and a system daemon's where one answers: caps this daemon may not
    /// set go there, under its loops.
    fn loops(&self) -> anyhow::Result<crate::control::status::ControlStatus> {
        let mut loops = self.own.loops()?;
        if self.system().is_some() {
            if let Some(Ok(sys)) = lock(&self.system).as_ref().map(|s| s.loops()) {
                loops.governors.extend(sys.governors);
                loops.budget = loops.budget.or(sys.budget);
            }
        }
        Ok(loops)
    }
    fn clocks(&self) -> anyhow::Result<Vec<GpuClocks>> {
        self.own.clocks()
    }
    /// As a cap: through the system daemon where this one may not.
    fn lock_clocks(
        &self,
        gpus: Vec<u32>,
        min_mhz: u32,
        max_mhz: u32,
        why: &str,
    ) -> anyhow::Result<()> {
        self.or_system(|d| d.lock_clocks(gpus.clone(), min_mhz, max_mhz, why))
    }
    fn reset_clocks(&self, gpus: Vec<u32>, why: &str) -> anyhow::Result<()> {
        self.or_system(|d| d.reset_clocks(gpus.clone(), why))
    }
    fn set_cap(&self, gpus: Vec<u32>, watts: f64, why: &str) -> anyhow::Result<()> {
        self.or_system(|d| d.set_cap(gpus.clone(), watts, why))
    }
}

/// Where a search with no result of its own profile to start from starts: the cap of a kept
/// `bench power-sweep` curve (GEMM) of the run's GPU model with the least cost at the search's
/// eta, when the curve was taken the way this node's figures are (a simulated curve on a
/// simulated node, a measured one on real GPUs); with the curve in words.
fn curve_prior(
    state: &Path,
    live: &DaemonRun<JobDaemon>,
    cfg: &TunerConfig,
) -> Option<(f64, String)> {
    use crate::control::bench::{Label, Workload, curve};
    if cfg.strategy != crate::control::tuner::Strategy::Golden {
        return None;
    }
    let name = live.gpu_samples().ok()?.into_iter().find_map(|g| g.name)?;
    let simulated = live.telemetry_source()? == "sim";
    let kept = curve::load(state, &name, Workload::Gemm).ok()?;
    if (kept.label == Label::Simulated) != simulated {
        return None;
    }
    let w = curve::cheapest_cap(&kept, cfg.eta, cfg.max_w, cfg.min_w, cfg.max_w)?;
    Some((
        w,
        format!(
            "the {} power sweep of {name} kept in {}",
            kept.label.as_str(),
            curve::path(state, &name, Workload::Gemm).display()
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_too_long_or_behind_a_link_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let long = dir.path().join("tune-a.json");
        std::fs::write(&long, vec![b' '; MAX_RECORD_BYTES as usize + 10]).unwrap();
        assert!(read_record(&long).unwrap_err().contains("longer than"));
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "{}").unwrap();
        let link = dir.path().join("tune-b.json");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(read_record(&link).is_err());
        assert!(read_records(dir.path()).is_empty());
    }

    /// A raw `tune_start` takes the values the command line takes, and no others.
    #[test]
    fn settings_outside_the_command_lines_bounds_are_refused() {
        let ok = TuneSettings::default();
        assert_eq!(check_settings(&ok), Ok(()));
        for (what, s) in [
            ("weight eta", TuneSettings { eta: 1.5, ..ok }),
            (
                "weight eta",
                TuneSettings {
                    eta: f64::NAN,
                    ..ok
                },
            ),
            ("step in watts", TuneSettings { step_w: 0.5, ..ok }),
            ("step in watts", TuneSettings { step_w: 1e9, ..ok }),
            ("number of steps or seconds", {
                let mut s = ok;
                s.window.measure = 1e12;
                s
            }),
            ("warm-up", {
                let mut s = ok;
                s.window.warmup = -1.0;
                s
            }),
            (
                "expected best cap",
                TuneSettings {
                    prior_w: Some(1e308),
                    ..ok
                },
            ),
        ] {
            let e = check_settings(&s).unwrap_err();
            assert!(e.contains(what), "{e}");
        }
        // The bounds' edges, as the command line's parsers take them.
        let mut edge = ok;
        (
            edge.eta,
            edge.step_w,
            edge.window.warmup,
            edge.window.measure,
        ) = (0.0, 1000.0, 0.0, 1e6);
        assert_eq!(check_settings(&edge), Ok(()));
    }
}
