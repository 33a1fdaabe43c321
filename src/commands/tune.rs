//! `gpupilot tune energy RUN`: the energy-optimal power-cap search on a live run, as a client
//! of the daemon.
//!
//! Every second it reads the run's metrics reports (steps, batch size, samples/s) and the
//! energy counters of the run's GPUs from the daemon's newest snapshot, feeds them to the
//! [`Tuner`](crate::control::tuner::Tuner), and asks the daemon for each cap (so every change
//! lands in the node's events, and needs the rights any cap needs). When the search ends it
//! applies the best cap, prints the curve and the saving, writes the result to the run's
//! directory (`tune-energy.json`) and prints the `[power] cap_w` line for the profile. Ctrl-C,
//! a hang-up, SIGTERM or the run ending before the search does put each GPU's starting cap
//! back.
//!
//! On a data-parallel job of several ranks it tunes the job: the GPUs its ranks train on, all
//! at one cap, scored on their energy together against the samples of every rank
//! ([`crate::control::tuner::job`]).

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;

use crate::cli::{GlobalArgs, TuneEnergyArgs};
use crate::client::Client;
use crate::config::Paths;
use crate::control::jobs::gpu_ranges;
use crate::control::tuner::Window;
use crate::control::tuner::job::{JobTally, Scope, energy_of, scope};
use crate::control::tuner::live::{LiveRun, Outcome, drive};
use crate::control::tuner::{
    Observation, Phase, Progress, TuneResult, TuneSettings, Tuner, TunerConfig, Unit,
};
use crate::profile::VisibleGpus;
use crate::protocol::{GpuSelection, Request, Response};
use crate::supervisor::RunStatus;

/// File the result is written to, in the run's directory.
pub const RESULT_FILE: &str = "tune-energy.json";

