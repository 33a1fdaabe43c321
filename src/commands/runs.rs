//! `run`, `attach`, `ps`, `logs` and `stop`. On a terminal `run` and `attach` open the console
//! on the run; otherwise they follow its output as text.

use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::Context as _;

use super::follow::{self, Ended, Tail};
use super::{connect, connect_or_spawn, ctrl_c_flag, format_duration, is_broken_pipe, out};
use crate::cli::{AttachArgs, GlobalArgs, LogsArgs, PsArgs, RunArgs, StopArgs};
use crate::config::Paths;
use crate::profile::{Loader, Profile};
use crate::protocol::{LogStream, RunInfo};
use crate::supervisor::{Caller, KnobValues};

/// How much of each log `attach` shows before following.
const ATTACH_TAIL: u64 = 8 * 1024;

/// The loader `run` and `profile check` use: `extends` also looks in `$CONFIG/profiles`.
pub fn profile_loader(paths: &Paths) -> Loader {
    Loader::new().with_search_dir(paths.config.join("profiles"))
}

/// `gpupilot run PROFILE.toml | run -- CMD…`.
pub fn run(g: &GlobalArgs, args: &RunArgs) -> anyhow::Result<ExitCode> {
    let paths = Paths::from_env();
    let mut caller = Caller::current().context("reading the current directory")?;
    let mut profile = match &args.profile {
        Some(file) => profile_loader(&paths).load(file)?,
        None => {
            if !caller.env.contains_key("PYTHONUNBUFFERED") {
                caller.env.insert("PYTHONUNBUFFERED".into(), "1".into());
            }
            Profile::from_command(args.command.clone())
        }
    };
    if let Some(name) = &args.name {
        profile.name.clone_from(name);
    }
    let client = connect_or_spawn(g, &paths)?;
    let why = match &args.profile {
        Some(f) => format!("gpupilot run {}", f.display()),
        None => "gpupilot run -- …".to_string(),
    };
    let info = client.start_run(profile, caller, KnobValues::default(), Some(why))?;
    if args.detach {
        out(&format!("{}\n", info.id))?;
        return Ok(ExitCode::SUCCESS);
    }
    if crate::tui::on_terminal() {
        return super::console::attach(g, client, &info.id);
    }
    let stop = ctrl_c_flag();
    eprintln!(
        "gpupilot: started run {} (pid {}); following its output: Ctrl-C detaches, the run goes on",
        info.id,
        info.pid.map_or("?".into(), |p| p.to_string())
    );
    let tails = [
        Tail {
            stream: LogStream::Stdout,
            offset: 0,
            to_stderr: false,
        },
        Tail {
            stream: LogStream::Stderr,
            offset: 0,
            to_stderr: true,
        },
    ];
    finish_following(&client, &info.id, tails, &stop)
}

