//! The console's ways in: `gpupilot` (no command) and `demo`, and the console side of `run`
//! and `attach`.
//!
//! Every console but the demo's is a client of the daemon (started in the background when none
//! answers); quitting it detaches, and the daemon and its runs go on. The demo samples a
//! simulated node in-process and leaves nothing running when it quits.

use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;

use super::{connect_or_spawn, daemon_args};
use crate::cli::{GlobalArgs, SourceKind};
use crate::client::Client;
use crate::config::Paths;
use crate::profile::{Knob, Knobs, Launcher, OnOom, Profile, RanksSpec};
use crate::supervisor::Caller;
use crate::telemetry::open::sim_config;
use crate::tui::{self, DataSource, TuiOptions};

/// `gpupilot`: the console on the local daemon.
pub fn console(g: &GlobalArgs) -> anyhow::Result<ExitCode> {
    let paths = Paths::from_env();
    let client = connect_or_spawn(g, &paths)?;
    tui::run(options(g, DataSource::Daemon(client), None))?;
    Ok(ExitCode::SUCCESS)
}

/// The console on another node's daemon (`attach --host NODE` where there is no run).
pub fn remote(g: &GlobalArgs, client: Client) -> anyhow::Result<ExitCode> {
    tui::run(options(g, DataSource::Daemon(client), None))?;
    Ok(ExitCode::SUCCESS)
}

/// `gpupilot demo`: the console on a simulated node with a synthetic training run. A daemon
/// of its own (in a temporary `GPUPILOT_HOME`, `--source sim`) samples the node and supervises
/// the run; quitting stops both and removes the directory, so the demo leaves nothing behind.
///
/// The run is a data-parallel job of one synthetic rank per GPU (up to [`DEMO_RANKS`]), and
/// the node has a cooling fault: about a minute in, one of the job's GPUs runs hot, reaches its
/// slowdown threshold and throttles, and its rank becomes the straggler the advisor names.
pub fn demo(g: &GlobalArgs) -> anyhow::Result<ExitCode> {
    // A bad --model or --workload fails here, plainly, before a daemon starts (which builds
    // and warms the node itself).
    sim_config(&g.sim.spec())?;
    let demo = Demo::start(g)?;
    let result = tui::run(options(g, DataSource::Daemon(demo.client()?), None));
    drop(demo);
    result?;
    Ok(ExitCode::SUCCESS)
}

/// The most ranks the demo's job has (one per simulated GPU).
pub const DEMO_RANKS: u32 = 4;
/// Wall-clock seconds after the demo starts when its hot GPU's cooling fails.
pub const DEMO_FAULT_AFTER_S: f64 = 60.0;
/// What the fault multiplies that GPU's thermal resistance by: enough for an H100 training at
/// full power to settle far above its slowdown threshold (gpusim's thermal model).
pub const DEMO_FAULT_FACTOR: f64 = 3.0;

/// The demo job's ranks on a node of `gpus` GPUs.
fn demo_ranks(gpus: u32) -> u32 {
    gpus.clamp(1, DEMO_RANKS)
}

/// The GPU whose cooling fails in the demo: GPU 2, or the job's last on a smaller node; none
/// for a single process (a straggler needs others to hold back).
fn demo_hot_gpu(gpus: u32) -> Option<u32> {
    let ranks = demo_ranks(gpus);
    (ranks >= 2).then(|| 2.min(ranks - 1))
}

/// The demo's daemon and run, stopped and removed when dropped (also on a panic).
struct Demo {
    home: tempfile::TempDir,
    paths: Paths,
    daemon_pid: Option<u32>,
    run: Option<String>,
}

