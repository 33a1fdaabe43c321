//! `gpupilot set RUN batch-size N | prefetch N`: a knob change on a live run, and the wait for
//! the trainer's answer (or the restart that carries it).

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use super::connect;
use crate::cli::{GlobalArgs, SetArgs, SyntheticTrainArgs};
use crate::client::{Client, KnobPending, Push};
use crate::config::Paths;
use crate::protocol::{ErrorCode, KnobName, KnobVia, NodeEvent, Request, Response};

pub fn set(args: &SetArgs) -> anyhow::Result<ExitCode> {
    let client = connect(&Paths::from_env())?;
    // Subscribed before asking, so the answer's event cannot slip past.
    client.subscribe(false, true)?;
    let why = Some(format!(
        "gpupilot set {} {}",
        args.knob.cli_name(),
        args.value
    ));
    let asked = Instant::now();
    let pending = match client.knob_set(&args.run, args.knob, args.value, args.restart, why.clone())
    {
        Ok(p) => p,
        Err(e) if e.code() == Some(ErrorCode::RestartNeeded) => {
            let cost = restart_cost(&client, &args.run);
            if !confirm(&format!(
                "run {} has no trainer attached, so {} = {} needs a restart: {cost}. Restart it? \
                 [y/N] ",
                args.run, args.knob, args.value
            ))? {
                super::err_line(&format!(
                    "gpupilot: run {} has no trainer attached, so {} = {} needs a restart: \
                     {cost}; give --restart to allow it; nothing changed",
                    args.run, args.knob, args.value
                ));
                return Ok(ExitCode::FAILURE);
            }
            client.knob_set(&args.run, args.knob, args.value, true, why)?
        }
        Err(e) => return Err(e.into()),
    };
    let old = pending.old.map_or("?".to_string(), |o| o.to_string());
    match pending.via {
        KnobVia::Restart => {
            super::out(&format!(
                "{}: {} {old} → {}: restarting the run with the new value\n",
                pending.run, args.knob, args.value
            ))?;
            if args.restart {
                // Allowed without a question: still say what it cost.
                let cost = restart_cost(&client, &pending.run);
                super::err_line(&format!("gpupilot: {cost}"));
            }
            Ok(ExitCode::SUCCESS)
        }
        KnobVia::Trainer if args.no_wait => {
            match ranked(&pending) {
                Some((n, step)) => println!(
                    "{} (change {})",
                    proposed_line(&pending.run, args.knob, &old, args.value, n, step),
                    pending.seq
                ),
                None => println!(
                    "{}: {} {old} → {}: sent to the trainer (change {})",
                    pending.run, args.knob, args.value, pending.seq
                ),
            }
            Ok(ExitCode::SUCCESS)
        }
        KnobVia::Trainer => {
            if let Some((n, step)) = ranked(&pending) {
                eprintln!(
                    "{}; waiting for every rank",
                    proposed_line(&pending.run, args.knob, &old, args.value, n, step)
                );
            }
            wait_for_answer(&client, &pending, args, asked, &old)
        }
    }
}

/// A change proposed to a run of several ranks: how many, and the step they will apply it at.
fn ranked(p: &KnobPending) -> Option<(u32, u64)> {
    match (p.ranks, p.apply_step) {
        (Some(n), Some(step)) => Some((n, step)),
        _ => None,
    }
}

/// How long the ranks of `run` should take to reach `apply_step` at the pace of the slowest
/// (one `run_metrics` of no reports); None when they have not reported enough to tell.
fn time_to_step(client: &Client, run: &str, apply_step: u64) -> Option<Duration> {
    let asked = Request::RunMetrics {
        run: run.into(),
        since: 0,
        max: Some(0),
    };
    let Ok(Response::RunMetrics { trainer, .. }) = client.request(asked) else {
        return None;
    };
    let slowest = trainer
        .ranks
        .iter()
        .filter_map(|r| r.steps_per_s)
        .reduce(f64::min)?;
    apply_wait(trainer.job?.step?, apply_step, slowest)
}