/// `gpupilot tune energy RUN …`.
pub fn tune_energy(g: &GlobalArgs, args: &TuneEnergyArgs) -> anyhow::Result<ExitCode> {
    let client = super::connect_or_spawn(g, &Paths::from_env())?;
    let (mut run, mut tuner) = prepare(client, &args.run, &settings(args))?;
    let max_w = tuner.config().max_w;
    eprintln!(
        "gpupilot: tuning the power cap of {} ({} caps from {max_w:.0} W down, {} + {} {} each, eta {}); Ctrl-C puts the caps back",
        run.what(),
        tuner.plan().len(),
        tuner.config().window.warmup,
        tuner.config().window.measure,
        unit_name(tuner.config().window.unit),
        tuner.config().eta
    );
    let stop = stop_flag();
    let mut last_line = String::new();
    let outcome = drive(
        &mut tuner,
        &mut run,
        &stop,
        || std::thread::sleep(Duration::from_secs_f64(g.refresh.clamp(0.2, 5.0))),
        |p| {
            let line = progress_line(p);
            if line != last_line && !args.json {
                eprintln!("{line}");
                last_line = line;
            }
        },
    )
    .map_err(|e| anyhow::anyhow!(e))?;
    match outcome {
        Outcome::Done(result) => {
            let path = run.dir.join(RESULT_FILE);
            let saved = std::fs::write(&path, serde_json::to_string_pretty(&result)? + "\n");
            if args.json {
                println!("{}", serde_json::to_string_pretty(&result)?);
            } else {
                print!("{}", render_result(&result));
                match &saved {
                    Ok(()) => println!("saved to {}", path.display()),
                    Err(e) => println!("could not save to {}: {e}", path.display()),
                }
                println!(
                    "to start this run's profile at this cap, add:\n\n[power]\ncap_w = {:.0}",
                    result.best.cap_w
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Outcome::Cancelled { why, restored } => {
            match restored {
                Ok(()) => eprintln!(
                    "gpupilot: tuning stopped ({why}); every GPU of the run is back at its starting cap"
                ),
                Err(e) => eprintln!(
                    "gpupilot: tuning stopped ({why}) and putting the starting caps back failed: {e}; check with `gpupilot power`"
                ),
            }
            Ok(ExitCode::FAILURE)
        }
    }
}

/// The search `args` ask for.
fn settings(args: &TuneEnergyArgs) -> TuneSettings {
    let window = match args.seconds {
        Some(measure) => Window {
            unit: Unit::Seconds,
            warmup: args.warmup.unwrap_or(Window::DEFAULT_SECONDS.warmup),
            measure,
        },
        None => Window {
            unit: Unit::Steps,
            warmup: args.warmup.unwrap_or(Window::DEFAULT_STEPS.warmup),
            measure: args.measure.unwrap_or(Window::DEFAULT_STEPS.measure),
        },
    };
    TuneSettings {
        eta: args.eta,
        step_w: args.step_w,
        window,
    }
}

/// Run `spec` seen through `client`'s daemon, and a search on it as `settings` ask, ready to
/// [`drive`] (the console's tuner starts the same way, with the default settings).
pub(crate) fn prepare<D: TunerDaemon>(
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

/// Write `result` to the run's directory ([`RESULT_FILE`]); where it went.
pub(crate) fn save_result<D: TunerDaemon>(
    run: &DaemonRun<D>,
    result: &TuneResult,
) -> anyhow::Result<std::path::PathBuf> {
    let path = run.dir.join(RESULT_FILE);
    std::fs::write(&path, serde_json::to_string_pretty(result)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

fn unit_name(u: Unit) -> &'static str {
    match u {
        Unit::Steps => "steps",
        Unit::Seconds => "s",
    }
}

/// One line of progress: the cap under test, how far through its window, the curve so far.
pub fn progress_line(p: &Progress) -> String {
    let phase = match p.phase {
        Phase::WarmUp => "warming up",
        Phase::Measure => "measuring",
        Phase::Done => "done",
        Phase::Cancelled => "cancelled",
        Phase::NotStarted => "waiting",
    };
    let mut s = match p.cap_w {
        Some(w) => format!(
            "[{}/{}] {w:.0} W {phase} {:>3.0}%",
            p.index + 1,
            p.planned,
            (100.0 * p.fraction / 10.0).floor() * 10.0
        ),
        None => phase.to_string(),
    };
    if !p.curve.is_empty() {
        let curve: Vec<String> = p
            .curve
            .iter()
            .map(|c| format!("{:.0} W {:.3}", c.cap_w, c.cost))
            .collect();
        s.push_str(&format!("  cost J/sample: {}", curve.join(", ")));
    }
    s
}

/// The result for people: the curve as a table, then the saving.
pub fn render_result(r: &TuneResult) -> String {
    let mut out = String::from("cap W   J/sample   ms/sample   mean W   cost J/sample\n");
    for c in &r.curve {
        out.push_str(&format!(
            "{:>5.0} {:>10.3} {:>11.3} {:>8.0} {:>15.3}{}\n",
            c.cap_w,
            c.energy_per_sample_j,
            1000.0 * c.time_per_sample_s,
            c.avg_power_w,
            c.cost,
            if c.cap_w == r.best.cap_w {
                "  ← best"
            } else {
                ""
            }
        ));
    }
    out.push_str(&r.summary());
    out.push('\n');
    out
}

/// Ctrl-C, SIGTERM and SIGHUP (the terminal went away) turn it true instead of ending the
/// process, so the caps can be put back first.
fn stop_flag() -> Arc<AtomicBool> {
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
                use tokio::signal::unix::{SignalKind, signal};
                let kinds = [
                    SignalKind::interrupt(),
                    SignalKind::terminate(),
                    SignalKind::hangup(),
                ];
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

/// What the tuner asks of the daemon: the run, the GPUs' newest samples, the run's metrics
/// reports, the GPUs' power limits, and caps. The daemon's client implements it; a test may
/// fake it.
pub trait TunerDaemon {
    /// The run `spec` names (an id, a unique id prefix, a run name, or `last`).
    fn run(&self, spec: &str) -> anyhow::Result<RunSeen>;
    /// The daemon's newest snapshot; `None` while it has no GPU telemetry.
    fn snapshot(&self) -> anyhow::Result<Option<crate::telemetry::Snapshot>>;
    /// The run's metrics reports from `since` on (`u64::MAX`: none, only its trainer's side).
    fn reports(&self, run: &str, since: u64) -> anyhow::Result<Reports>;
    /// Each GPU's power limits, by index; `None` where they cannot be read.
    fn power_limits(&self) -> anyhow::Result<Vec<(u32, Option<crate::control::PowerLimits>)>>;
    /// Cap `gpus` at `watts`, with `why` for the node's events.
    fn set_cap(&self, gpus: Vec<u32>, watts: f64, why: &str) -> anyhow::Result<()>;
}

/// A run, as the tuner needs to know it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSeen {
    /// Its full id.
    pub id: String,
    /// Its directory, where the result goes.
    pub dir: std::path::PathBuf,
    /// The GPUs it sees: its `CUDA_VISIBLE_DEVICES` (`all` when unset).
    pub gpus: String,
    /// Whether it is training now.
    pub running: bool,
}

/// A run's metrics reports from some point on, where the next ones start, and its trainer's
/// side (its ranks, their GPUs).
#[derive(Debug, Clone, PartialEq)]
pub struct Reports {
    pub points: Vec<crate::training::MetricsPoint>,
    pub next: u64,
    pub trainer: crate::training::TrainerInfo,
}

impl TunerDaemon for Client {
    fn run(&self, spec: &str) -> anyhow::Result<RunSeen> {
        let info = Client::run(self, spec)?;
        Ok(RunSeen {
            id: info.id,
            dir: info.dir,
            gpus: info.gpus,
            running: matches!(info.status, RunStatus::Running),
        })
    }

    fn snapshot(&self) -> anyhow::Result<Option<crate::telemetry::Snapshot>> {
        Ok(self.status()?.snapshot)
    }

    fn reports(&self, run: &str, since: u64) -> anyhow::Result<Reports> {
        let m = self.run_metrics(run, since)?;
        Ok(Reports {
            points: m.points,
            next: m.next,
            trainer: m.trainer,
        })
    }

    fn power_limits(&self) -> anyhow::Result<Vec<(u32, Option<crate::control::PowerLimits>)>> {
        let Response::Power { gpus, .. } = self.request(Request::Power {})? else {
            anyhow::bail!("the daemon answered `power` with something else");
        };
        Ok(gpus.into_iter().map(|g| (g.index, g.power)).collect())
    }

    fn set_cap(&self, gpus: Vec<u32>, watts: f64, why: &str) -> anyhow::Result<()> {
        let request = Request::PowerCap {
            gpus: GpuSelection::Some(gpus),
            watts,
            why: Some(why.to_string()),
        };
        self.request(request)?;
        Ok(())
    }
}

/// The run, seen through the daemon.
pub(crate) struct DaemonRun<D: TunerDaemon> {
    daemon: D,
    pub(crate) id: String,
    pub(crate) dir: std::path::PathBuf,
    pub(crate) gpus: Vec<u32>,
    limits: Vec<crate::control::PowerLimits>,
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
    /// The two newest (time, energy of the run's GPUs) from the daemon's snapshots.
    energy: Vec<(f64, f64)>,
}

impl<D: TunerDaemon> DaemonRun<D> {
    fn open(daemon: D, spec: &str) -> anyhow::Result<DaemonRun<D>> {
        let info = daemon.run(spec)?;
        let snap = daemon.snapshot()?.context(
            "the daemon has no GPU telemetry: the tuner needs the GPUs' energy counters",
        )?;
        // The trainer side only (no reports): whether this is a job, and its ranks' GPUs.
        let trainer = daemon.reports(&info.id, u64::MAX)?.trainer;
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
            tally: JobTally::new(ranks.is_some()),
            energy: Vec::new(),
        })
    }

    /// What is tuned, for people: `run r1 on GPU 0,1`, or for a job `job r1 (4 ranks) on GPUs
    /// 0-3 together, one cap for all`.
    pub(crate) fn what(&self) -> String {
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

    fn cap(&self, gpus: Vec<u32>, watts: f64, why: &str) -> Result<(), String> {
        self.daemon
            .set_cap(gpus, watts, why)
            .map_err(|e| e.to_string())
    }

    /// Energy of the run's GPUs at `t`, from the two newest snapshots.
    fn energy_at(&self, t: f64) -> Option<f64> {
        match self.energy.as_slice() {
            [.., (t0, e0), (t1, e1)] if t1 > t0 => Some(e0 + (e1 - e0) * (t - t0) / (t1 - t0)),
            [.., (_, e)] => Some(*e),
            [] => None,
        }
    }
}

impl<D: TunerDaemon> LiveRun for DaemonRun<D> {
    fn observe(&mut self) -> Result<Option<Observation>, String> {
        let snapshot = self.daemon.snapshot().map_err(|e| e.to_string())?;
        if let Some(snap) = snapshot {
            let total = energy_of(&self.gpus, &snap.gpus)?;
            if self.energy.last().is_none_or(|(t, _)| *t < snap.time_s) {
                self.energy.push((snap.time_s, total));
                if self.energy.len() > 2 {
                    self.energy.remove(0);
                }
            }
        }
        let m = self
            .daemon
            .reports(&self.id, self.since)
            .map_err(|e| e.to_string())?;
        self.since = m.next;
        if m.points.is_empty() {
            return Ok(None);
        }
        self.tally.absorb(&m.points);
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
        }))
    }

    fn set_cap(&mut self, watts: f64) -> Result<(), String> {
        self.cap(self.gpus.clone(), watts, "energy tuner: trying a cap")
    }

    fn restore(&mut self) -> Result<(), String> {
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
        Ok(())
    }

    fn alive(&mut self) -> Result<bool, String> {
        let run = self.daemon.run(&self.id).map_err(|e| e.to_string())?;
        Ok(run.running)
    }
}

/// The GPU indices a run uses, from its `gpus` (its `CUDA_VISIBLE_DEVICES`: indices or UUIDs;
/// `all` when unset). An empty list is no GPU, not every GPU.
pub fn run_gpus(visible: &str, gpus: &[crate::telemetry::GpuSample]) -> anyhow::Result<Vec<u32>> {
    VisibleGpus::parse(Some(visible))
        .resolve(gpus.iter().map(|g| (g.index, g.uuid.as_deref())))
        .map_err(|e| anyhow::anyhow!("the run's {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::GpuSample;

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

    #[test]
    fn progress_reads_at_a_glance() {
        let p = Progress {
            phase: Phase::Measure,
            cap_w: Some(650.0),
            index: 2,
            planned: 21,
            fraction: 0.46,
            curve: Vec::new(),
            best_cap_w: None,
        };
        assert_eq!(progress_line(&p), "[3/21] 650 W measuring  40%");
    }
}
