//! Alerts: thresholds on GPU temperature and power, uncorrected ECC errors, lost GPUs and
//! stalled runs, with hysteresis so that one hot GPU is one alert, not one per sample.
//!
//! The caller turns each snapshot (and each live run's progress) into [`Observation`]s, one per
//! thing watched, and [`Alerts::observe`] answers with what changed: an alert raised, or one
//! cleared. An alert is keyed by what it is about (`temperature:gpu0`, `stalled:RUN`), and is
//! raised once when its condition starts and cleared once when the condition is clearly over:
//!
//! | kind | raised when | cleared when |
//! | --- | --- | --- |
//! | temperature | temp ≥ limit | temp < limit − 3 °C |
//! | power | draw ≥ limit | draw < 95% of limit |
//! | ecc | uncorrected count above the first one seen | never (a GPU with uncorrected errors needs a reset) |
//! | lost | the GPU fell off the bus | it answers again |
//! | xid | the GPU reported an XID (one alert per GPU and XID number, `xid:gpu0:79`) | an hour ([`XID_RECENT_S`]) after the GPU last reported it |
//! | stalled | no log output or metrics for `stalled_after_s` | output again |
//! | straggler | a rank of a job of several is the advisor's straggler (its step at least `raise_ratio` × the others' median) | below half that margin ([`STRAGGLER_CLEAR_FRAC`]) |
//!
//! A thing no longer observed (a run ended, a rule removed) has its alert cleared. A straggler
//! alert is keyed by its run (`straggler:RUN`): one job, one alert, whichever rank it names;
//! its message is the advisor's finding (the rank, its GPU, the cause, the command), refreshed
//! while it lasts.
//!
//! [`run_hook`] runs the user's hook (an argv, never a shell) with the alert as JSON on its
//! stdin, on a thread of its own, killed after a timeout: a slow or hung hook never holds up the
//! daemon, and at most [`MAX_HOOKS`] run at once (more are skipped and logged).

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::telemetry::xid::{XID_RECENT_S, explain};
use crate::telemetry::{RemappedRows, RetiredPages};

/// Temperature alerts clear this far below their limit, °C.
pub const TEMP_HYSTERESIS_C: f64 = 3.0;
/// Power alerts clear below this fraction of their limit.
pub const POWER_CLEAR_FRAC: f64 = 0.95;
/// A straggler alert clears once the slowest rank is within this share of the margin that
/// raised it (raised at 1.10×, cleared below 1.05×), so a job that hovers at the line is one
/// alert.
pub const STRAGGLER_CLEAR_FRAC: f64 = 0.5;
/// A hook still running after this long is killed.
pub const HOOK_TIMEOUT: Duration = Duration::from_secs(10);
/// Hooks running at once, at most.
pub const MAX_HOOKS: usize = 4;

/// What an alert is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertKind {
    Temperature,
    Power,
    Ecc,
    /// A row remap or a page retirement waits for a reset, a remap failed, or too many pages
    /// were retired.
    Memory,
    Lost,
    Stalled,
    /// One rank of a job of several holds the others back.
    Straggler,
    /// The GPU reported an XID error.
    Xid,
    /// A PCIe link below its best while the GPU works, or NVLink links down.
    Link,
}

impl AlertKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AlertKind::Temperature => "temperature",
            AlertKind::Power => "power",
            AlertKind::Ecc => "ecc",
            AlertKind::Memory => "memory",
            AlertKind::Lost => "lost",
            AlertKind::Stalled => "stalled",
            AlertKind::Straggler => "straggler",
            AlertKind::Xid => "xid",
            AlertKind::Link => "link",
        }
    }
}

/// One active (or just cleared) alert: what the status bar, the event log and the hook see.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Alert {
    /// `temperature:gpu0`, `stalled:20261130-041500-train`.
    pub key: String,
    pub kind: AlertKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// The value that raised it (°C, W, errors, seconds idle).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold: Option<f64>,
    /// In words: `GPU 0 at 91 °C (alert at 85 °C)`.
    pub message: String,
    /// When it was raised, seconds since the epoch.
    pub since_s: f64,
}

