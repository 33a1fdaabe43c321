//! The restart policy as a pure function: given the policy and how every attempt so far ended,
//! restart (after how long) or give up. No clock, no sleeping; the caller adds `after` to its
//! own clock's now.

use std::fmt;
use std::time::Duration;

use super::events::ExitInfo;
use crate::profile::{RestartMode, RestartPolicy};

/// How one attempt of a run ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Attempt {
    pub exit: ExitInfo,
    /// The user asked for it to stop (`gpupilot stop`): never restarted.
    pub stopped_by_user: bool,
    pub ran_for: Duration,
}

/// What to do after the last attempt ended.
#[derive(Debug, Clone, PartialEq)]
pub enum AfterExit {
    Restart { after: Duration },
    GiveUp(GiveUp),
}

/// Why a run is not restarted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveUp {
    /// No attempt has ended.
    NothingEnded,
    StoppedByUser,
    PolicyNever,
    /// `on-failure` and it succeeded.
    Succeeded,
    /// `on-failure` and the status is unknown (an adopted run): restarting a run that may have
    /// finished would train it twice, which is worse than leaving a crash for a person to see.
    UnknownStatus,
    MaxRestarts(u32),
}

impl fmt::Display for GiveUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GiveUp::NothingEnded => f.write_str("nothing has ended"),
            GiveUp::StoppedByUser => f.write_str("stopped by the user"),
            GiveUp::PolicyNever => f.write_str("restart policy is never"),
            GiveUp::Succeeded => f.write_str("it succeeded (policy on-failure)"),
            GiveUp::UnknownStatus => {
                f.write_str("its exit status is unknown (policy on-failure restarts only failures)")
            }
            GiveUp::MaxRestarts(n) => write!(
                f,
                "gave up after {n} restart{}",
                if *n == 1 { "" } else { "s" }
            ),
        }
    }
}

/// The wait before restart number `n + 1` (n = restarts so far):
/// `backoff_s × backoff_factor^n`, at most `backoff_max_s`.
pub fn backoff(policy: &RestartPolicy, n: u32) -> Duration {
    let secs = policy.backoff_s * policy.backoff_factor.powi(n.min(1024) as i32);
    Duration::from_secs_f64(secs.min(policy.backoff_max_s).max(0.0))
}

/// Restart or give up after the last of `history` ended.
pub fn next_action(policy: &RestartPolicy, history: &[Attempt]) -> AfterExit {
    let Some(last) = history.last() else {
        return AfterExit::GiveUp(GiveUp::NothingEnded);
    };
    if last.stopped_by_user {
        return AfterExit::GiveUp(GiveUp::StoppedByUser);
    }
    match policy.mode {
        RestartMode::Never => return AfterExit::GiveUp(GiveUp::PolicyNever),
        RestartMode::OnFailure if last.exit.is_success() => {
            return AfterExit::GiveUp(GiveUp::Succeeded);
        }
        RestartMode::OnFailure if last.exit.is_unknown() => {
            return AfterExit::GiveUp(GiveUp::UnknownStatus);
        }
        RestartMode::OnFailure | RestartMode::Always => {}
    }
    let restarts = (history.len() - 1) as u32;
    if restarts >= policy.max_restarts {
        return AfterExit::GiveUp(GiveUp::MaxRestarts(policy.max_restarts));
    }
    AfterExit::Restart {
        after: backoff(policy, restarts),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(mode: RestartMode, max: u32) -> RestartPolicy {
        RestartPolicy {
            mode,
            max_restarts: max,
            backoff_s: 1.0,
            backoff_factor: 2.0,
            backoff_max_s: 5.0,
            on_oom: Default::default(),
        }
    }

    fn ended(exit: ExitInfo) -> Attempt {
        Attempt {
            exit,
            stopped_by_user: false,
            ran_for: Duration::from_secs(1),
        }
    }

    fn secs(s: f64) -> AfterExit {
        AfterExit::Restart {
            after: Duration::from_secs_f64(s),
        }
    }

    #[test]
    fn on_failure_backs_off_exponentially_then_gives_up() {
        let p = policy(RestartMode::OnFailure, 4);
        let fail = ended(ExitInfo::code(1));
        let mut h = vec![fail];
        let mut got = Vec::new();
        loop {
            let a = next_action(&p, &h);
            got.push(a.clone());
            if matches!(a, AfterExit::GiveUp(_)) {
                break;
            }
            h.push(fail);
        }
        assert_eq!(
            got,
            [
                secs(1.0),
                secs(2.0),
                secs(4.0),
                secs(5.0),
                AfterExit::GiveUp(GiveUp::MaxRestarts(4))
            ]
        );
        assert_eq!(
            GiveUp::MaxRestarts(4).to_string(),
            "gave up after 4 restarts"
        );
    }

    #[test]
    fn which_endings_restart() {
        let sig = ExitInfo {
            code: None,
            signal: Some(11),
        };
        let on_failure = policy(RestartMode::OnFailure, 3);
        let always = policy(RestartMode::Always, 3);
        let never = policy(RestartMode::Never, 3);
        let ok = [ended(ExitInfo::code(0))];
        assert_eq!(
            next_action(&on_failure, &ok),
            AfterExit::GiveUp(GiveUp::Succeeded)
        );
        assert_eq!(next_action(&always, &ok), secs(1.0));
        assert_eq!(next_action(&on_failure, &[ended(sig)]), secs(1.0));
        assert_eq!(
            next_action(&never, &[ended(sig)]),
            AfterExit::GiveUp(GiveUp::PolicyNever)
        );
        let unknown = [ended(ExitInfo::unknown())];
        assert_eq!(
            next_action(&on_failure, &unknown),
            AfterExit::GiveUp(GiveUp::UnknownStatus)
        );
        assert_eq!(next_action(&always, &unknown), secs(1.0));
        let stopped = [Attempt {
            stopped_by_user: true,
            ..ended(sig)
        }];
        assert_eq!(
            next_action(&always, &stopped),
            AfterExit::GiveUp(GiveUp::StoppedByUser)
        );
        assert_eq!(
            next_action(&always, &[]),
            AfterExit::GiveUp(GiveUp::NothingEnded)
        );
        let zero = policy(RestartMode::Always, 0);
        assert_eq!(
            next_action(&zero, &ok),
            AfterExit::GiveUp(GiveUp::MaxRestarts(0))
        );
    }

    #[test]
    fn backoff_caps_and_survives_huge_counts() {
        let p = policy(RestartMode::Always, u32::MAX);
        assert_eq!(backoff(&p, 0), Duration::from_secs(1));
        assert_eq!(backoff(&p, 2), Duration::from_secs(4));
        assert_eq!(backoff(&p, 100_000), Duration::from_secs(5));
    }
}
