//! Driving a [`Tuner`] on a live run: poll the run's counters, make the cap changes, and put
//! the starting caps back when the run ends or the search is interrupted mid-way.
//!
//! The run is behind [`LiveRun`] (the daemon, in [`super::session`]; a fake in tests), and
//! waiting between polls is the caller's `wait`, so this file neither sleeps nor does I/O.

use std::sync::atomic::{AtomicBool, Ordering};

use super::knob::Knob;
use super::search::{Observation, Progress, Search, SearchStep, TuneResult};

/// A run being tuned, as the driver needs it.
pub trait LiveRun {
    /// The counters now; `Ok(None)` when nothing new has arrived since the last call.
    fn observe(&mut self) -> Result<Option<Observation>, String>;
    /// Set this cap on every GPU of the run.
    fn set_cap(&mut self, watts: f64) -> Result<(), String>;
    /// Lock every GPU of the run's SM clocks up to `mhz` (their highest unlocks them): a
    /// clock search ([`super::knob`]).
    fn set_clock(&mut self, mhz: f64) -> Result<(), String> {
        let _ = mhz;
        Err("this run's clocks cannot be locked".into())
    }
    /// Change the run's batch size (a joint search): every rank at one step. The change lands
    /// when the reports show it ([`Observation::batch`]).
    fn set_batch(&mut self, batch: u32) -> Result<(), String>;
    /// Whether the batch asked last has reached the run's trainer; one asked while no trainer
    /// was attached (a trainer restarting after it ran out of memory) is asked again now.
    fn batch_taken(&mut self) -> Result<bool, String> {
        Ok(true)
    }
    /// Put back each GPU's cap from before the search (and the batch, after a joint search
    /// that changed it).
    fn restore(&mut self) -> Result<(), String>;
    /// Whether the run is still training.
    fn alive(&mut self) -> Result<bool, String>;
}

/// How a search on a live run ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Finished: the best cap (and batch) is set.
    Done(Box<TuneResult>),
    /// Stopped before the end; the starting caps were put back (`restored`), or putting them
    /// back failed with the message.
    Cancelled {
        why: String,
        restored: Result<(), String>,
    },
}

/// Polls that may pass without a first observation (the trainer has not reported yet).
pub const FIRST_OBSERVATION_POLLS: u32 = 120;