/// One thing watched, as seen now.
#[derive(Debug, Clone, PartialEq)]
pub enum Observation {
    Temperature {
        gpu: u32,
        temp_c: Option<f64>,
        limit_c: f64,
    },
    Power {
        gpu: u32,
        power_w: Option<f64>,
        limit_w: f64,
    },
    Ecc {
        gpu: u32,
        uncorrected: Option<u64>,
    },
    /// Row remapping and page retirement: raised while a remap or a retirement waits for a
    /// reset, after a remap failed, or once the board retired enough pages to be replaced.
    Memory {
        gpu: u32,
        remapped: Option<RemappedRows>,
        retired: Option<RetiredPages>,
    },
    Lost {
        gpu: u32,
        lost: bool,
    },
    /// A GPU's links: its PCIe link as `(gen, width, max gen, max width)` where all four are
    /// reported, whether it works (an idle GPU lowers its link's generation to save power:
    /// only a working one's generation counts, its width always does), and its NVLink links
    /// down (None where it has no NVLink or did not say).
    Link {
        gpu: u32,
        pcie: Option<(u32, u32, u32, u32)>,
        busy: bool,
        nvlink_down: Option<Vec<u32>>,
    },
    /// An XID the GPU reported: the newest time it did (one observation per GPU and number).
    Xid {
        gpu: u32,
        xid: u64,
        last_s: f64,
    },
    Stalled {
        run: String,
        /// Seconds since its last output or metrics report.
        idle_s: f64,
        limit_s: f64,
    },
    /// A job of several ranks, as the advisor judges it.
    Straggler {
        run: String,
        /// Its slowest rank's step time over the median of the others' (1.23: 23% slower);
        /// None when too few reports say.
        ratio: Option<f64>,
        /// The ratio that makes a straggler (the advisor's threshold).
        raise_ratio: f64,
        /// The straggler's GPU.
        gpu: Option<u32>,
        /// The finding in words, with its cause and command (when `ratio` makes one).
        message: String,
    },
}

impl Observation {
    fn key(&self) -> String {
        match self {
            Observation::Temperature { gpu, .. } => format!("temperature:gpu{gpu}"),
            Observation::Power { gpu, .. } => format!("power:gpu{gpu}"),
            Observation::Ecc { gpu, .. } => format!("ecc:gpu{gpu}"),
            Observation::Memory { gpu, .. } => format!("memory:gpu{gpu}"),
            Observation::Lost { gpu, .. } => format!("lost:gpu{gpu}"),
            Observation::Link { gpu, .. } => format!("link:gpu{gpu}"),
            Observation::Xid { gpu, xid, .. } => format!("xid:gpu{gpu}:{xid}"),
            Observation::Stalled { run, .. } => format!("stalled:{run}"),
            Observation::Straggler { run, .. } => format!("straggler:{run}"),
        }
    }
}

/// What changed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "change", rename_all = "snake_case")]
pub enum AlertChange {
    Raised(Alert),
    Cleared(Alert),
}

/// The alert state of a node. See the module doc.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Alerts {
    active: BTreeMap<String, Alert>,
    /// First uncorrected-ECC count seen per GPU (the baseline new errors are counted from).
    ecc_baseline: BTreeMap<u32, u64>,
}

impl Alerts {
    pub fn new() -> Alerts {
        Alerts::default()
    }

    /// Active alerts, by key.
    pub fn active(&self) -> impl Iterator<Item = &Alert> {
        self.active.values()
    }

    /// Take this round's observations (everything watched now) at `now_s` (epoch seconds).
    pub fn observe(&mut self, observations: &[Observation], now_s: f64) -> Vec<AlertChange> {
        let mut changes = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for o in observations {
            let key = o.key();
            seen.insert(key.clone());
            let active = self.active.contains_key(&key);
            match self.judge(o, active, now_s) {
                Verdict::Raise(alert) if !active => {
                    self.active.insert(key, alert.clone());
                    changes.push(AlertChange::Raised(alert));
                }
                Verdict::Raise(alert) => {
                    // Still on: keep when it started, refresh the figures (and, for a job,
                    // which GPU holds it back now).
                    if let Some(a) = self.active.get_mut(&key) {
                        a.value = alert.value;
                        a.message = alert.message;
                        a.gpu = alert.gpu;
                    }
                }
                Verdict::Clear if active => {
                    let alert = self.active.remove(&key).expect("active");
                    changes.push(AlertChange::Cleared(alert));
                }
                Verdict::Clear | Verdict::Keep => {}
            }
        }
        let gone: Vec<String> = self
            .active
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        for k in gone {
            let alert = self.active.remove(&k).expect("listed");
            changes.push(AlertChange::Cleared(alert));
        }
        changes
    }

