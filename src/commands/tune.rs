//! `gpupilot tune energy RUN`, `tune status`, `tune stop`: the energy-optimal power-cap
//! search as a job of the daemon (`daemon::tune`), which these commands start and watch.
//!
//! `tune energy` asks the daemon to start the job (`tune_start`), then follows it every
//! refresh (`tune_status`), printing each cap and the curve as it grows; when the job ends it
//! prints the curve, the saving and the `[power] cap_w` line for the profile. Ctrl-C stops the
//! job (`tune_stop`: the starting caps come back first); a hang-up, SIGTERM or SIGKILL of this
//! command only ends the watching: the job goes on in the daemon. `--detach` starts it and
//! returns.
//!
//! On a data-parallel job of several ranks it tunes the job: the GPUs its ranks train on, all
//! at one cap, scored on their energy together against the samples of every rank
//! ([`crate::control::tuner::job`]).

use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::cli::{GlobalArgs, TuneCommand, TuneEnergyArgs, TuneStatusArgs, TuneStopArgs};
use crate::client::Client;
use crate::config::Paths;
use crate::control::tuner::record::{JobState, TuneJob, saving_line, suggestion};
use crate::control::tuner::session::flag_on;
use crate::control::tuner::{Phase, Progress, TuneResult, TuneSettings, Unit, Window};
use crate::protocol::{Request, Response};

/// How long following waits for a daemon that went away (restarting) to answer again.
const RECONNECT_WITHIN: Duration = Duration::from_secs(30);

/// `gpupilot tune …`.
pub fn tune(g: &GlobalArgs, cmd: &TuneCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        TuneCommand::Energy(args) => tune_energy(g, args),
        TuneCommand::Status(args) => tune_status(g, args),
        TuneCommand::Stop(args) => tune_stop(g, args),
    }
}

fn jobs(client: &Client, request: Request) -> anyhow::Result<Vec<TuneJob>> {
    match client.request(request)? {
        Response::TuneJobs { jobs } => Ok(jobs),
        other => anyhow::bail!("the daemon answered with something unexpected: {other:?}"),
    }
}

fn one(client: &Client, request: Request) -> anyhow::Result<TuneJob> {
    jobs(client, request)?
        .into_iter()
        .next()
        .ok_or_else(|| anyhow::anyhow!("the daemon answered with no job"))
}

/// `gpupilot tune energy RUN …`.
pub fn tune_energy(g: &GlobalArgs, args: &TuneEnergyArgs) -> anyhow::Result<ExitCode> {
    use tokio::signal::unix::SignalKind;
    let paths = Paths::from_env();
    let client = super::connect_or_spawn(g, &paths)?;
    // Before the job starts, so that a Ctrl-C from the first moment stops it.
    let interrupt = flag_on(vec![SignalKind::interrupt()]);
    let leave = flag_on(vec![SignalKind::terminate(), SignalKind::hangup()]);
    let settings = settings(args);
    let job = one(
        &client,
        Request::TuneStart {
            run: args.run.clone(),
            settings,
        },
    )?;
    let w = settings.window;
    eprintln!(
        "gpupilot: tuning job {}: {} of {} ({} search, {} + {} {} per setting, eta {}); it \
         runs in the daemon: Ctrl-C stops it and puts the caps and clocks back, closing the \
         terminal leaves it running (`gpupilot tune status {}`)",
        job.id,
        match settings.knob {
            crate::control::tuner::Knob::Cap => "the power cap",
            crate::control::tuner::Knob::Clocks => "the locked SM clocks",
            crate::control::tuner::Knob::Both => "the power cap, then the locked SM clocks,",
        },
        job.what,
        settings.strategy.name(),
        w.warmup,
        w.measure,
        unit_name(w.unit),
        settings.eta,
        job.id
    );
    if settings.with_batch {
        eprintln!(
            "gpupilot: warning: {}",
            crate::control::tuner::joint::BATCH_WARNING
        );
        if let Some(b) = job.progress.as_ref().and_then(|p| p.batch.as_ref()) {
            eprintln!(
                "gpupilot: batch sizes to search: {} (from {}; `gpupilot tune stop {}` puts batch {} back)",
                b.planned
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
                b.start,
                job.id,
                b.start
            );
        }
    }
    if args.detach {
        println!("{}", job.id);
        return Ok(ExitCode::SUCCESS);
    }
    let mut client = client;
    let mut last_line = String::new();
    let mut stopping = false;
    loop {
        if leave.load(Ordering::SeqCst) {
            eprintln!(
                "gpupilot: no longer following job {}; it goes on in the daemon (`gpupilot tune \
                 status {}`, `gpupilot tune stop {}`)",
                job.id, job.id, job.id
            );
            return Ok(ExitCode::FAILURE);
        }
        let now = match client.tune_follow(&job.id, &interrupt, &mut stopping) {
            Ok(j) => j,
            Err(e) => {
                // The daemon may be restarting: the job is in its state directory.
                eprintln!("gpupilot: lost the daemon ({e}); waiting for it to answer again");
                client = reconnect(&paths)?;
                client.tune_follow(&job.id, &interrupt, &mut stopping)?
            }
        };
        if let Some(p) = &now.progress {
            let line = progress_line(p);
            if line != last_line && !args.json && !now.state.is_final() {
                eprintln!("{line}");
                last_line = line;
            }
        }
        if now.state.is_final() {
            return ended(&now, args.json);
        }
        std::thread::sleep(Duration::from_secs_f64(g.refresh.clamp(0.2, 5.0)));
    }
}

