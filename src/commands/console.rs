//! The console's ways in: `gpupilot` (no command, or `top`) and `demo`, and the console side
//! of `run` and `attach`.
//!
//! Every console is a client of a daemon. The plain console's is started in the background
//! when none answers; quitting it detaches, and the daemon and its runs go on. The demo's is
//! its own, on a simulated node, in a home of its own that another terminal can reach (it says
//! how); quitting the demo stops its run and its daemon and leaves nothing running.

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

/// `gpupilot` (and `gpupilot top`): the console on the local daemon.
pub fn console(g: &GlobalArgs) -> anyhow::Result<ExitCode> {
    // Before a daemon is started for a console that cannot be drawn.
    tui::need_terminal()?;
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
/// of its own (`--source sim`) samples the node and supervises the run; quitting stops both.
/// Its home is a temporary directory, removed on the way out, unless `home` (`--home`, or
/// `GPUPILOT_HOME`) names one, which is kept; a home where a daemon runs is refused. How
/// another terminal reaches the demo's daemon is said before the console takes the screen,
/// and what became of it on the way out.
///
/// The run is a data-parallel job of one synthetic rank per GPU (up to [`DEMO_RANKS`]), and
/// the node has a cooling fault: about a minute in, one of the job's GPUs runs hot, reaches its
/// slowdown threshold and throttles, and its rank becomes the straggler the advisor names.
pub fn demo(g: &GlobalArgs, home: Option<&std::path::Path>) -> anyhow::Result<ExitCode> {
    // A bad --model or --workload fails here, plainly, before a daemon starts (which builds
    // and warms the node itself).
    sim_config(&g.sim.spec())?;
    let home = DemoHome::choose(home.filter(|h| !h.as_os_str().is_empty()))?;
    tui::need_terminal()?;
    let demo = Demo::start(g, home)?;
    super::err_line(&demo.reach_line());
    let result = tui::run(options(g, DataSource::Daemon(demo.client()?), None));
    let (home, kept, paths) = (
        demo.home.path().to_path_buf(),
        matches!(demo.home, DemoHome::Given(_)),
        demo.paths.clone(),
    );
    drop(demo);
    // After a dropped SSH session stderr has gone too: `err_line` does not mind.
    super::err_line(&farewell(&home, kept, &paths));
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

/// Where the demo's daemon lives.
enum DemoHome {
    /// A new temporary directory, removed with the demo.
    Temporary(tempfile::TempDir),
    /// One the user named; kept.
    Given(std::path::PathBuf),
}

impl DemoHome {
    /// `given`, unless a daemon already runs there; else a new temporary directory.
    fn choose(given: Option<&std::path::Path>) -> anyhow::Result<DemoHome> {
        let Some(dir) = given else {
            let tmp = tempfile::Builder::new()
                .prefix("gpupilot-demo-")
                .tempdir()
                .context("making the demo's directory")?;
            return Ok(DemoHome::Temporary(tmp));
        };
        let dir = std::path::absolute(dir)
            .with_context(|| format!("resolving the demo's home {}", dir.display()))?;
        let home = DemoHome::Given(dir);
        if let Some(pid) = crate::daemon::lock_holder(&home.paths()) {
            anyhow::bail!(
                "a gpupilot daemon (pid {pid}) already runs in {}: the demo runs a simulated \
                 node of its own and does not share a home with another daemon. Give the demo \
                 another --home DIR, or unset GPUPILOT_HOME for a temporary one (`gpupilot \
                 daemon stop` stops that daemon; its runs go on)",
                home.path().display()
            );
        }
        Ok(home)
    }

    fn path(&self) -> &std::path::Path {
        match self {
            DemoHome::Temporary(t) => t.path(),
            DemoHome::Given(p) => p,
        }
    }

    /// The paths `GPUPILOT_HOME` set to this home gives.
    fn paths(&self) -> Paths {
        let home = self.path().to_path_buf();
        Paths::resolve(|k| (k == "GPUPILOT_HOME").then(|| home.clone()))
    }
}

/// The demo's daemon and run, stopped (and a temporary home removed) when dropped, also on a
/// panic.
struct Demo {
    paths: Paths,
    run: Option<String>,
    /// Dropped after the daemon is stopped (fields drop after [`Drop::drop`]).
    home: DemoHome,
}

impl Demo {
    fn start(g: &GlobalArgs, home: DemoHome) -> anyhow::Result<Demo> {
        let exe = std::env::current_exe().context("finding the gpupilot binary")?;
        let mut demo = Demo {
            paths: home.paths(),
            home,
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

    /// How another terminal reaches the demo's daemon, said before the console takes the
    /// screen.
    fn reach_line(&self) -> String {
        let home = shell_word(&self.home.path().display().to_string());
        format!(
            "gpupilot demo: its daemon runs in {home} until the demo quits; from another \
             terminal: GPUPILOT_HOME={home} gpupilot ps"
        )
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
        // As `gpupilot daemon stop` does; it waits for the daemon's lock to go, which the
        // daemon releases after removing its socket, so the directory goes cleanly.
        let _ = crate::daemon::stop::stop(&self.paths, Duration::from_secs(3));
    }
}

/// What the demo left behind, said on the way out (after [`Demo`] has been dropped): its
/// daemon gone, and its home removed or kept.
fn farewell(home: &std::path::Path, kept: bool, paths: &Paths) -> String {
    if let Some(pid) = crate::daemon::lock_holder(paths) {
        return format!(
            "gpupilot demo: its daemon (pid {pid}) did not stop; `GPUPILOT_HOME={} gpupilot \
             daemon stop` stops it",
            shell_word(&home.display().to_string())
        );
    }
    match (kept, home.exists()) {
        (false, false) => format!(
            "gpupilot demo: stopped its run and its daemon, and removed {}",
            home.display()
        ),
        (false, true) => format!(
            "gpupilot demo: stopped its run and its daemon; {} could not be removed",
            home.display()
        ),
        (true, _) => format!(
            "gpupilot demo: stopped its run and its daemon; {} keeps the run's files \
             (GPUPILOT_HOME={} gpupilot report last)",
            home.display(),
            shell_word(&home.display().to_string())
        ),
    }
}

/// `text` as one word of a POSIX shell: as it is when it holds nothing a shell reads, else in
/// single quotes.
fn shell_word(text: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-+:,@%=".contains(c);
    if !text.is_empty() && text.chars().all(plain) {
        text.to_string()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
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
    fn the_demos_home_is_said_as_one_shell_word() {
        assert_eq!(
            shell_word("/tmp/gpupilot-demo-Ab1_x"),
            "/tmp/gpupilot-demo-Ab1_x"
        );
        assert_eq!(shell_word("/tmp/my demo"), "'/tmp/my demo'");
        assert_eq!(shell_word("/tmp/it's"), r"'/tmp/it'\''s'");
        assert_eq!(shell_word("/tmp/$HOME"), "'/tmp/$HOME'");
        assert_eq!(shell_word(""), "''");
    }

    #[test]
    fn a_home_where_a_daemon_runs_is_refused_for_the_demo() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().join("h");
        // Nothing runs there: that home, as it was named (made absolute).
        let chosen = DemoHome::choose(Some(&home)).unwrap();
        assert!(matches!(&chosen, DemoHome::Given(p) if p == &home));
        assert_eq!(chosen.paths().runtime, home.join("run"));
        // A lock held there, as a running daemon holds it.
        crate::daemon::prepare_private_dir(&chosen.paths().runtime).unwrap();
        let _held = crate::daemon::DaemonLock::acquire(&chosen.paths()).unwrap();
        let err = DemoHome::choose(Some(&home)).err().unwrap().to_string();
        assert!(
            err.contains(&format!("(pid {}) already runs in", std::process::id()))
                && err.contains("another --home DIR"),
            "{err}"
        );
        // None named: a new temporary home of its own.
        let DemoHome::Temporary(t) = DemoHome::choose(None).unwrap() else {
            panic!("not temporary")
        };
        assert!(t.path().is_dir());
        assert!(t.path().to_string_lossy().contains("gpupilot-demo-"));
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