    fn judge(&mut self, o: &Observation, active: bool, now_s: f64) -> Verdict {
        let alert = |kind, gpu, run: Option<&String>, value, threshold, message| Alert {
            key: o.key(),
            kind,
            gpu,
            run: run.cloned(),
            value: Some(value),
            threshold,
            message,
            since_s: now_s,
        };
        match o {
            Observation::Temperature {
                gpu,
                temp_c,
                limit_c,
            } => match *temp_c {
                Some(t) if t >= *limit_c => Verdict::Raise(alert(
                    AlertKind::Temperature,
                    Some(*gpu),
                    None,
                    t,
                    Some(*limit_c),
                    format!("GPU {gpu} at {t:.0} °C (alert at {limit_c:.0} °C)"),
                )),
                Some(t) if t < limit_c - TEMP_HYSTERESIS_C => Verdict::Clear,
                // No reading: neither proof of heat nor of cooling.
                _ => Verdict::Keep,
            },
            Observation::Power {
                gpu,
                power_w,
                limit_w,
            } => match *power_w {
                Some(p) if p >= *limit_w => Verdict::Raise(alert(
                    AlertKind::Power,
                    Some(*gpu),
                    None,
                    p,
                    Some(*limit_w),
                    format!("GPU {gpu} draws {p:.0} W (alert at {limit_w:.0} W)"),
                )),
                Some(p) if p < POWER_CLEAR_FRAC * limit_w => Verdict::Clear,
                _ => Verdict::Keep,
            },
            Observation::Ecc { gpu, uncorrected } => {
                let Some(n) = *uncorrected else {
                    return Verdict::Keep;
                };
                let base = *self.ecc_baseline.entry(*gpu).or_insert(n);
                if n > base {
                    let new = n - base;
                    let plural = if new == 1 { "" } else { "s" };
                    Verdict::Raise(alert(
                        AlertKind::Ecc,
                        Some(*gpu),
                        None,
                        new as f64,
                        None,
                        format!(
                            "GPU {gpu}: {new} new uncorrected ECC error{plural} \
                             (reset the GPU when it is free)"
                        ),
                    ))
                } else if active {
                    Verdict::Keep
                } else {
                    Verdict::Clear
                }
            }
            Observation::Memory {
                gpu,
                remapped,
                retired,
            } => {
                let raise = |message: String| {
                    Verdict::Raise(alert(
                        AlertKind::Memory,
                        Some(*gpu),
                        None,
                        1.0,
                        None,
                        message,
                    ))
                };
                match (remapped, retired) {
                    (Some(r), _) if r.failure => raise(format!(
                        "GPU {gpu}: row remapping failed (no spare row left where needed): \
                         drain it and have it replaced"
                    )),
                    (_, Some(p)) if p.should_replace() => raise(format!(
                        "GPU {gpu}: {} pages retired ({} for double-bit errors): its memory is \
                         failing; drain it and have it replaced",
                        p.total(),
                        p.double_bit
                    )),
                    (Some(r), _) if r.pending => raise(format!(
                        "GPU {gpu}: a row remap waits for a reset (reset it when it is free)"
                    )),
                    (_, Some(p)) if p.pending => raise(format!(
                        "GPU {gpu}: a page retirement waits for a reset (reset it when it is free)"
                    )),
                    (Some(_), _) | (_, Some(_)) => Verdict::Clear,
                    // No reading: neither proof of a fault nor of its repair.
                    (None, None) => Verdict::Keep,
                }
            }
            Observation::Link {
                gpu,
                pcie,
                busy,
                nvlink_down,
            } => {
                let mut said = Vec::new();
                let mut value = 0.0;
                if let Some(down) = nvlink_down.as_ref().filter(|d| !d.is_empty()) {
                    let list: Vec<String> = down.iter().map(u32::to_string).collect();
                    let plural = if down.len() == 1 { "" } else { "s" };
                    said.push(format!(
                        "NVLink link{plural} {} down (traffic to its peers takes the links left \
                         or PCIe: reset the GPU when it is free; if it stays down, have the \
                         board checked)",
                        list.join(", ")
                    ));
                    value = down.len() as f64;
                }
                if let Some((now_gen, now_width, max_gen, max_width)) = *pcie {
                    if now_width < max_width || (*busy && now_gen < max_gen) {
                        said.push(format!(
                            "runs at PCIe Gen{now_gen} x{now_width}, it can do Gen{max_gen} \
                             x{max_width} (reseat the GPU or check its riser and slot)"
                        ));
                        value = value.max(f64::from(now_width));
                    }
                }
                if !said.is_empty() {
                    Verdict::Raise(alert(
                        AlertKind::Link,
                        Some(*gpu),
                        None,
                        value,
                        None,
                        format!("GPU {gpu}: {}", said.join("; ")),
                    ))
                } else if pcie.is_none() && nvlink_down.is_none() {
                    // Nothing reported: neither proof of a fault nor of its repair.
                    Verdict::Keep
                } else if !*busy && active {
                    // An idle GPU's generation says nothing: a width or NVLink fault shows
                    // above; a generation fault waits for the GPU to work again.
                    Verdict::Keep
                } else {
                    Verdict::Clear
                }
            }
            Observation::Lost { gpu, lost } => {
                if *lost {
                    Verdict::Raise(alert(
                        AlertKind::Lost,
                        Some(*gpu),
                        None,
                        1.0,
                        None,
                        format!("GPU {gpu} fell off the bus (lost); its runs may have failed"),
                    ))
                } else {
                    Verdict::Clear
                }
            }
            Observation::Xid { gpu, xid, last_s } => {
                if now_s - last_s <= XID_RECENT_S {
                    let info = explain(*xid);
                    Verdict::Raise(alert(
                        AlertKind::Xid,
                        Some(*gpu),
                        None,
                        *xid as f64,
                        None,
                        format!(
                            "GPU {gpu}: {}: {}; {}",
                            info.title(),
                            info.meaning,
                            info.action
                        ),
                    ))
                } else {
                    Verdict::Clear
                }
            }
            Observation::Stalled {
                run,
                idle_s,
                limit_s,
            } => {
                if idle_s >= limit_s {
                    Verdict::Raise(alert(
                        AlertKind::Stalled,
                        None,
                        Some(run),
                        *idle_s,
                        Some(*limit_s),
                        format!(
                            "run {run} shows no progress for {} (alert after {})",
                            crate::units::format_duration(*idle_s),
                            crate::units::format_duration(*limit_s)
                        ),
                    ))
                } else {
                    Verdict::Clear
                }
            }
            Observation::Straggler {
                run,
                ratio,
                raise_ratio,
                gpu,
                message,
            } => {
                let Some(r) = *ratio else {
                    // Too few reports: neither proof of a straggler nor of its recovery.
                    return Verdict::Keep;
                };
                let clear_below = 1.0 + STRAGGLER_CLEAR_FRAC * (raise_ratio - 1.0);
                if r >= *raise_ratio {
                    Verdict::Raise(alert(
                        AlertKind::Straggler,
                        *gpu,
                        Some(run),
                        100.0 * (r - 1.0),
                        Some(100.0 * (raise_ratio - 1.0)),
                        format!("run {run}: {message}"),
                    ))
                } else if r < clear_below {
                    Verdict::Clear
                } else {
                    Verdict::Keep
                }
            }
        }
    }
}

