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

use std::process::ExitCode;
use std::time::Duration;

use crate::cli::{GlobalArgs, TuneEnergyArgs};
use crate::config::Paths;
use crate::control::tuner::live::{Outcome, drive};
use crate::control::tuner::session::{RESULT_FILE, prepare, save_result, stop_flag};
use crate::control::tuner::{Phase, Progress, TuneResult, TuneSettings, Unit, Window};

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
            let saved = save_result(&run, &result);
            if args.json {
                println!("{}", serde_json::to_string_pretty(&result)?);
            } else {
                print!("{}", render_result(&result));
                match &saved {
                    Ok(path) => println!("saved to {}", path.display()),
                    Err(e) => println!(
                        "could not save to {}: {}",
                        run.dir.join(RESULT_FILE).display(),
                        e.root_cause()
                    ),
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

#[cfg(test)]
mod tests {
    use super::*;

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
