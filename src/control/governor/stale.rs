//! What the event log is told about a governed GPU's telemetry going stale and fresh again:
//! hysteresis and coalescing, so a GPU that flaps (stale one second, fresh the next) is one
//! `flapping` event, not two events a second.
//!
//! - The first stale spell is said at once (`stale`), and its end too (`resumed`).
//! - A new spell within [`FLAP_WINDOW_S`] of the last `resumed` is flapping: said once
//!   (`flapping`), and nothing more while it goes on.
//! - Flapping ends when the telemetry has stayed fresh for [`SETTLE_S`]: one `resumed` that says
//!   how many spells there were and over how long.
//!
//! Pure: the caller gives the time. The governor itself holds the cap at every stale sample
//! whatever is said here.

/// A stale spell this soon (seconds) after telemetry came back is flapping.
pub const FLAP_WINDOW_S: f64 = 60.0;
/// Flapping ends after this long (seconds) of fresh telemetry.
pub const SETTLE_S: f64 = 60.0;

/// What to record now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Said {
    /// Telemetry went stale.
    Stale,
    /// It came back: after `spells` stale spells over `over_s` seconds (one spell: a plain
    /// return).
    Resumed { spells: u32, over_s: f64 },
    /// It went stale again soon after coming back: `spells` so far, since `over_s` ago.
    Flapping { spells: u32, over_s: f64 },
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    Fresh,
    Stale,
    /// Spells in a row; `in_spell`: stale now; `fresh_since`: when the current fresh run began.
    Flapping {
        in_spell: bool,
        fresh_since: f64,
    },
}

/// One GPU's reporting state. See the module doc.
#[derive(Debug, Clone, PartialEq)]
pub struct StaleReport {
    state: State,
    /// When telemetry last came back (said `resumed`).
    resumed_s: f64,
    /// When the current episode's first spell began.
    since_s: f64,
    spells: u32,
}

impl Default for StaleReport {
    fn default() -> Self {
        StaleReport {
            state: State::Fresh,
            resumed_s: f64::NEG_INFINITY,
            since_s: 0.0,
            spells: 0,
        }
    }
}

impl StaleReport {
    pub fn new() -> StaleReport {
        StaleReport::default()
    }

    /// Stale (or reported as such) now.
    pub fn is_stale(&self) -> bool {
        matches!(
            self.state,
            State::Stale | State::Flapping { in_spell: true, .. }
        )
    }

    /// Take the telemetry's state at `now_s`; what to say, if anything.
    pub fn observe(&mut self, stale: bool, now_s: f64) -> Option<Said> {
        match (self.state, stale) {
            (State::Fresh, false) | (State::Stale, true) => None,
            (State::Fresh, true) => {
                if now_s - self.resumed_s <= FLAP_WINDOW_S {
                    // The previous spell counts: this is its second.
                    self.spells = 2;
                    self.state = State::Flapping {
                        in_spell: true,
                        fresh_since: now_s,
                    };
                    Some(Said::Flapping {
                        spells: self.spells,
                        over_s: now_s - self.since_s,
                    })
                } else {
                    self.spells = 1;
                    self.since_s = now_s;
                    self.state = State::Stale;
                    Some(Said::Stale)
                }
            }
            (State::Stale, false) => {
                self.state = State::Fresh;
                self.resumed_s = now_s;
                Some(Said::Resumed {
                    spells: 1,
                    over_s: now_s - self.since_s,
                })
            }
            (State::Flapping { in_spell, .. }, true) => {
                if !in_spell {
                    self.spells += 1;
                }
                self.state = State::Flapping {
                    in_spell: true,
                    fresh_since: now_s,
                };
                None
            }
            (
                State::Flapping {
                    in_spell,
                    fresh_since,
                },
                false,
            ) => {
                let fresh_since = if in_spell { now_s } else { fresh_since };
                if now_s - fresh_since >= SETTLE_S {
                    self.state = State::Fresh;
                    self.resumed_s = now_s;
                    return Some(Said::Resumed {
                        spells: self.spells,
                        over_s: fresh_since - self.since_s,
                    });
                }
                self.state = State::Flapping {
                    in_spell: false,
                    fresh_since,
                };
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_spell_is_said_at_once_a_flapping_one_once() {
        let mut r = StaleReport::new();
        assert_eq!(r.observe(false, 0.0), None);
        assert_eq!(r.observe(true, 1.0), Some(Said::Stale));
        assert_eq!(r.observe(true, 2.0), None);
        assert!(r.is_stale());
        assert_eq!(
            r.observe(false, 5.0),
            Some(Said::Resumed {
                spells: 1,
                over_s: 4.0
            })
        );
        // Far later: a new, plain spell.
        assert_eq!(r.observe(true, 200.0), Some(Said::Stale));
        assert_eq!(
            r.observe(false, 201.0),
            Some(Said::Resumed {
                spells: 1,
                over_s: 1.0
            })
        );
        // Back within the window: flapping, said once however long it goes on.
        assert_eq!(
            r.observe(true, 203.0),
            Some(Said::Flapping {
                spells: 2,
                over_s: 3.0
            })
        );
        for t in 204..1000 {
            assert_eq!(r.observe(t % 3 == 0, f64::from(t)), None, "at {t}");
        }
        // Fresh for SETTLE_S: one resumed with the count.
        let mut said = Vec::new();
        for t in 1000..1100 {
            said.extend(r.observe(false, f64::from(t)));
        }
        assert_eq!(said.len(), 1, "{said:?}");
        let Said::Resumed { spells, over_s } = said[0] else {
            panic!("{said:?}")
        };
        assert!(spells > 200, "{spells}");
        assert!((796.0..=800.0).contains(&over_s), "{over_s}");
        assert!(!r.is_stale());
    }
}
