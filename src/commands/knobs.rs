//! `gpupilot set RUN batch-size N | prefetch N`: a knob change on a live run, and the wait for
//! the trainer's answer (or the restart that carries it).

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use super::connect;
use crate::cli::{GlobalArgs, SetArgs, SyntheticTrainArgs};
use crate::client::{Client, KnobPending, Update};
use crate::config::Paths;
use crate::protocol::{ErrorCode, KnobVia, NodeEvent};

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
            if !confirm(&format!(
                "run {} has no trainer attached; restart it with {} = {}? [y/N] ",
                args.run, args.knob, args.value
            ))? {
                eprintln!("gpupilot: nothing changed");
                return Ok(ExitCode::FAILURE);
            }
            client.knob_set(&args.run, args.knob, args.value, true, why)?
        }
        Err(e) => return Err(e.into()),
    };
    let old = pending.old.map_or("?".to_string(), |o| o.to_string());
    match pending.via {
        KnobVia::Restart => {
            println!(
                "{}: {} {old} → {}: restarting the run with the new value",
                pending.run, args.knob, args.value
            );
            Ok(ExitCode::SUCCESS)
        }
        KnobVia::Trainer if args.no_wait => {
            println!(
                "{}: {} {old} → {}: sent to the trainer (change {})",
                pending.run, args.knob, args.value, pending.seq
            );
            Ok(ExitCode::SUCCESS)
        }
        KnobVia::Trainer => wait_for_answer(&client, &pending, args, asked, &old),
    }
}

/// Ask on the terminal; false (and a hint) when there is none to ask on.
fn confirm(question: &str) -> anyhow::Result<bool> {
    if !std::io::stdin().is_terminal() {
        eprintln!("gpupilot: the change needs a restart of the run; give --restart to allow it");
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
    let deadline = asked + Duration::from_secs_f64(args.timeout.clamp(0.0, 3600.0));
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            eprintln!(
                "gpupilot: {}: {} {old} → {} was sent to the trainer, which has not answered in {} s; \
                 it stays pending (`gpupilot ps` and the console show when it lands)",
                pending.run, args.knob, args.value, args.timeout
            );
            return Ok(ExitCode::FAILURE);
        }
        let update = match client.updates().recv_timeout(left) {
            Ok(u) => u,
            Err(_) => continue,
        };
        let Update::Event(rec) = update else {
            if matches!(update, Update::Closed | Update::Shutdown(_)) {
                anyhow::bail!("the daemon went away before the trainer answered");
            }
            continue;
        };
        match rec.event {
            NodeEvent::KnobApplied {
                run,
                change,
                rtt_ms,
                ..
            } if run == pending.run && change == pending.seq => {
                println!(
                    "{run}: {} {old} → {} applied by the trainer (round trip {rtt_ms:.1} ms)",
                    args.knob, args.value
                );
                return Ok(ExitCode::SUCCESS);
            }
            NodeEvent::KnobRejected {
                run,
                change,
                reason,
                ..
            } if run == pending.run && change == pending.seq => {
                eprintln!(
                    "gpupilot: {run}: the trainer refused {} = {}: {reason}; it keeps {old}",
                    args.knob, args.value
                );
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
    };
    let code = crate::trainer::run(&opts)?;
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}