/// The wait for `apply_step` from `step` at `steps_per_s`: twice the time it takes, and two
/// seconds more, at most an hour.
fn apply_wait(step: u64, apply_step: u64, steps_per_s: f64) -> Option<Duration> {
    if !(steps_per_s.is_finite() && steps_per_s > 0.0) {
        return None;
    }
    let s = apply_step.saturating_sub(step) as f64 / steps_per_s;
    Some(Duration::from_secs_f64((2.0 * s + 2.0).min(3600.0)))
}

/// `RUN: batch_size 32 → 64 proposed to 4 ranks for step 1234`.
fn proposed_line(
    run: &str,
    knob: KnobName,
    old: &str,
    value: i64,
    ranks: u32,
    step: u64,
) -> String {
    format!("{run}: {knob} {old} → {value} proposed to {ranks} ranks for step {step}")
}

/// `RUN: batch_size 32 → 64 applied on 4/4 ranks at step 1234 (all agreed in 3.1 ms)`; the
/// round trip to the last acknowledgement stands in when the agreement was not seen.
#[allow(clippy::too_many_arguments)]
fn applied_line(
    run: &str,
    knob: KnobName,
    old: &str,
    value: i64,
    applied: u32,
    proposed: u32,
    step: u64,
    agreed_ms: Option<f64>,
    rtt_ms: f64,
) -> String {
    let how = match agreed_ms {
        Some(ms) => format!("all agreed in {ms:.1} ms"),
        None => format!("round trip {rtt_ms:.1} ms"),
    };
    format!(
        "{run}: {knob} {old} → {value} applied on {applied}/{proposed} ranks at step {step} ({how})"
    )
}

/// `gpupilot: RUN: batch_size = 64 called off: rank 2 refused: out of memory; every rank
/// keeps 32`, from the daemon's reason (`called off on every rank: rank 2 refused: …`).
fn called_off_line(run: &str, knob: KnobName, value: i64, reason: &str, kept: &str) -> String {
    let why = reason
        .strip_prefix("called off on every rank: ")
        .unwrap_or(reason);
    format!("gpupilot: {run}: {knob} = {value} called off: {why}; every rank keeps {kept}")
}

/// Ask on the terminal; false (and a hint) when there is none to ask on.
/// What restarting `run` for a knob costs, in words: whether its command resumes (its
/// profile's `resume_args`), and if not the work that is lost: how long it ran, the last step
/// seen. Best effort: what cannot be read is left out.
fn restart_cost(client: &Client, run: &str) -> String {
    let Ok(info) = client.run(run) else {
        return "its command starts again".into();
    };
    let resumes = crate::profile::check(info.dir.join("run.toml"))
        .ok()
        .map(|p| !p.run.resume_args.is_empty());
    let ran = info.uptime_s.map(super::format_duration);
    let step = client
        .run_metrics(&info.id, u64::MAX)
        .ok()
        .and_then(|m| m.trainer.last)
        .and_then(|p| p.report.step);
    let work = match (ran, step) {
        (Some(ran), Some(step)) => format!(" (it ran {ran}, last step seen: step {step})"),
        (Some(ran), None) => format!(" (it ran {ran}; no step seen)"),
        (None, Some(step)) => format!(" (last step seen: step {step})"),
        (None, None) => String::new(),
    };
    match resumes {
        Some(true) => "its command starts again with its profile's resume_args, from its \
                       checkpoint"
            .into(),
        Some(false) => format!(
            "its command starts again from the beginning and the work so far is lost{work}: \
             its profile has no resume_args"
        ),
        None => format!(
            "its command starts again; whether it resumes (resume_args) cannot be read, so the \
             work so far{work} may be lost"
        ),
    }
}

fn confirm(question: &str) -> anyhow::Result<bool> {
    if !std::io::stdin().is_terminal() {
        return Ok(false);
    }
    eprint!("{question}");
    std::io::stderr().flush()?;
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    Ok(matches!(line.trim(), "y" | "Y" | "yes"))
}