/// `gpupilot attach [RUN]`.
pub fn attach(g: &GlobalArgs, args: &AttachArgs) -> anyhow::Result<ExitCode> {
    let paths = Paths::from_env();
    let client = match &args.host {
        Some(host) => crate::client::Origin::ssh(host)
            .connect(&format!("gpupilot-cli {}", env!("CARGO_PKG_VERSION")))?,
        None => connect_or_spawn(g, &paths)?,
    };
    let info = match &args.run {
        Some(spec) => client.run(spec)?,
        None => {
            let runs = client.runs()?;
            let newest_live = runs.iter().rev().find(|r| !r.is_final());
            match newest_live.or(runs.last()).cloned() {
                Some(r) => r,
                // Another node without runs: its console all the same.
                None if args.host.is_some() && crate::tui::on_terminal() => {
                    return super::console::remote(g, client);
                }
                None => anyhow::bail!("there are no runs yet: start one with `gpupilot run`"),
            }
        }
    };
    if crate::tui::on_terminal() {
        return super::console::attach(g, client, &info.id);
    }
    let stop = ctrl_c_flag();
    let mut tails = [
        Tail {
            stream: LogStream::Stdout,
            offset: 0,
            to_stderr: false,
        },
        Tail {
            stream: LogStream::Stderr,
            offset: 0,
            to_stderr: true,
        },
    ];
    for t in tails.iter_mut() {
        t.offset = follow::print_tail(&client, &info.id, *t, ATTACH_TAIL)?;
    }
    if info.is_final() {
        eprintln!(
            "gpupilot: run {} has ended: {}",
            info.id,
            info.description.as_deref().unwrap_or(info.status.as_str())
        );
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!(
        "gpupilot: attached to run {} ({}); Ctrl-C detaches, the run goes on",
        info.id,
        info.status.as_str()
    );
    finish_following(&client, &info.id, tails, &stop)
}

fn finish_following(
    client: &crate::client::Client,
    id: &str,
    mut tails: [Tail; 2],
    stop: &AtomicBool,
) -> anyhow::Result<ExitCode> {
    match follow::pump(client, id, &mut tails, true, stop) {
        Ok(Ended::Finished(info)) => {
            eprintln!(
                "gpupilot: run {} ended: {}",
                info.id,
                info.description.as_deref().unwrap_or(info.status.as_str())
            );
            Ok(ExitCode::from(follow::exit_status(&info)))
        }
        Ok(_) => {
            eprintln!(
                "gpupilot: detached; run {id} goes on (`gpupilot attach {id}` follows it again)"
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) if is_broken_pipe(&e) => Ok(ExitCode::SUCCESS),
        Err(e) => Err(e),
    }
}

/// `gpupilot ps [--json]`.
pub fn ps(args: &PsArgs) -> anyhow::Result<ExitCode> {
    let client = connect(&Paths::from_env())?;
    let runs = client.runs()?;
    let text = if args.json {
        serde_json::to_string_pretty(&runs)? + "\n"
    } else {
        ps_table(&runs)
    };
    match out(&text) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        r => r?,
    }
    Ok(ExitCode::SUCCESS)
}

/// The `ps` table: one line per run, oldest first.
pub fn ps_table(runs: &[RunInfo]) -> String {
    let header = [
        "ID", "STATUS", "PID", "UPTIME", "RESTARTS", "EXIT", "GPUS", "ENERGY", "COMMAND",
    ];
    let rows: Vec<[String; 9]> = runs
        .iter()
        .map(|r| {
            let exit = match (r.exit_code, &r.signal_name) {
                _ if !r.is_final() && r.exit_code.is_none() => "-".to_string(),
                (Some(c), _) => c.to_string(),
                (None, Some(s)) => s.clone(),
                (None, None) if r.is_final() => "?".to_string(),
                (None, None) => "-".to_string(),
            };
            [
                r.id.clone(),
                r.status.as_str().to_string(),
                match r.pid {
                    Some(p) if !r.is_final() => p.to_string(),
                    _ => "-".into(),
                },
                r.uptime_s.map_or("-".into(), format_duration),
                r.restarts.to_string(),
                exit,
                r.gpus.clone(),
                r.energy.as_ref().map_or("-".into(), energy_cell),
                shell_words::join(&r.command),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(cell);
            } else {
                s.push_str(&format!("{cell:<w$}  ", w = widths[i]));
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut text = line(header.to_vec());
    for row in &rows {
        text.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    if runs.is_empty() {
        text.push_str("(no runs yet: `gpupilot run -- CMD…` starts one)\n");
    }
    text
}

/// A run's energy for the `ps` table: kWh, and J/sample when the run reports samples.
fn energy_cell(e: &crate::control::energy::RunEnergy) -> String {
    let kwh = if e.kwh >= 1.0 {
        format!("{:.2} kWh", e.kwh)
    } else {
        format!("{:.0} Wh", e.kwh * 1000.0)
    };
    match e.j_per_sample {
        Some(j) => format!("{kwh} ({j:.2} J/sample)"),
        None => kwh,
    }
}

/// `gpupilot logs RUN [-f] [--stderr]`.
pub fn logs(args: &LogsArgs) -> anyhow::Result<ExitCode> {
    let client = connect(&Paths::from_env())?;
    let stream = if args.stderr {
        LogStream::Stderr
    } else {
        LogStream::Stdout
    };
    // Resolve once: `last` must not move to a newer run while we follow.
    let id = client.run(&args.run)?.id;
    let stop = if args.follow {
        ctrl_c_flag()
    } else {
        Default::default()
    };
    let mut tails = [Tail {
        stream,
        offset: 0,
        to_stderr: false,
    }];
    match follow::pump(&client, &id, &mut tails, args.follow, &stop) {
        Ok(_) => Ok(ExitCode::SUCCESS),
        Err(e) if is_broken_pipe(&e) => Ok(ExitCode::SUCCESS),
        Err(e) => Err(e),
    }
}

/// `gpupilot stop RUN [--kill] [--grace SECONDS]`: ask, then wait for the run to end.
pub fn stop(args: &StopArgs) -> anyhow::Result<ExitCode> {
    let client = connect(&Paths::from_env())?;
    let why = if args.kill {
        "gpupilot stop --kill"
    } else {
        "gpupilot stop"
    };
    let grace = (!args.kill).then_some(args.grace);
    let info = client.stop_run(&args.run, args.kill, grace, Some(why.into()))?;
    let wait = Duration::from_secs_f64(grace.unwrap_or(0.0)) + Duration::from_secs(10);
    let deadline = Instant::now() + wait;
    let mut now = info;
    while !now.is_final() {
        if Instant::now() >= deadline {
            eprintln!(
                "gpupilot: run {} is still {} after {} s; `gpupilot ps` shows when it has ended",
                now.id,
                now.status.as_str(),
                wait.as_secs()
            );
            return Ok(ExitCode::FAILURE);
        }
        std::thread::sleep(Duration::from_millis(100));
        now = client.run(&now.id)?;
    }
    out(&format!(
        "{}: {}\n",
        now.id,
        now.description.as_deref().unwrap_or(now.status.as_str())
    ))?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::energy::{GpuEnergy, RunEnergy};

    #[test]
    fn the_energy_column_reads_in_wh_or_kwh_with_j_per_sample() {
        let gpu = |j| GpuEnergy {
            gpu: 0,
            energy_j: j,
        };
        // 0.5 kWh over 1e6 samples: 1.8 J/sample.
        let e = RunEnergy::new(vec![gpu(1.8e6)], Some(1_000_000), None, None);
        assert_eq!(energy_cell(&e), "500 Wh (1.80 J/sample)");
        let e = RunEnergy::new(vec![gpu(9.0e6)], None, None, None);
        assert_eq!(energy_cell(&e), "2.50 kWh");
        assert!(
            ps_table(&[])
                .starts_with("ID  STATUS  PID  UPTIME  RESTARTS  EXIT  GPUS  ENERGY  COMMAND")
        );
    }
}