/// Run `tuner` (the cap search or the joint one) on `run` until it finishes, `stop` turns true, or the run ends. `wait` is
/// called between polls; `progress` after each one.
pub fn drive(
    tuner: &mut dyn Search,
    run: &mut impl LiveRun,
    stop: &AtomicBool,
    mut wait: impl FnMut(),
    mut progress: impl FnMut(&Progress),
) -> Result<Outcome, String> {
    let mut polls = 0;
    let first = loop {
        if stop.load(Ordering::SeqCst) {
            return Ok(cancelled(tuner, run, "interrupted before the first cap"));
        }
        if !run.alive()? {
            return Err("the run is not running: nothing to tune".into());
        }
        if let Some(o) = run.observe()? {
            break o;
        }
        polls += 1;
        if polls >= FIRST_OBSERVATION_POLLS {
            return Err(
                "the run reports no training metrics (steps, samples/s): the tuner needs its throughput; report metrics with the gpupilot SDK or print them (see docs/profiles.md)".into(),
            );
        }
        wait();
    };
    let mut action = Some(tuner.start(&first));
    let mut changed = false;
    // Polls in a row without a new observation: a trainer that stops reporting (its
    // connection lost) must not leave a probe's cap set for as long as the run lasts.
    let mut quiet = 0;
    loop {
        match action.take() {
            Some(step @ (SearchStep::SetCap(_) | SearchStep::SetClock(_))) => {
                let (set, w) = match step {
                    SearchStep::SetClock(f) => (run.set_clock(f), format!("{f:.0} MHz")),
                    SearchStep::SetCap(w) => (run.set_cap(w), format!("{w:.0} W")),
                    _ => unreachable!("matched above"),
                };
                if let Err(e) = set {
                    if !changed {
                        tuner.cancel();
                        return Err(format!("setting {w}: {e} (nothing was changed)"));
                    }
                    let out = cancelled(tuner, run, "");
                    let restored = match out {
                        Outcome::Cancelled { restored, .. } => restored,
                        Outcome::Done(_) => Ok(()),
                    };
                    return Err(match restored {
                        Ok(()) => format!("setting {w}: {e} (the starting caps are back)"),
                        Err(r) => format!(
                            "setting {w}: {e}; putting the starting caps back failed too: {r}"
                        ),
                    });
                }
                changed = true;
            }
            Some(SearchStep::SetBatch(b)) => {
                if let Err(e) = run.set_batch(b) {
                    let out = cancelled(tuner, run, "");
                    let restored = match out {
                        Outcome::Cancelled { restored, .. } => restored,
                        Outcome::Done(_) => Ok(()),
                    };
                    return Err(match restored {
                        Ok(()) => format!(
                            "setting batch size {b}: {e} (the starting caps and batch are back)"
                        ),
                        Err(r) => format!(
                            "setting batch size {b}: {e}; putting the starting caps and batch back failed too: {r}"
                        ),
                    });
                }
                changed = true;
            }
            Some(SearchStep::Finish { apply_w, result }) => {
                // `--knob both`: the knob that saved less is where it started already (put
                // back before the other was searched); the winner's best is set.
                let k = result.knob;
                let best = k.show(apply_w);
                let set = match k {
                    Knob::Clocks => run.set_clock(apply_w),
                    Knob::Cap | Knob::Both => run.set_cap(apply_w),
                };
                set.map_err(|e| format!("setting the best {} {best}: {e}", k.name()))?;
                if let Some(o) = result.other.as_deref().filter(|o| o.knob == Knob::Clocks) {
                    // The clock search ran last: its knob is at its last probe.
                    run.set_clock(o.start_w).map_err(|e| {
                        format!("unlocking the clocks after the cap won: {e} (the best cap {best} is set)")
                    })?;
                }
                if let Some(b) = &result.batch {
                    let failed = |e: String| {
                        format!(
                            "setting the best batch size {}: {e} (the best cap {apply_w:.0} W is set)",
                            b.best
                        )
                    };
                    run.set_batch(b.best).map_err(failed)?;
                    // A trainer that ran out of memory at the last batch tried may still be
                    // restarting: the best batch waits for it to attach, as long as a first
                    // report would.
                    let mut polls = 0;
                    while !run.batch_taken().map_err(failed)? {
                        polls += 1;
                        if polls >= FIRST_OBSERVATION_POLLS
                            || stop.load(Ordering::SeqCst)
                            || !run.alive()?
                        {
                            return Err(failed("no trainer attached to the run to take it".into()));
                        }
                        wait();
                    }
                }
                progress(&tuner.progress());
                return Ok(Outcome::Done(result));
            }
            Some(SearchStep::Restore(_)) => {
                // The joint search found nothing to keep (every batch ran out of memory).
                let restored = run.restore();
                return Ok(Outcome::Cancelled {
                    why: "no batch could be measured".into(),
                    restored,
                });
            }
            None => {}
        }
        progress(&tuner.progress());
        if stop.load(Ordering::SeqCst) {
            return Ok(cancelled(tuner, run, "interrupted"));
        }
        match run.alive() {
            Ok(true) => {}
            Ok(false) => return Ok(cancelled(tuner, run, "the run ended")),
            Err(e) => return Ok(cancelled(tuner, run, &e)),
        }
        wait();
        match run.observe() {
            Ok(Some(o)) => {
                quiet = 0;
                action = tuner.observe(&o);
            }
            Ok(None) => {
                quiet += 1;
                if quiet >= FIRST_OBSERVATION_POLLS {
                    return Ok(cancelled(tuner, run, "the run stopped reporting metrics"));
                }
            }
            Err(e) => return Ok(cancelled(tuner, run, &e)),
        }
    }
}

fn cancelled(tuner: &mut dyn Search, run: &mut impl LiveRun, why: &str) -> Outcome {
    let restored = match tuner.cancel() {
        Some(_) => run.restore(),
        None => Ok(()),
    };
    Outcome::Cancelled {
        why: why.to_string(),
        restored,
    }
}

