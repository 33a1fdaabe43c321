//! The console's energy tuner, for the daemon feed:
//! [`Request::TuneEnergy`](crate::tui::feed::Request::TuneEnergy) starts the search of
//! `gpupilot tune energy` (the session of `control::tuner::session`, the same [`drive`] over
//! the same daemon calls, with the default settings) on a thread of its own with its own
//! connection to the daemon, reporting to the console as [`Update::Tuner`] (a [`TunerEvent`],
//! the message this feed produces); `Request::TuneStop` stops it, and the starting caps go
//! back. The [`Feed`](crate::tui::feed::Feed) owns a [`TunerGuard`]: when the console quits and
//! drops its feed, the guard stops a search still running and waits until its caps are back.

use super::{Done, REQUEST_TIMEOUT, Worker};
use crate::client::Origin;
use crate::control::tuner::live::{Outcome, drive};
use crate::control::tuner::session::{prepare, save_result};
use crate::control::tuner::{Progress, TuneResult, TuneSettings, Window};
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

/// How long quitting waits for a stopped search to put its caps back.
const STOP_WAIT: Duration = Duration::from_secs(20);

/// A search running on its thread.
struct Running {
    run: String,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

/// The console's tuner, if one runs. The feed holds the owning guard (dropping it stops the
/// search and waits for its caps to be back); its thread holds a shared one.
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

    /// Stop the search and wait (at most `limit`) for its thread to put the caps back.
    pub fn stop_and_wait(&self, limit: Duration) {
        let running = self.slot.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(r) = running else {
            return;
        };
        r.stop.store(true, Ordering::SeqCst);
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
            self.stop_and_wait(STOP_WAIT);
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
        let (origin, tx, refresh) = (self.origin.clone(), self.tx.clone(), self.refresh);
        let (flag, id) = (Arc::clone(&stop), run.clone());
        let spawned = std::thread::Builder::new()
            .name("tui-tuner".into())
            .spawn(move || search(&origin, &id, refresh, &flag, &tx));
        match spawned {
            Ok(thread) => {
                let mut slot = self.tuner.slot.lock().unwrap_or_else(|e| e.into_inner());
                *slot = Some(Running { run, stop, thread });
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

/// The search, on its thread: connect, read the run's GPUs and limits, drive the tuner until
/// it ends or `stop`, and say how it went.
fn search(
    origin: &Origin,
    run: &str,
    refresh: Duration,
    stop: &AtomicBool,
    tx: &mpsc::Sender<Update>,
) {
    let send = |e: TunerEvent| {
        // The console is gone: the search still ends (and restores) on `stop`.
        let _ = tx.blocking_send(Update::Tuner(Box::new(e)));
    };
    let ended = |end: TunerEnd| {
        send(TunerEvent::Ended {
            run: run.to_string(),
            end,
        })
    };
    let name = format!("gpupilot-console-tuner {}", env!("CARGO_PKG_VERSION"));
    let client = match origin.connect(&name) {
        Ok(c) => c.with_timeout(REQUEST_TIMEOUT),
        Err(e) => return ended(TunerEnd::Failed(format!("connecting to the daemon: {e}"))),
    };
    let (mut live, mut tuner) = match prepare(client, run, &TuneSettings::default()) {
        Ok(p) => p,
        Err(e) => return ended(TunerEnd::Failed(format!("{e:#}"))),
    };
    let cfg = tuner.config();
    send(TunerEvent::Started {
        run: run.to_string(),
        gpus: live.gpus.clone(),
        plan: tuner.plan().to_vec(),
        window: cfg.window,
        eta: cfg.eta,
    });
    let pause = refresh.clamp(Duration::from_millis(200), Duration::from_secs(5));
    let mut last: Option<Progress> = None;
    let outcome = drive(
        &mut tuner,
        &mut live,
        stop,
        || {
            let start = Instant::now();
            while start.elapsed() < pause && !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(50));
            }
        },
        |p| {
            if last.as_ref() != Some(p) {
                last = Some(p.clone());
                // A console that is behind skips a progress report; the next supersedes it.
                let _ = tx.try_send(Update::Tuner(Box::new(TunerEvent::Progress {
                    run: run.to_string(),
                    progress: p.clone(),
                })));
            }
        },
    );
    ended(match outcome {
        Ok(Outcome::Done(result)) => {
            let saved = save_result(&live, &result)
                .map(|p| p.display().to_string())
                .map_err(|e| format!("{e:#}"));
            TunerEnd::Done { result, saved }
        }
        Ok(Outcome::Cancelled { why, restored }) => TunerEnd::Cancelled { why, restored },
        Err(e) => TunerEnd::Failed(e),
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A guard holding a "search" that ends only when told to stop.
    fn guard_with_search() -> (TunerGuard, Arc<AtomicBool>) {
        let guard = TunerGuard::default();
        let stop = Arc::new(AtomicBool::new(false));
        let ended = Arc::new(AtomicBool::new(false));
        let (flag, done) = (Arc::clone(&stop), Arc::clone(&ended));
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
            // Putting the caps back takes a moment.
            std::thread::sleep(Duration::from_millis(50));
            done.store(true, Ordering::SeqCst);
        });
        *guard.slot.lock().unwrap() = Some(Running {
            run: "r".into(),
            stop,
            thread,
        });
        (guard, ended)
    }

    #[test]
    fn dropping_the_owner_stops_the_search_and_waits_for_it() {
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