fn wait_for_answer(
    client: &Client,
    pending: &KnobPending,
    args: &SetArgs,
    asked: Instant,
    old: &str,
) -> anyhow::Result<ExitCode> {
    let mut deadline = asked + Duration::from_secs_f64(args.timeout.clamp(0.0, 3600.0));
    let ranks = ranked(pending);
    // A change to several ranks: the round trip to the last vote, once every rank agreed.
    let mut agreed_ms: Option<f64> = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            match (ranks, agreed_ms) {
                (Some((n, step)), Some(_)) => eprintln!(
                    "gpupilot: {}: {} {old} → {} was agreed by all {n} ranks for step {step}, \
                     and not every rank has applied it after {} s; it stays staged (the console's \
                     rank table shows when it lands)",
                    pending.run, args.knob, args.value, args.timeout
                ),
                (Some((n, step)), None) => eprintln!(
                    "gpupilot: {}: {} {old} → {} was proposed to {n} ranks for step {step}, \
                     and not every rank has answered in {} s; the daemon calls it off if one \
                     stays silent (`gpupilot ps` shows where it stands)",
                    pending.run, args.knob, args.value, args.timeout
                ),
                _ => eprintln!(
                    "gpupilot: {}: {} {old} → {} was sent to the trainer, which has not answered in {} s; \
                     it stays pending (`gpupilot ps` and the console show when it lands)",
                    pending.run, args.knob, args.value, args.timeout
                ),
            }
            return Ok(ExitCode::FAILURE);
        }
        let update = match client.updates().recv_timeout(left) {
            Ok(u) => u,
            Err(_) => continue,
        };
        let Push::Event(rec) = update else {
            if matches!(update, Push::Closed | Push::Shutdown(_)) {
                anyhow::bail!("the daemon went away before the trainer answered");
            }
            continue;
        };
        match rec.event {
            NodeEvent::KnobStaged {
                run,
                change,
                ranks: n,
                apply_step,
                rtt_ms,
                ..
            } if run == pending.run && change == pending.seq => {
                agreed_ms = Some(rtt_ms);
                eprintln!(
                    "{run}: all {n} ranks agreed in {rtt_ms:.1} ms; they apply it at step {apply_step}"
                );
                // Agreed: the change will land, at a step that slow steps may put past the
                // timeout; wait for it as long as the ranks' pace says it takes.
                if let Some(wait) = time_to_step(client, &run, apply_step) {
                    deadline = deadline.max(Instant::now() + wait);
                }
            }
            NodeEvent::KnobApplied {
                run,
                change,
                rtt_ms,
                ranks: applied,
                step,
                ..
            } if run == pending.run && change == pending.seq => {
                match (ranks, applied, step) {
                    (Some((n, _)), Some(applied), Some(step)) => println!(
                        "{}",
                        applied_line(
                            &run, args.knob, old, args.value, applied, n, step, agreed_ms, rtt_ms
                        )
                    ),
                    _ => println!(
                        "{run}: {} {old} → {} applied by the trainer (round trip {rtt_ms:.1} ms)",
                        args.knob, args.value
                    ),
                }
                return Ok(ExitCode::SUCCESS);
            }
            NodeEvent::KnobRejected {
                run,
                change,
                reason,
                kept,
                ..
            } if run == pending.run && change == pending.seq => {
                if ranks.is_some() && agreed_ms.is_none() {
                    let kept = kept.map_or_else(|| old.to_string(), |k| k.to_string());
                    eprintln!(
                        "{}",
                        called_off_line(&run, args.knob, args.value, &reason, &kept)
                    );
                } else if ranks.is_some() {
                    // Committed, then not applied by every rank at its step: the daemon brings
                    // the others to the new value with a change of its own.
                    eprintln!(
                        "gpupilot: {run}: {} {old} → {} not applied by every rank: {reason}",
                        args.knob, args.value
                    );
                } else {
                    eprintln!(
                        "gpupilot: {run}: the trainer refused {} = {}: {reason}; it keeps {old}",
                        args.knob, args.value
                    );
                }
                return Ok(ExitCode::FAILURE);
            }
            _ => {}
        }
    }
}