#[cfg(test)]
mod tests {
    use super::super::search::{Tuner, TunerConfig, Window};
    use super::*;
    use std::cell::Cell;

    /// A run whose energy per sample has its minimum at 450 W; it ends after `life` polls.
    struct Fake {
        obs: Observation,
        cap: f64,
        caps: Vec<f64>,
        restored: u32,
        polls: u32,
        life: u32,
        quiet_polls: u32,
        refuse_below: f64,
        /// The batches asked, and how many more looks find the last one not yet taken.
        batches: Vec<u32>,
        untaken: u32,
    }

    impl Fake {
        fn new() -> Fake {
            Fake {
                obs: Observation {
                    time_s: 0.0,
                    steps: Some(0.0),
                    energy_j: 0.0,
                    samples: 0.0,
                    batch: None,
                    oom: false,
                },
                cap: 600.0,
                caps: Vec::new(),
                restored: 0,
                polls: 0,
                life: u32::MAX,
                quiet_polls: 0,
                refuse_below: 0.0,
                batches: Vec::new(),
                untaken: 0,
            }
        }
    }

    impl LiveRun for Fake {
        fn observe(&mut self) -> Result<Option<Observation>, String> {
            self.polls += 1;
            if self.polls <= self.quiet_polls {
                return Ok(None);
            }
            let x = (self.cap - 450.0) / 100.0;
            self.obs.steps = self.obs.steps.map(|s| s + 1.0);
            self.obs.samples += 10.0;
            self.obs.time_s += 0.1;
            self.obs.energy_j += 10.0 * (2.0 + x * x);
            Ok(Some(self.obs))
        }
        fn set_cap(&mut self, w: f64) -> Result<(), String> {
            if w < self.refuse_below {
                return Err("no permission".into());
            }
            self.cap = w;
            self.caps.push(w);
            Ok(())
        }
        fn set_batch(&mut self, b: u32) -> Result<(), String> {
            self.batches.push(b);
            Ok(())
        }
        fn batch_taken(&mut self) -> Result<bool, String> {
            self.untaken = self.untaken.saturating_sub(1);
            Ok(self.untaken == 0)
        }
        fn restore(&mut self) -> Result<(), String> {
            self.restored += 1;
            self.cap = 600.0;
            Ok(())
        }
        fn alive(&mut self) -> Result<bool, String> {
            Ok(self.polls < self.life)
        }
    }

    fn tuner() -> Tuner {
        // The descent, whose order of caps these tests name.
        let mut c = TunerConfig::new(200.0, 700.0, 700.0, 600.0, 1)
            .with_strategy(super::super::search::Strategy::Descend);
        c.eta = 1.0;
        c.window = Window {
            unit: super::super::search::Unit::Steps,
            warmup: 2.0,
            measure: 5.0,
        };
        Tuner::new(c).unwrap()
    }

    #[test]
    fn a_search_runs_to_the_end_and_applies_the_best_cap() {
        let mut run = Fake::new();
        let stop = AtomicBool::new(false);
        let seen = Cell::new(0);
        let out = drive(
            &mut tuner(),
            &mut run,
            &stop,
            || {},
            |_| seen.set(seen.get() + 1),
        )
        .unwrap();
        let Outcome::Done(r) = out else {
            panic!("{out:?}")
        };
        assert_eq!(r.best.cap_w, 450.0);
        assert_eq!(*run.caps.last().unwrap(), 450.0, "the best cap is applied");
        assert_eq!(run.caps[0], 700.0);
        assert_eq!(run.restored, 0);
        assert!(seen.get() > 10, "progress is reported as it goes");
    }

    #[test]
    fn the_run_ending_mid_way_restores_the_starting_caps() {
        let mut run = Fake::new();
        run.life = 30;
        let stop = AtomicBool::new(false);
        let out = drive(&mut tuner(), &mut run, &stop, || {}, |_| {}).unwrap();
        assert_eq!(
            out,
            Outcome::Cancelled {
                why: "the run ended".into(),
                restored: Ok(())
            }
        );
        assert_eq!(run.restored, 1);
        assert_eq!(run.cap, 600.0);
    }