enum Verdict {
    Raise(Alert),
    Clear,
    Keep,
}

/// What a hook reads on stdin: the change, the alert, and the node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HookPayload {
    /// `raised` or `cleared`.
    pub change: String,
    pub node: String,
    /// RFC 3339, UTC.
    pub time: String,
    #[serde(flatten)]
    pub alert: Alert,
}

static HOOKS_RUNNING: AtomicUsize = AtomicUsize::new(0);

/// Who an alert hook runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookUser {
    /// The daemon's own user (a user's daemon).
    Daemon,
    /// Another, unprivileged user: a root daemon drops to it (`setpriv(1)`: its uid and gid,
    /// no supplementary groups) before the hook runs.
    Ids { uid: u32, gid: u32 },
}

/// Who hooks run as for a daemon of uid `daemon_uid` whose `control.toml` names `hook_user`
/// (looked up with `lookup`), or why none may run. A root daemon runs hooks (its own and its
/// runs' profiles') only as an unprivileged user named in its settings: a hook from a file a
/// user could influence never runs as root.
pub fn hook_user(
    daemon_uid: u32,
    hook_user: Option<&str>,
    lookup: impl Fn(&str) -> Option<(u32, u32)>,
) -> Result<HookUser, String> {
    let ids = |name: &str| {
        lookup(name).ok_or_else(|| {
            format!("alerts.hook_user = {name:?}: there is no such user in /etc/passwd")
        })
    };
    match (daemon_uid, hook_user) {
        (0, None) => Err(
            "a root daemon runs alert hooks only as the unprivileged user named in \
             control.toml's [alerts] hook_user (e.g. hook_user = \"nobody\"): none was run"
                .into(),
        ),
        (0, Some(name)) => match ids(name)? {
            (0, _) => Err(format!(
                "alerts.hook_user = {name:?} has uid 0: a hook never runs as root"
            )),
            (uid, gid) => Ok(HookUser::Ids { uid, gid }),
        },
        (_, None) => Ok(HookUser::Daemon),
        (me, Some(name)) => match ids(name)? {
            (uid, _) if uid == me => Ok(HookUser::Daemon),
            (uid, _) => Err(format!(
                "alerts.hook_user = {name:?} (uid {uid}): a daemon of uid {me} runs hooks as \
                 itself only; leave hook_user out"
            )),
        },
    }
}