fn reconnect(paths: &Paths) -> anyhow::Result<Client> {
    let until = Instant::now() + RECONNECT_WITHIN;
    loop {
        match Client::connect(paths) {
            Ok(c) => return Ok(c),
            Err(e) if Instant::now() >= until => return Err(e.into()),
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    }
}

/// A job that ended: its result, or why it stopped.
fn ended(job: &TuneJob, json: bool) -> anyhow::Result<ExitCode> {
    match (job.state, &job.result) {
        (JobState::Done, Some(result)) => {
            if json {
                println!("{}", serde_json::to_string_pretty(result)?);
                return Ok(ExitCode::SUCCESS);
            }
            print!("{}", render_result(result));
            let price = crate::control::settings::load(&Paths::from_env().config)
                .ok()
                .and_then(|s| s.price);
            if let Some(line) = saving_line(result, price.as_ref()) {
                println!("{line}");
            }
            match &job.saved {
                Some(Ok(path)) => println!("saved to {path}"),
                Some(Err(e)) => println!("could not save the result: {e}"),
                None => {}
            }
            println!("{}", suggestion(result));
            Ok(ExitCode::SUCCESS)
        }
        (JobState::Failed, _) => anyhow::bail!(
            "{}",
            job.why
                .clone()
                .unwrap_or_else(|| "the tuning job failed".into())
        ),
        _ => {
            let why = job.why.clone().unwrap_or_default();
            match &job.restored {
                Some(Err(e)) => eprintln!(
                    "gpupilot: tuning stopped ({why}) and putting the starting caps back failed: {e}; check with `gpupilot power`"
                ),
                _ => eprintln!(
                    "gpupilot: tuning stopped ({why}); every GPU of the run is back at its starting cap"
                ),
            }
            Ok(ExitCode::FAILURE)
        }
    }
}

/// `gpupilot tune status [JOB]`.
fn tune_status(g: &GlobalArgs, args: &TuneStatusArgs) -> anyhow::Result<ExitCode> {
    let client = super::connect_or_spawn(g, &Paths::from_env())?;
    let list = jobs(
        &client,
        Request::TuneStatus {
            job: args.job.clone(),
        },
    )?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(ExitCode::SUCCESS);
    }
    if list.is_empty() {
        println!("no tuning jobs");
    }
    let price = crate::control::settings::load(&Paths::from_env().config)
        .ok()
        .and_then(|s| s.price);
    for j in &list {
        println!("{}", status_line(j));
        if let (JobState::Done, Some(r)) = (j.state, &j.result) {
            if let Some(line) = saving_line(r, price.as_ref()) {
                println!("  {line}");
            }
            println!("  {}", suggestion(r).replace('\n', "\n  "));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `gpupilot tune stop JOB`.
fn tune_stop(g: &GlobalArgs, args: &TuneStopArgs) -> anyhow::Result<ExitCode> {
    let client = super::connect_or_spawn(g, &Paths::from_env())?;
    let j = one(
        &client,
        Request::TuneStop {
            job: args.job.clone(),
        },
    )?;
    println!("{}", status_line(&j));
    Ok(if j.state.is_final() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// One line per job: its id, state, what it tunes, and where it stands or how it ended.
pub fn status_line(j: &TuneJob) -> String {
    let mut s = format!("{}  {}  {}", j.id, j.state.name(), j.what);
    if j.resumed > 0 {
        s.push_str(&format!("  (resumed {}×)", j.resumed));
    }
    match (&j.result, &j.progress) {
        (Some(r), _) => s.push_str(&format!("\n  {}", r.summary())),
        (None, Some(p)) if !j.state.is_final() => {
            s.push_str(&format!("\n  {}", progress_line(p)));
        }
        _ => {}
    }
    if let (Some(why), None) = (&j.why, &j.result) {
        s.push_str(&format!("\n  {why}"));
        if let Some(Err(e)) = &j.restored {
            s.push_str(&format!("; the starting caps could not be put back: {e}"));
        }
    }
    s
}

/// The search `args` ask for.
fn settings(args: &TuneEnergyArgs) -> TuneSettings {
    let default = Window::default_for(args.search, args.seconds.is_some());
    let window = match args.seconds {
        Some(measure) => Window {
            unit: Unit::Seconds,
            warmup: args.warmup.unwrap_or(default.warmup),
            measure,
        },
        None => Window {
            unit: Unit::Steps,
            warmup: args.warmup.unwrap_or(default.warmup),
            measure: args.measure.unwrap_or(default.measure),
        },
    };
    TuneSettings {
        eta: args.eta,
        step_w: args.step_w,
        window,
        strategy: args.search,
        prior_w: None,
        with_batch: args.with == Some(crate::cli::TuneWith::BatchSize),
        knob: args.knob,
        step_mhz: args.step_mhz,
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
    let k = p.knob;
    let mut s = match p.cap_w {
        Some(w) => format!(
            "[{}/{}] {} {phase} {:>3.0}%",
            p.index + 1,
            p.planned,
            k.show(w),
            (100.0 * p.fraction / 10.0).floor() * 10.0
        ),
        None => phase.to_string(),
    };
    if !p.curve.is_empty() {
        let curve: Vec<String> = p
            .curve
            .iter()
            .map(|c| format!("{} {:.3}", k.show(c.cap_w), c.cost))
            .collect();
        s.push_str(&format!("  cost J/sample: {}", curve.join(", ")));
    }
    s
}

/// The result for people: the curve as a table, then the saving.
pub fn render_result(r: &TuneResult) -> String {
    let joint = r.batch.is_some();
    let mut out = String::from(if joint {
        "batch  cap W   J/sample   ms/sample   mean W   cost J/sample\n"
    } else if r.knob == crate::control::tuner::Knob::Clocks {
        "  MHz   J/sample   ms/sample   mean W   cost J/sample\n"
    } else {
        "cap W   J/sample   ms/sample   mean W   cost J/sample\n"
    });
    for c in &r.curve {
        if joint {
            out.push_str(&format!("{:>5} ", c.batch.unwrap_or(0)));
        }
        out.push_str(&format!(
            "{:>5.0} {:>10.3} {:>11.3} {:>8.0} {:>15.3}{}\n",
            c.cap_w,
            c.energy_per_sample_j,
            1000.0 * c.time_per_sample_s,
            c.avg_power_w,
            c.cost,
            if c.cap_w == r.best.cap_w && c.batch == r.best.batch {
                "  ← best"
            } else {
                ""
            }
        ));
    }
    if let Some(b) = &r.batch {
        if let Some(o) = b.oom {
            out.push_str(&format!(
                "batch {o} ran out of memory: it and larger batches were avoided\n"
            ));
        }
    }
    out.push_str(&r.summary());
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_saving_reads_in_energy_time_and_money() {
        let point = |cap_w: f64, j: f64, s: f64| crate::control::tuner::CapPoint {
            se_pct: None,
            cap_w,
            batch: None,
            energy_j: j,
            samples: 1.0,
            seconds: s,
            energy_per_sample_j: j,
            time_per_sample_s: s,
            avg_power_w: j / s,
            cost: j,
        };
        let r = TuneResult {
            confidence: None,
            saving_uncertainty_pct: None,
            knob: Default::default(),
            other: None,
            eta: 1.0,
            max_power_w: 700.0,
            window: Window::GOLDEN_STEPS,
            start_w: 700.0,
            default_w: 700.0,
            best: point(450.0, 3.6, 0.0036 * 1.1),
            default: Some(point(700.0, 7.2, 0.0036)),
            curve: Vec::new(),
            energy_saving_pct: Some(50.0),
            time_change_pct: Some(10.0),
            cost_saving_pct: Some(50.0),
            stopped_early: true,
            strategy: crate::control::tuner::Strategy::Golden,
            planned: 21,
            duration_s: 60.0,
            batch: None,
        };
        let price = crate::control::energy::Price {
            per_kwh: 0.25,
            currency: "EUR".into(),
        };
        // 3.6 J a sample less is 1 kWh per million samples; 0.36 ms more is 0.1 h.
        assert_eq!(
            saving_line(&r, Some(&price)).unwrap(),
            "per million samples at 450 W instead of 700 W: 1.00 kWh less, 0.10 h more, 0.25 EUR saved"
        );
        assert!(!saving_line(&r, None).unwrap().contains("EUR"));
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
            batch: None,
            knob: Default::default(),
        };
        assert_eq!(progress_line(&p), "[3/21] 650 W measuring  40%");
    }
}