    #[test]
    fn an_interrupt_restores_the_starting_caps() {
        let mut run = Fake::new();
        let stop = AtomicBool::new(false);
        let polls = Cell::new(0);
        let out = drive(
            &mut tuner(),
            &mut run,
            &stop,
            || {
                polls.set(polls.get() + 1);
                if polls.get() == 12 {
                    stop.store(true, Ordering::SeqCst);
                }
            },
            |_| {},
        )
        .unwrap();
        assert!(
            matches!(&out, Outcome::Cancelled { why, restored: Ok(()) } if why == "interrupted"),
            "{out:?}"
        );
        assert_eq!(run.restored, 1);
    }

    #[test]
    fn a_refused_cap_stops_the_search_and_restores() {
        let mut run = Fake::new();
        run.refuse_below = 650.0;
        let stop = AtomicBool::new(false);
        let err = drive(&mut tuner(), &mut run, &stop, || {}, |_| {}).unwrap_err();
        assert!(err.contains("setting 625 W: no permission"), "{err}");
        assert!(err.contains("starting caps are back"), "{err}");
        assert_eq!(run.restored, 1);
        // Refused from the first cap: nothing to put back.
        let mut run = Fake::new();
        run.refuse_below = 1000.0;
        let err = drive(&mut tuner(), &mut run, &stop, || {}, |_| {}).unwrap_err();
        assert!(
            err.contains("setting 700 W: no permission (nothing was changed)"),
            "{err}"
        );
        assert_eq!(run.restored, 0);
    }

    #[test]
    fn a_run_without_metrics_is_refused_without_touching_caps() {
        let mut run = Fake::new();
        run.quiet_polls = u32::MAX;
        let stop = AtomicBool::new(false);
        let err = drive(&mut tuner(), &mut run, &stop, || {}, |_| {}).unwrap_err();
        assert!(err.contains("no training metrics"), "{err}");
        assert!(run.caps.is_empty());
        // A run that is not running at all.
        let mut run = Fake::new();
        run.life = 0;
        assert!(drive(&mut tuner(), &mut run, &stop, || {}, |_| {}).is_err());
    }

    /// The cap search, its result given a batch dimension (best batch 128), as a joint
    /// search's end is.
    struct WithBatch(Tuner);

    impl Search for WithBatch {
        fn start(&mut self, now: &Observation) -> SearchStep {
            self.0.start(now)
        }
        fn observe(&mut self, obs: &Observation) -> Option<SearchStep> {
            match self.0.observe(obs)? {
                SearchStep::Finish {
                    apply_w,
                    mut result,
                } => {
                    result.batch = Some(super::super::joint::BatchOutcome {
                        start: 64,
                        best: 128,
                        planned: vec![64, 128, 256],
                        searched: Vec::new(),
                        oom: Some(256),
                    });
                    Some(SearchStep::Finish { apply_w, result })
                }
                other => Some(other),
            }
        }
        fn cancel(&mut self) -> Option<SearchStep> {
            self.0.cancel()
        }
        fn progress(&self) -> Progress {
            self.0.progress()
        }
    }

    #[test]
    fn the_best_batch_waits_for_a_restarting_trainer_to_take_it() {
        let mut run = Fake::new();
        run.untaken = 5;
        let stop = AtomicBool::new(false);
        let waits = Cell::new(0);
        let out = drive(
            &mut WithBatch(tuner()),
            &mut run,
            &stop,
            || waits.set(waits.get() + 1),
            |_| {},
        )
        .unwrap();
        assert!(matches!(out, Outcome::Done(_)), "{out:?}");
        assert_eq!(run.batches, [128]);
        assert_eq!(run.untaken, 0, "asked until taken");
        // A trainer that never comes back: the search says the batch did not reach the run.
        let mut run = Fake::new();
        run.untaken = u32::MAX;
        let err = drive(&mut WithBatch(tuner()), &mut run, &stop, || {}, |_| {}).unwrap_err();
        assert!(
            err.contains("setting the best batch size 128: no trainer attached")
                && err.contains("the best cap 450 W is set"),
            "{err}"
        );
        assert!(run.untaken < u32::MAX - 100, "waited, bounded");
    }
}
