//! `run`, `attach`, `ps`, `logs` and `stop`. On a terminal `run` and `attach` open the console
//! on the run; otherwise they follow its output as text. `ps` asks each live run's trainer
//! side (ranks, job figures, knobs) with one `run_metrics` of no reports.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;

use super::follow::{self, Ended, Tail};
use super::{connect, connect_or_spawn, ctrl_c_flag, format_duration, is_broken_pipe, out};
use crate::cli::{AttachArgs, GlobalArgs, LogsArgs, PsArgs, RunArgs, StopArgs};
use crate::client::Client;
use crate::config::Paths;
use crate::profile::{Loader, Profile};
use crate::protocol::{
    JobFigures, KnobState, LogStream, RankInfo, Request, Response, RunInfo, StagedChange,
    TrainerInfo,
};
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
            Profile::for_command(args.command.clone(), &args.knobs).map_err(anyhow::Error::msg)?
        }
    };
    if let Some(name) = &args.name {
        profile.name.clone_from(name);
    }
    let client = connect_or_spawn(g, &paths)?;
    if let Some(spec) = &args.gpu {
        const VAR: &str = "CUDA_VISIBLE_DEVICES";
        let snap = client.status()?.snapshot.ok_or_else(|| {
            anyhow::anyhow!("--gpu needs the daemon's GPUs, and it has no telemetry yet: try again")
        })?;
        match super::run_gpu::visible_devices(spec, &snap) {
            Ok(value) => {
                // --gpu replaces whatever the profile or the caller chose.
                profile.run.gpus = crate::profile::GpuSelection::Inherit;
                profile.run.env.remove(VAR);
                caller.env.insert(VAR.into(), value);
            }
            Err(e) => {
                super::err_line(&format!("gpupilot: {e}"));
                return Ok(ExitCode::from(2));
            }
        }
    }
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
            rank: None,
        },
        Tail {
            stream: LogStream::Stderr,
            offset: 0,
            to_stderr: true,
            rank: None,
        },
    ];
    finish_following(client, &info.id, tails, &stop)
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
            rank: None,
        },
        Tail {
            stream: LogStream::Stderr,
            offset: 0,
            to_stderr: true,
            rank: None,
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
    finish_following(client, &info.id, tails, &stop)
}

fn finish_following(
    mut client: Client,
    id: &str,
    mut tails: [Tail; 2],
    stop: &AtomicBool,
) -> anyhow::Result<ExitCode> {
    match follow::pump(&mut client, id, &mut tails, true, stop) {
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
    // On the system daemon, a run's trainer side is root's (docs/protocol.md, "Connecting"):
    // another user's `ps` lists the runs without asking for it, rather than being refused.
    let may_read_runs =
        !crate::config::paths::system_daemon_selected() || rustix::process::geteuid().is_root();
    let trainers = if may_read_runs {
        live_trainers(&client, &runs)
    } else {
        BTreeMap::new()
    };
    let text = if args.json {
        serde_json::to_string_pretty(&ps_json(&runs, &trainers))? + "\n"
    } else {
        ps_table(&runs, &trainers)
    };
    match out(&text) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        r => r?,
    }
    Ok(ExitCode::SUCCESS)
}

/// The trainer side of every live run, by run id: one `run_metrics` each, asking for no
/// reports (only where the trainer, its ranks and its knobs stand). A run that ended in
/// between, or an answer that does not come, leaves its run without one.
fn live_trainers(client: &Client, runs: &[RunInfo]) -> BTreeMap<String, TrainerInfo> {
    runs.iter()
        .filter(|r| !r.is_final())
        .filter_map(|r| {
            let asked = Request::RunMetrics {
                run: r.id.clone(),
                since: 0,
                max: Some(0),
            };
            match client.request(asked) {
                Ok(Response::RunMetrics { trainer, .. }) => Some((r.id.clone(), trainer)),
                _ => None,
            }
        })
        .collect()
}

/// A run as `ps --json` prints it: the daemon's run, and for a live run its trainer.
#[derive(Debug, Serialize)]
struct PsRun<'a> {
    #[serde(flatten)]
    run: &'a RunInfo,
    /// The run's report.html, once written (at its end, or by `gpupilot report`).
    #[serde(skip_serializing_if = "Option::is_none")]
    report: Option<std::path::PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    trainer: Option<PsTrainer<'a>>,
}

