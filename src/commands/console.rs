//! The console's ways in: `gpupilot` (no command) and `demo`, and the console side of `run`
//! and `attach`.
//!
//! Every console but the demo's is a client of the daemon (started in the background when none
//! answers); quitting it detaches, and the daemon and its runs go on. The demo samples a
//! simulated node in-process and leaves nothing running when it quits.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;

use super::{connect_or_spawn, daemon_args};
use crate::cli::{GlobalArgs, SourceKind};
use crate::client::Client;
use crate::config::Paths;
use crate::profile::{Knob, Knobs, OnOom, Profile};
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
pub fn demo(g: &GlobalArgs) -> anyhow::Result<ExitCode> {
    // A bad --model or --workload fails here, plainly, before a daemon starts (which builds
    // and warms the node itself).
    sim_config(&g.sim)?;
    let demo = Demo::start(g)?;
    let result = tui::run(options(g, DataSource::Daemon(demo.client()?), None));
    drop(demo);
    result?;
    Ok(ExitCode::SUCCESS)
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
        let out = std::process::Command::new(&exe)
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
            let socket = crate::daemon::socket_path(&self.paths);
            let deadline = std::time::Instant::now() + Duration::from_secs(3);
            while socket.exists() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// The demo's run: the synthetic trainer on GPU 0 of the simulated node, with both knobs and
/// the out-of-memory policy, so every control of the Run view has something to act on.
fn demo_profile(exe: &std::path::Path, g: &GlobalArgs) -> Profile {
    let mut p = Profile::from_command(vec![
        exe.display().to_string(),
        "synthetic-train".into(),
        "--train-model".into(),
        if g.sim.workload == "idle" {
            "resnet50".into()
        } else {
            g.sim.workload.clone()
        },
        "--gpu-model".into(),
        g.sim.model.clone(),
        "--seed".into(),
        g.sim.seed.to_string(),
    ]);
    p.name = "demo-train".into();
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
    match origin.connect(&name).and_then(|c| c.run(id)) {
        Ok(info) if info.is_final() => eprintln!(
            "gpupilot: run {id} has ended: {}",
            info.description.as_deref().unwrap_or(info.status.as_str())
        ),
        Ok(_) => eprintln!(
            "gpupilot: detached; run {id} goes on (`gpupilot attach {id}` shows it again)"
        ),
        Err(e) => eprintln!("gpupilot: detached from run {id} ({e})"),
    }
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