impl Demo {
    fn start(g: &GlobalArgs) -> anyhow::Result<Demo> {
        let exe = std::env::current_exe().context("finding the gpupilot binary")?;
        let home = tempfile::Builder::new()
            .prefix("gpupilot-demo-")
            .tempdir()
            .context("making the demo's directory")?;
        let paths = Paths {
            config: home.path().join("config"),
            state: home.path().join("state"),
            runtime: home.path().join("run"),
        };
        let mut demo = Demo {
            home,
            paths,
            daemon_pid: None,
            run: None,
        };
        let mut sim = g.clone();
        sim.source = SourceKind::Sim;
        let mut daemon = std::process::Command::new(&exe);
        if let Some(hot) = demo_hot_gpu(g.sim.gpus) {
            daemon.env(
                crate::telemetry::sim::COOLING_FAULT_ENV,
                format!("{hot}:{DEMO_FAULT_AFTER_S}:{DEMO_FAULT_FACTOR}"),
            );
        }
        let out = daemon
            .env("GPUPILOT_HOME", demo.home.path())
            // The demo's daemon is its own, never the system daemon.
            .env_remove("GPUPILOT_SYSTEM")
            .arg("daemon")
            .arg("--detach")
            .args(daemon_args(&sim))
            .stdin(std::process::Stdio::null())
            .output()
            .context("starting the demo's daemon")?;
        if !out.status.success() {
            anyhow::bail!(
                "the demo's daemon did not start: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        demo.daemon_pid = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .find_map(|w| w.parse().ok());
        let client = demo.client()?;
        let mut caller = Caller::current().context("reading this process's environment")?;
        caller.cwd = demo.home.path().to_path_buf();
        let run = client.start_run(
            demo_profile(&exe, g),
            caller,
            Default::default(),
            Some("gpupilot demo".into()),
        )?;
        demo.run = Some(run.id);
        Ok(demo)
    }

    fn client(&self) -> anyhow::Result<Client> {
        Ok(Client::connect(&self.paths)?)
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        if let (Some(run), Ok(client)) = (&self.run, self.client()) {
            let _ = client.stop_run(run, true, None, Some("gpupilot demo ended".into()));
            let deadline = std::time::Instant::now() + Duration::from_secs(3);
            while std::time::Instant::now() < deadline
                && client.run(run).map(|r| !r.is_final()).unwrap_or(false)
            {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        if let Some(pid) = self
            .daemon_pid
            .and_then(|p| rustix::process::Pid::from_raw(p as i32))
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            // The daemon removes its socket last; wait for that so the directory goes cleanly.
            let socket = crate::ipc::socket_path(&self.paths);
            let deadline = std::time::Instant::now() + Duration::from_secs(3);
            while socket.exists() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// The demo's run: a data-parallel job of synthetic trainers, one rank per GPU of the
/// simulated node (up to [`DEMO_RANKS`]; a single process on a one-GPU node), started by the
/// `ranks` launcher with torchrun's environment, with both knobs and the out-of-memory policy,
/// so every control of the Run view (and its rank table) has something to act on.
fn demo_profile(exe: &std::path::Path, g: &GlobalArgs) -> Profile {
    // Only what differs from the trainer's defaults: the command line stays short enough for
    // the Run view's header to show the run's directory after it.
    let mut argv = vec![exe.display().to_string(), "synthetic-train".into()];
    let model = match g.sim.workload.as_str() {
        "idle" | "none" => "resnet50",
        w => w,
    };
    for (flag, value, default) in [
        ("--train-model", model.to_string(), "resnet50"),
        ("--gpu-model", g.sim.model.clone(), "h100-sxm"),
        ("--seed", g.sim.seed.to_string(), "0"),
    ] {
        if value != default {
            argv.extend([flag.to_string(), value]);
        }
    }
    let mut p = Profile::from_command(argv);
    p.name = "demo-train".into();
    let ranks = demo_ranks(g.sim.gpus);
    // Its GPUs declared: the simulated node's process lists do not hold the demo's processes,
    // and a run's energy is charged to the GPUs it uses or declares.
    p.run.gpus = crate::profile::GpuSelection::List((0..ranks).collect());
    if ranks > 1 {
        p.run.launcher = Launcher::Ranks(RanksSpec {
            nproc: ranks,
            master_addr: RanksSpec::DEFAULT_MASTER_ADDR.into(),
            master_port: None,
            grace_s: RanksSpec::DEFAULT_GRACE_S,
        });
    }
    p.run.restart.on_oom = OnOom::HalveBatch;
    p.run.restart.max_restarts = 5;
    p.run.restart.backoff_s = 1.0;
    p.knobs = Knobs {
        batch_size: Some(Knob {
            initial: 256,
            min: 8,
            max: Some(8192),
        }),
        prefetch: Some(Knob {
            initial: 2,
            min: 0,
            max: Some(16),
        }),
    };
    p
}

/// The console on run `id`'s Run view (`run` and `attach` on a terminal); after it, whether
/// the run goes on.
pub fn attach(g: &GlobalArgs, client: Client, id: &str) -> anyhow::Result<ExitCode> {
    let origin = client.origin().clone();
    tui::run(options(g, DataSource::Daemon(client), Some(id.to_string())))?;
    let name = format!("gpupilot-cli {}", env!("CARGO_PKG_VERSION"));
    let said = match origin.connect(&name).and_then(|c| c.run(id)) {
        Ok(info) if info.is_final() => format!(
            "gpupilot: run {id} has ended: {}",
            info.description.as_deref().unwrap_or(info.status.as_str())
        ),
        Ok(_) => {
            format!("gpupilot: detached; run {id} goes on (`gpupilot attach {id}` shows it again)")
        }
        Err(e) => format!("gpupilot: detached from run {id} ({e})"),
    };
    // Not `eprintln!`: after a dropped SSH session stderr is a terminal that has gone, and a
    // write that fails is no reason to panic.
    let _ = writeln!(std::io::stderr(), "{said}");
    Ok(ExitCode::SUCCESS)
}

fn options(g: &GlobalArgs, source: DataSource, open_run: Option<String>) -> TuiOptions {
    TuiOptions {
        source,
        theme: g.theme.clone(),
        refresh: Duration::from_secs_f64(g.refresh),
        open_run,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    fn global(gpus: &str) -> GlobalArgs {
        crate::cli::Cli::try_parse_from(["gpupilot", "demo", "--gpus", gpus])
            .unwrap()
            .global
    }

    #[test]
    fn the_demo_job_has_a_rank_per_gpu_and_one_hot_gpu() {
        let exe = std::path::Path::new("/usr/bin/gpupilot");
        let ranks = |gpus: &str| match demo_profile(exe, &global(gpus)).run.launcher {
            Launcher::Ranks(r) => r.nproc,
            Launcher::Local => 1,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            ["1", "2", "3", "4", "8"].map(ranks),
            [1, 2, 3, 4, 4],
            "one rank per GPU, at most four; one GPU is a single process"
        );
        assert_eq!(
            [1, 2, 3, 4, 8].map(demo_hot_gpu),
            [None, Some(1), Some(2), Some(2), Some(2)]
        );
        let p = demo_profile(exe, &global("4"));
        assert_eq!(p.name, "demo-train");
        // Its GPUs declared, so its energy is charged to them.
        assert_eq!(
            p.run.gpus,
            crate::profile::GpuSelection::List(vec![0, 1, 2, 3])
        );
        assert_eq!(
            demo_profile(exe, &global("1")).run.gpus,
            crate::profile::GpuSelection::List(vec![0])
        );
        let crate::profile::CommandSpec::Argv(argv) = &p.run.command else {
            panic!("{:?}", p.run.command)
        };
        assert_eq!(
            argv.as_slice(),
            ["/usr/bin/gpupilot", "synthetic-train"],
            "the defaults are left out; each rank's GPU is its LOCAL_RANK"
        );
        let g = crate::cli::Cli::try_parse_from([
            "gpupilot",
            "demo",
            "--model",
            "h200",
            "--workload",
            "bert-large",
            "--seed",
            "3",
        ])
        .unwrap()
        .global;
        let crate::profile::CommandSpec::Argv(argv) = demo_profile(exe, &g).run.command else {
            panic!()
        };
        assert_eq!(
            argv[1..],
            [
                "synthetic-train",
                "--train-model",
                "bert-large",
                "--gpu-model",
                "h200",
                "--seed",
                "3"
            ]
        );
        // The profile the daemon is given reads back as it was (the run's `run.toml`).
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.toml");
        std::fs::write(&path, p.to_toml()).unwrap();
        let back = crate::profile::check(&path).unwrap();
        assert_eq!(back.run.launcher, p.run.launcher);
        assert_eq!(back.knobs, p.knobs);
    }
}
