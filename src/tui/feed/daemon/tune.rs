//! The console's energy tuner, for the daemon feed:
//! [`Request::TuneEnergy`](crate::tui::feed::Request::TuneEnergy) starts the daemon's tuning
//! job on the run (`tune_start`, the job `gpupilot tune energy` starts, with the default
//! settings) and follows it (`tune_status`) on a thread of its own with its own connection to
//! the daemon, reporting to the console as [`Update::Tuner`] (a [`TunerEvent`], the message this
//! feed produces); `Request::TuneStop` stops the job (`tune_stop`), and the starting caps go
//! back. The search lives in the daemon: when the console quits and drops its feed, the
//! [`TunerGuard`] it owns ends the following, never the job.

use super::{Done, REQUEST_TIMEOUT, Worker};
use crate::client::{Client, Origin};
use crate::control::tuner::record::{JobState, TuneJob};
use crate::control::tuner::{Progress, TuneResult, TuneSettings, Window};
use crate::protocol::{Request, Response};
use crate::tui::feed::Update;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// What the tuner's thread reports.
#[derive(Debug, Clone, PartialEq)]
pub enum TunerEvent {
    /// The search starts: the run, its GPUs, the caps it will try (highest first), the
    /// window per cap and eta.
    Started {
        run: String,
        gpus: Vec<u32>,
        plan: Vec<f64>,
        window: Window,
        eta: f64,
    },
    /// Where it stands (after every poll that changed something).
    Progress { run: String, progress: Progress },
    /// It ended.
    Ended { run: String, end: TunerEnd },
}

/// How a search from the console ended.
#[derive(Debug, Clone, PartialEq)]
pub enum TunerEnd {
    /// The best cap is set; the result went to the run's directory (`saved`: where, or why
    /// not).
    Done {
        result: Box<TuneResult>,
        saved: Result<String, String>,
    },
    /// Stopped before the end (`why`); the starting caps are back, or putting them back failed.
    Cancelled {
        why: String,
        restored: Result<(), String>,
    },
    /// It could not start or a cap was refused (the daemon's words).
    Failed(String),
}

/// How long quitting waits for the following thread to notice.
const LEAVE_WAIT: Duration = Duration::from_secs(2);

/// A job followed on its thread: `stop` stops the job, `leave` only the following.
struct Running {
    run: String,
    stop: Arc<AtomicBool>,
    leave: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

/// The console's tuner, if one runs. The feed holds the owning guard (dropping it ends the
/// following, not the daemon's job); its thread holds a shared one.
pub struct TunerGuard {
    slot: Arc<Mutex<Option<Running>>>,
    owner: bool,
}

impl Default for TunerGuard {
    fn default() -> TunerGuard {
        TunerGuard {
            slot: Arc::new(Mutex::new(None)),
            owner: true,
        }
    }
}

impl TunerGuard {
    /// A handle on the same slot that does not stop the search when dropped.
    pub fn share(&self) -> TunerGuard {
        TunerGuard {
            slot: Arc::clone(&self.slot),
            owner: false,
        }
    }

    /// The run a search is working on now.
    pub fn running(&self) -> Option<String> {
        let slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        slot.as_ref()
            .filter(|r| !r.thread.is_finished())
            .map(|r| r.run.clone())
    }

    /// Ask the running search to stop; whether one was running.
    pub fn stop(&self) -> bool {
        let slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        match slot.as_ref().filter(|r| !r.thread.is_finished()) {
            Some(r) => {
                r.stop.store(true, Ordering::SeqCst);
                true
            }
            None => false,
        }
    }

    /// Stop following the job (it goes on in the daemon) and wait (at most `limit`) for the
    /// thread to end.
    pub fn leave_and_wait(&self, limit: Duration) {
        let running = self.slot.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(r) = running else {
            return;
        };
        r.leave.store(true, Ordering::SeqCst);
        let start = Instant::now();
        while !r.thread.is_finished() && start.elapsed() < limit {
            std::thread::sleep(Duration::from_millis(20));
        }
        if r.thread.is_finished() {
            let _ = r.thread.join();
        }
    }
}

impl Drop for TunerGuard {
    fn drop(&mut self) {
        if self.owner {
            self.leave_and_wait(LEAVE_WAIT);
        }
    }
}

impl Worker {
    /// Start a search on `run`, unless one runs already.
    pub(super) fn tune(&mut self, run: String) -> Result<(), Done> {
        if let Some(other) = self.tuner.running() {
            return self.send(Update::Answer {
                ok: false,
                text: format!(
                    "the energy tuner is already working on run {other}: t in its Run view \
                     stops it"
                ),
            });
        }
        let stop = Arc::new(AtomicBool::new(false));
        let leave = Arc::new(AtomicBool::new(false));
        let (origin, tx, refresh) = (self.origin.clone(), self.tx.clone(), self.refresh);
        let (flags, id) = ((Arc::clone(&stop), Arc::clone(&leave)), run.clone());
        let spawned = std::thread::Builder::new()
            .name("tui-tuner".into())
            .spawn(move || follow(&origin, &id, refresh, (&flags.0, &flags.1), &tx));
        match spawned {
            Ok(thread) => {
                let mut slot = self.tuner.slot.lock().unwrap_or_else(|e| e.into_inner());
                *slot = Some(Running {
                    run,
                    stop,
                    leave,
                    thread,
                });
                Ok(())
            }
            Err(e) => self.send(Update::Tuner(Box::new(TunerEvent::Ended {
                run,
                end: TunerEnd::Failed(format!("starting the tuner's thread: {e}")),
            }))),
        }
    }