/// A live run's trainer side in `ps --json`: its ranks, the job's figures, its knobs and a
/// change to several ranks in flight.
#[derive(Debug, Serialize)]
struct PsTrainer<'a> {
    /// Any rank attached over the trainer channel now.
    attached: bool,
    /// Rank 0's process (the only one of a single-process run).
    pid: Option<u32>,
    world_size: Option<u32>,
    ranks: Vec<PsRank<'a>>,
    /// The job's figures over its ranks, else the newest report's (a run of one process, or
    /// one whose output is read for metrics).
    job: Option<JobFigures>,
    knobs: &'a [KnobState],
    staged: Option<&'a StagedChange>,
    /// The framework whose log lines the run's metrics are read from (`[metrics] preset`).
    #[serde(skip_serializing_if = "Option::is_none")]
    metrics_preset: Option<&'a str>,
}

/// One rank in `ps --json`: who and where it is, and its newest report's figures.
#[derive(Debug, Serialize)]
struct PsRank<'a> {
    rank: u32,
    local_rank: Option<u32>,
    host: Option<&'a str>,
    /// The physical GPU index (as NVML numbers it).
    gpu: Option<u32>,
    gpu_uuid: Option<&'a str>,
    attached: bool,
    pid: Option<u32>,
    step: Option<u64>,
    step_time_s: Option<f64>,
    data_wait_s: Option<f64>,
    samples_per_s: Option<f64>,
    steps_per_s: Option<f64>,
}