/// `gpupilot synthetic-train`: the synthetic trainer (see [`crate::trainer`]).
pub fn synthetic_train(g: &GlobalArgs, args: &SyntheticTrainArgs) -> anyhow::Result<ExitCode> {
    let env_knob = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<i64>().ok());
    let opts = crate::trainer::Options {
        model: args.train_model.clone(),
        gpu_model: args.gpu_model.clone(),
        ranks: crate::trainer::RankFlags {
            rank: args.rank,
            world_size: args.world_size,
            local_rank: args.local_rank,
            gpu: args.gpu,
        },
        steps: args.steps,
        batch_size: args
            .batch_size
            .or_else(|| env_knob("GPUPILOT_BATCH_SIZE"))
            .unwrap_or(256),
        prefetch: args
            .prefetch
            .or_else(|| env_knob("GPUPILOT_PREFETCH"))
            .unwrap_or(2),
        workers: args.workers,
        seed: g.sim.seed,
        speed: args.speed,
        curve: match &args.curve {
            Some(path) => Some(crate::trainer::CurveSpec {
                curve: crate::trainer::curve::read(path)?,
                noise: args.curve_noise,
                nvml_lib: g.nvml_lib.clone(),
            }),
            None => None,
        },
    };
    let code = crate::trainer::run(&opts)?;
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_to_several_ranks_reads_as_proposed_applied_or_called_off() {
        let knob = KnobName::BatchSize;
        assert_eq!(
            proposed_line("r1", knob, "32", 64, 4, 1234),
            "r1: batch_size 32 → 64 proposed to 4 ranks for step 1234"
        );
        assert_eq!(
            applied_line("r1", knob, "32", 64, 4, 4, 1234, Some(3.08), 40.0),
            "r1: batch_size 32 → 64 applied on 4/4 ranks at step 1234 (all agreed in 3.1 ms)"
        );
        assert_eq!(
            applied_line("r1", knob, "32", 64, 4, 4, 1234, None, 40.0),
            "r1: batch_size 32 → 64 applied on 4/4 ranks at step 1234 (round trip 40.0 ms)"
        );
        assert_eq!(
            called_off_line(
                "r1",
                knob,
                64,
                "called off on every rank: rank 2 refused: out of memory",
                "32"
            ),
            "gpupilot: r1: batch_size = 64 called off: rank 2 refused: out of memory; every rank keeps 32"
        );
        assert_eq!(
            called_off_line("r1", knob, 64, "rank 3 did not answer within 2000 ms", "32"),
            "gpupilot: r1: batch_size = 64 called off: rank 3 did not answer within 2000 ms; every rank keeps 32"
        );
    }

    #[test]
    fn an_agreed_change_is_waited_for_as_long_as_the_ranks_pace_says() {
        // 10 steps at 0.5 steps/s: 20 s, waited for twice that and 2 s more.
        assert_eq!(apply_wait(100, 110, 0.5), Some(Duration::from_secs(42)));
        assert_eq!(apply_wait(120, 110, 0.5), Some(Duration::from_secs(2)));
        assert_eq!(
            apply_wait(0, 1_000_000, 0.01),
            Some(Duration::from_secs(3600))
        );
        assert_eq!(apply_wait(100, 110, 0.0), None);
        assert_eq!(apply_wait(100, 110, f64::NAN), None);
    }

    #[test]
    fn only_a_pending_change_with_ranks_and_a_step_is_ranked() {
        let mut p = KnobPending {
            run: "r1".into(),
            seq: 1,
            old: Some(32),
            via: KnobVia::Trainer,
            apply_step: None,
            ranks: None,
        };
        assert_eq!(ranked(&p), None);
        p.apply_step = Some(1234);
        p.ranks = Some(4);
        assert_eq!(ranked(&p), Some((4, 1234)));
    }
}