    /// Stop the running search (its caps go back).
    pub(super) fn tune_stop(&mut self) -> Result<(), Done> {
        if self.tuner.stop() {
            return Ok(());
        }
        self.send(Update::Answer {
            ok: false,
            text: "the energy tuner is not running".into(),
        })
    }
}

/// The job's one record from an answer.
fn job_of(answer: Result<Response, crate::client::ClientError>) -> Result<TuneJob, String> {
    match answer.map_err(|e| e.to_string())? {
        Response::TuneJobs { jobs } => jobs
            .into_iter()
            .next()
            .ok_or_else(|| "the daemon answered with no job".into()),
        other => Err(format!(
            "the daemon answered with something unexpected: {other:?}"
        )),
    }
}

/// How a job that ended reads in the console.
fn end_of(job: TuneJob) -> TunerEnd {
    let why = job.why.clone().unwrap_or_default();
    match (job.state, job.result) {
        (JobState::Done, Some(result)) => TunerEnd::Done {
            result: Box::new(result),
            saved: job.saved.unwrap_or_else(|| Err("not written".into())),
        },
        (JobState::Failed, _) => TunerEnd::Failed(why),
        _ => TunerEnd::Cancelled {
            why,
            restored: job.restored.unwrap_or(Ok(())),
        },
    }
}

/// On its thread: start the daemon's job on `run`, follow it until it ends, `stop` (the job is
/// stopped) or `leave` (only the following ends), and say how it went.
fn follow(
    origin: &Origin,
    run: &str,
    refresh: Duration,
    (stop, leave): (&AtomicBool, &AtomicBool),
    tx: &mpsc::Sender<Update>,
) {
    let send = |e: TunerEvent| {
        let _ = tx.blocking_send(Update::Tuner(Box::new(e)));
    };
    let ended = |end: TunerEnd| {
        send(TunerEvent::Ended {
            run: run.to_string(),
            end,
        })
    };
    let name = format!("gpupilot-console-tuner {}", env!("CARGO_PKG_VERSION"));
    let client: Client = match origin.connect(&name) {
        Ok(c) => c.with_timeout(REQUEST_TIMEOUT),
        Err(e) => return ended(TunerEnd::Failed(format!("connecting to the daemon: {e}"))),
    };
    let settings = TuneSettings::default();
    let start = client.request(Request::TuneStart {
        run: run.to_string(),
        settings,
    });
    let job = match job_of(start) {
        Ok(j) => j,
        Err(e) => return ended(TunerEnd::Failed(e)),
    };
    send(TunerEvent::Started {
        run: run.to_string(),
        gpus: job.gpus.clone(),
        // The daemon plans the caps; the console learns how many from the progress.
        plan: Vec::new(),
        window: settings.window,
        eta: settings.eta,
    });
    let pause = refresh.clamp(Duration::from_millis(200), Duration::from_secs(5));
    let mut last: Option<Progress> = None;
    let mut stopping = false;
    loop {
        if leave.load(Ordering::SeqCst) {
            return;
        }
        let now = match client.tune_follow(&job.id, stop, &mut stopping) {
            Ok(j) => j,
            Err(e) => {
                return ended(TunerEnd::Failed(format!(
                    "lost the daemon while following job {} ({e}); the job is the daemon's: \
                     `gpupilot tune status`",
                    job.id
                )));
            }
        };
        if now.state.is_final() {
            return ended(end_of(now));
        }
        if let Some(p) = now.progress.filter(|p| last.as_ref() != Some(p)) {
            last = Some(p.clone());
            // A console that is behind skips a progress report; the next supersedes it.
            let _ = tx.try_send(Update::Tuner(Box::new(TunerEvent::Progress {
                run: run.to_string(),
                progress: p,
            })));
        }
        let start = Instant::now();
        while start.elapsed() < pause
            && !stop.load(Ordering::SeqCst)
            && !leave.load(Ordering::SeqCst)
        {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A guard holding a "follower" that ends only when told to stop or leave.
    fn guard_with_search() -> (TunerGuard, Arc<AtomicBool>) {
        let guard = TunerGuard::default();
        let stop = Arc::new(AtomicBool::new(false));
        let leave = Arc::new(AtomicBool::new(false));
        let ended = Arc::new(AtomicBool::new(false));
        let (flag, gone, done) = (Arc::clone(&stop), Arc::clone(&leave), Arc::clone(&ended));
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::SeqCst) && !gone.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
            // Putting the caps back takes a moment.
            std::thread::sleep(Duration::from_millis(50));
            done.store(true, Ordering::SeqCst);
        });
        *guard.slot.lock().unwrap() = Some(Running {
            run: "r".into(),
            stop,
            leave,
            thread,
        });
        (guard, ended)
    }

    #[test]
    fn dropping_the_owner_ends_the_following_and_waits_for_it() {
        let (guard, ended) = guard_with_search();
        let shared = guard.share();
        assert_eq!(shared.running().as_deref(), Some("r"));
        drop(shared);
        assert!(
            !ended.load(Ordering::SeqCst),
            "a shared handle does not stop it"
        );
        drop(guard);
        assert!(ended.load(Ordering::SeqCst), "the owner waited for the end");
    }

    #[test]
    fn stop_asks_the_running_search_only() {
        let (guard, ended) = guard_with_search();
        assert!(guard.stop());
        let start = Instant::now();
        while guard.running().is_some() && start.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(ended.load(Ordering::SeqCst));
        assert!(!guard.stop(), "nothing runs any more");
    }
}