impl<'a> PsRank<'a> {
    fn of(r: &'a RankInfo) -> PsRank<'a> {
        let report = r.last.as_ref().map(|p| &p.report);
        PsRank {
            rank: r.spec.rank,
            local_rank: r.spec.local_rank,
            host: r.spec.host.as_deref(),
            gpu: r.spec.gpu,
            gpu_uuid: r.spec.gpu_uuid.as_deref(),
            attached: r.attached,
            pid: r.pid,
            step: report.and_then(|p| p.step),
            step_time_s: report.and_then(|p| p.step_time_s),
            data_wait_s: report.and_then(|p| p.data_wait_s),
            samples_per_s: report.and_then(|p| p.samples_per_s),
            steps_per_s: r.steps_per_s,
        }
    }
}

/// What `ps --json` prints: every run, oldest first, live ones with their trainer.
fn ps_json<'a>(runs: &'a [RunInfo], trainers: &'a BTreeMap<String, TrainerInfo>) -> Vec<PsRun<'a>> {
    runs.iter()
        .map(|run| PsRun {
            run,
            report: report_of(run),
            trainer: trainers.get(&run.id).map(|t| {
                let mut ranks: Vec<PsRank> = t.ranks.iter().map(PsRank::of).collect();
                ranks.sort_by_key(|r| r.rank);
                PsTrainer {
                    attached: t.attached,
                    pid: t.pid,
                    world_size: t.world_size,
                    ranks,
                    job: t.figures(),
                    knobs: &t.knobs,
                    staged: t.staged.as_ref(),
                    metrics_preset: t.metrics_preset.as_deref(),
                }
            }),
        })
        .collect()
}

/// The run's report.html, where there is one.
fn report_of(run: &RunInfo) -> Option<std::path::PathBuf> {
    let path = crate::report::html_path(&run.dir);
    path.is_file().then_some(path)
}

/// A run of several ranks, as the `ps` table says it: `4 ranks`, `3/4 ranks attached`;
/// None for a single-process run (or none attached yet).
pub fn ranks_cell(t: &TrainerInfo) -> Option<String> {
    let world = t.world_size.unwrap_or(0).max(t.ranks.len() as u32);
    if world < 2 {
        return None;
    }
    let attached = t.ranks.iter().filter(|r| r.attached).count();
    Some(if attached as u32 == world {
        format!("{world} ranks")
    } else {
        format!("{attached}/{world} ranks attached")
    })
}

/// The `ps` table: one line per run, oldest first. A RANKS column comes in when a live run has
/// several ranks, a METRICS column when a live run's metrics are read from a framework's log
/// lines (its preset).
pub fn ps_table(runs: &[RunInfo], trainers: &BTreeMap<String, TrainerInfo>) -> String {
    let ranks: Vec<Option<String>> = runs
        .iter()
        .map(|r| trainers.get(&r.id).and_then(ranks_cell))
        .collect();
    let presets: Vec<Option<&str>> = runs
        .iter()
        .map(|r| {
            trainers
                .get(&r.id)
                .and_then(|t| t.metrics_preset.as_deref())
        })
        .collect();
    let with_ranks = ranks.iter().any(Option::is_some);
    let with_presets = presets.iter().any(Option::is_some);
    let mut header = vec!["ID", "STATUS"];
    if with_ranks {
        header.push("RANKS");
    }
    if with_presets {
        header.push("METRICS");
    }
    header.extend([
        "PID", "UPTIME", "RESTARTS", "EXIT", "GPUS", "ENERGY", "REPORT", "COMMAND",
    ]);
    let rows: Vec<Vec<String>> = runs
        .iter()
        .zip(ranks.iter().zip(&presets))
        .map(|(r, (ranks, preset))| {
            let exit = match (r.exit_code, &r.signal_name) {
                _ if !r.is_final() && r.exit_code.is_none() => "-".to_string(),
                (Some(c), _) => c.to_string(),
                (None, Some(s)) => s.clone(),
                (None, None) if r.is_final() => "?".to_string(),
                (None, None) => "-".to_string(),
            };
            let mut row = vec![crate::text::printable(&r.id), r.status.as_str().to_string()];
            if with_ranks {
                row.push(ranks.clone().unwrap_or_else(|| "-".into()));
            }
            if with_presets {
                row.push(preset.map_or("-".into(), crate::text::printable));
            }
            row.extend([
                match r.pid {
                    Some(p) if !r.is_final() => p.to_string(),
                    _ => "-".into(),
                },
                r.uptime_s.map_or("-".into(), format_duration),
                r.restarts.to_string(),
                exit,
                r.gpus.clone(),
                r.energy.as_ref().map_or("-".into(), energy_cell),
                report_of(r).map_or("-".into(), |p| p.display().to_string()),
                // A command with a newline or an escape in it must not break the table.
                crate::text::printable(&shell_words::join(&r.command)),
            ]);
            row
        })
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
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
    let mut text = line(header);
    for row in &rows {
        text.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    if runs.is_empty() {
        text.push_str("(no runs yet: `gpupilot run -- CMD…` starts one)\n");
    }
    text
}

/// A run's energy for the `ps` table: kWh, J/sample when the run reports samples, then what
/// is configured of cost, CO2 and the facility's energy (× PUE).
fn energy_cell(e: &crate::control::energy::RunEnergy) -> String {
    use crate::units::fixed;
    let mut s = if e.kwh >= 1.0 {
        format!("{} kWh", fixed(e.kwh, 2))
    } else {
        format!("{} Wh", fixed(e.kwh * 1000.0, 0))
    };
    if let Some(j) = e.j_per_sample {
        s.push_str(&format!(" ({} J/sample)", fixed(j, 2)));
    }
    for part in e.rated() {
        s.push_str(" · ");
        s.push_str(&part);
    }
    s
}

/// `gpupilot logs RUN [-f] [--stderr] [--rank N]`.
pub fn logs(args: &LogsArgs) -> anyhow::Result<ExitCode> {
    let mut client = connect(&Paths::from_env())?;
    let stream = if args.stderr {
        LogStream::Stderr
    } else {
        LogStream::Stdout
    };
    // Resolve once: `last` must not move to a newer run while we follow.
    let info = client.run(&args.run)?;
    if let Some(rank) = args.rank {
        check_rank(&info, rank)?;
    }
    let id = info.id;
    let stop = if args.follow {
        ctrl_c_flag()
    } else {
        Default::default()
    };
    let mut tails = [Tail {
        stream,
        offset: 0,
        to_stderr: false,
        rank: args.rank,
    }];
    match follow::pump(&mut client, &id, &mut tails, args.follow, &stop) {
        Ok(_) => Ok(ExitCode::SUCCESS),
        Err(e) if is_broken_pipe(&e) => Ok(ExitCode::SUCCESS),
        Err(e) => Err(e),
    }
}

/// `logs --rank N` needs a job whose lines say their rank (its ranks started by gpupilot) and
/// that has rank N.
fn check_rank(info: &RunInfo, rank: u32) -> anyhow::Result<()> {
    let Some(nproc) = crate::supervisor::launch::ranks_nproc(&info.command) else {
        anyhow::bail!(
            "run {} was not started with `launcher = \"ranks\"`: its lines do not say which rank \
             wrote them, so --rank cannot pick them out (`gpupilot logs {}` shows them all)",
            info.id,
            info.id
        );
    };
    if rank >= nproc {
        let which = if nproc == 1 {
            "1 rank, rank 0".to_string()
        } else {
            format!("{nproc} ranks, 0 to {}", nproc - 1)
        };
        anyhow::bail!("run {} has {which}: there is no rank {rank}", info.id);
    }
    Ok(())
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
    use crate::protocol::{MetricsPoint, MetricsReport, RankSpec};
    use crate::supervisor::RunStatus;

    fn run(id: &str, status: RunStatus) -> RunInfo {
        RunInfo {
            id: id.into(),
            name: "train".into(),
            status,
            pid: Some(4242),
            attempt: 0,
            restarts: 0,
            started_at: "2026-11-30T04:07:54.920Z".into(),
            ended_at: None,
            uptime_s: Some(63.0),
            exit_code: None,
            signal_name: None,
            description: None,
            command: vec!["python3".into(), "train.py".into()],
            cwd: "/home/a".into(),
            gpus: "0,1,2,3".into(),
            adopted: false,
            dir: "/tmp/runs".into(),
            energy: None,
            slurm: None,
        }
    }

    fn rank(n: u32, attached: bool) -> RankInfo {
        RankInfo {
            spec: RankSpec {
                rank: n,
                world_size: 4,
                local_rank: Some(n),
                host: Some("node-a".into()),
                gpu: Some(n),
                gpu_uuid: None,
            },
            attached,
            pid: Some(500 + n),
            last: Some(MetricsPoint {
                n: 7,
                t: 1.0,
                from: "trainer".into(),
                rank: Some(n),
                report: MetricsReport {
                    step: Some(1200 + n as u64),
                    step_time_s: Some(0.125 * (n + 1) as f64),
                    ..MetricsReport::default()
                },
            }),
            steps_per_s: Some(9.5),
        }
    }

    fn trainer(attached: u32) -> TrainerInfo {
        TrainerInfo {
            attached: true,
            world_size: Some(4),
            // Not in rank order: ps sorts them.
            ranks: (0..4).rev().map(|n| rank(n, n < attached)).collect(),
            job: Some(JobFigures {
                reporting: 4,
                step: Some(1200),
                samples_per_s: Some(4000.0),
                step_time_s: Some(0.13),
                slowest_rank: Some(3),
                data_wait_s: None,
                loss: Some(0.5),
                tokens_per_s: None,
            }),
            ..TrainerInfo::default()
        }
    }

    #[test]
    fn a_preset_read_runs_metrics_show_in_a_metrics_column_and_the_json() {
        let runs = [run("a", RunStatus::Succeeded), run("b", RunStatus::Running)];
        let mut trainers = BTreeMap::new();
        trainers.insert("b".to_string(), TrainerInfo::default());
        assert!(!ps_table(&runs, &trainers).contains("METRICS"));
        trainers.insert(
            "b".to_string(),
            TrainerInfo {
                metrics_preset: Some("transformers".into()),
                ..TrainerInfo::default()
            },
        );
        let table = ps_table(&runs, &trainers);
        let lines: Vec<&str> = table.lines().collect();
        assert!(
            lines[0].starts_with("ID  STATUS     METRICS       PID"),
            "{table}"
        );
        assert!(
            lines[1].starts_with("a   succeeded  -             -"),
            "{table}"
        );
        assert!(
            lines[2].starts_with("b   running    transformers  4242"),
            "{table}"
        );
        let v = serde_json::to_value(ps_json(&runs, &trainers)).unwrap();
        assert_eq!(v[1]["trainer"]["metrics_preset"], "transformers", "{v}");
    }

    #[test]
    fn the_table_has_a_ranks_column_only_when_a_run_has_several_ranks() {
        let runs = [run("a", RunStatus::Succeeded), run("b", RunStatus::Running)];
        let mut trainers = BTreeMap::new();
        trainers.insert("b".to_string(), TrainerInfo::default());
        let plain = ps_table(&runs, &trainers);
        assert!(!plain.contains("RANKS"), "{plain}");
        trainers.insert("b".to_string(), trainer(4));
        let table = ps_table(&runs, &trainers);
        let lines: Vec<&str> = table.lines().collect();
        assert!(
            lines[0].starts_with("ID  STATUS     RANKS    PID"),
            "{table}"
        );
        assert!(lines[1].starts_with("a   succeeded  -        -"), "{table}");
        assert!(
            lines[2].starts_with("b   running    4 ranks  4242"),
            "{table}"
        );
        trainers.insert("b".to_string(), trainer(3));
        let table = ps_table(&runs, &trainers);
        assert!(table.contains(" 3/4 ranks attached "), "{table}");
    }

    #[test]
    fn the_json_carries_a_live_runs_ranks_and_job_figures() {
        let runs = [run("a", RunStatus::Stopped), run("b", RunStatus::Running)];
        let mut trainers = BTreeMap::new();
        trainers.insert("b".to_string(), trainer(3));
        let v = serde_json::to_value(ps_json(&runs, &trainers)).unwrap();
        assert_eq!(v[0]["id"], "a");
        assert!(v[0].get("trainer").is_none(), "an ended run has none: {v}");
        let t = &v[1]["trainer"];
        assert_eq!(
            v[1]["status"], "running",
            "the run's own fields stay at the top"
        );
        assert_eq!(t["world_size"], 4);
        let ranks = t["ranks"].as_array().unwrap();
        assert_eq!(ranks.len(), 4);
        assert_eq!(ranks[0]["rank"], 0);
        assert_eq!(ranks[3]["rank"], 3);
        assert_eq!(ranks[3]["attached"], false);
        assert_eq!(ranks[2]["host"], "node-a");
        assert_eq!(ranks[2]["gpu"], 2);
        assert_eq!(ranks[2]["pid"], 502);
        assert_eq!(ranks[2]["step"], 1202);
        assert_eq!(ranks[2]["step_time_s"], 0.375);
        assert_eq!(t["job"]["samples_per_s"], 4000.0);
        assert_eq!(t["job"]["slowest_rank"], 3);
        assert_eq!(t["job"]["loss"], 0.5);
    }

    #[test]
    fn no_gpu_energy_reads_0_never_minus_0_and_an_unmeasured_run_reads_na() {
        // The figures of no GPU at all: +0 at the source, `sum` of nothing being -0.0.
        let e = RunEnergy::new(vec![], Some(1000), None, None);
        assert!(e.energy_j.is_sign_positive() && e.kwh.is_sign_positive());
        assert_eq!(energy_cell(&e), "0 Wh (0.00 J/sample)");
        assert_eq!(
            serde_json::to_value(&e).unwrap()["energy_j"].to_string(),
            "0.0"
        );
        // A run with no energy figure (charged no GPU): N/A in the table, null in the JSON.
        let runs = [run("a", RunStatus::Succeeded)];
        let table = ps_table(&runs, &BTreeMap::new());
        let row = table.lines().nth(1).unwrap();
        assert!(!row.contains("Wh") && !row.contains("-0"), "{table}");
        let v = serde_json::to_value(ps_json(&runs, &BTreeMap::new())).unwrap();
        assert!(v[0]["energy"].is_null(), "{v}");
    }

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
        let rates = crate::control::energy::EnergyRates {
            price: Some(crate::control::energy::Price {
                per_kwh: 0.2,
                currency: "EUR".into(),
            }),
            grid_co2_g_per_kwh: Some(300.0),
            pue: Some(1.4),
        };
        let e = e.with_rates(&rates);
        assert_eq!(
            energy_cell(&e),
            "2.50 kWh · 0.50 EUR · 750 g CO2 · facility 3.500 kWh (PUE 1.40)"
        );
        assert!(
            ps_table(&[], &BTreeMap::new()).starts_with(
                "ID  STATUS  PID  UPTIME  RESTARTS  EXIT  GPUS  ENERGY  REPORT  COMMAND"
            )
        );
    }
}