/// Run `argv` with `payload` as JSON on stdin, on its own thread, killed after `timeout`.
/// Returns the thread (tests join it; the daemon does not wait), or None when the hook was not
/// started (empty argv, or [`MAX_HOOKS`] already running: logged).
pub fn run_hook(
    argv: &[String],
    payload: &HookPayload,
    timeout: Duration,
    user: HookUser,
) -> Option<std::thread::JoinHandle<HookOutcome>> {
    let (program, args) = argv.split_first()?;
    if HOOKS_RUNNING.fetch_add(1, Ordering::SeqCst) >= MAX_HOOKS {
        HOOKS_RUNNING.fetch_sub(1, Ordering::SeqCst);
        tracing::warn!(
            "alert hook {program} not run for {}: {MAX_HOOKS} hooks are still running",
            payload.alert.key
        );
        return None;
    }
    let mut json = serde_json::to_string(payload).expect("an alert always serializes");
    json.push('\n');
    let (program, args) = (program.clone(), args.to_vec());
    let spawned = std::thread::Builder::new()
        .name("alert-hook".into())
        .spawn(move || {
            let outcome = hook_body(&program, &args, &json, timeout, user);
            HOOKS_RUNNING.fetch_sub(1, Ordering::SeqCst);
            match &outcome {
                HookOutcome::Exited(0) => {}
                o => tracing::warn!("alert hook {program}: {o:?}"),
            }
            outcome
        });
    match spawned {
        Ok(h) => Some(h),
        Err(e) => {
            HOOKS_RUNNING.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!("alert hook: no thread: {e}");
            None
        }
    }
}

/// How a hook ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookOutcome {
    Exited(i32),
    /// Ended by a signal (no exit code).
    Signalled,
    /// Ran past the timeout and was killed.
    TimedOut,
    /// Could not be started.
    Failed(String),
}

/// setpriv(1) (util-linux), which drops a root daemon's hook to its user.
const SETPRIV: &str = "/usr/bin/setpriv";

fn hook_body(
    program: &str,
    args: &[String],
    json: &str,
    timeout: Duration,
    user: HookUser,
) -> HookOutcome {
    let mut cmd = match user {
        HookUser::Daemon => {
            let mut c = Command::new(program);
            c.args(args);
            c
        }
        HookUser::Ids { uid, gid } => {
            let mut c = Command::new(SETPRIV);
            c.args([
                format!("--reuid={uid}"),
                format!("--regid={gid}"),
                "--clear-groups".into(),
                "--".into(),
                program.into(),
            ])
            .args(args)
            // Not a directory of root's that the hook could hold open.
            .current_dir("/");
            c
        }
    };
    let mut child = match cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return HookOutcome::Failed(format!("could not start {program}: {e}")),
    };
    if let Some(mut stdin) = child.stdin.take() {
        // A hook that does not read its stdin is fine (EPIPE is not an error here).
        let _ = stdin.write_all(json.as_bytes());
    }
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                return status
                    .code()
                    .map_or(HookOutcome::Signalled, HookOutcome::Exited);
            }
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return HookOutcome::TimedOut;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return HookOutcome::Failed(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests;
