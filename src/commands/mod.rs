//! The commands of the command line. Each takes its parsed arguments and returns the exit
//! code; `main.rs` only dispatches here. One module per command or family of commands:
//!
//! - [`advise`]: `gpupilot advise`, the advisor's hints on recent telemetry and the live runs,
//!   each with its evidence and the command that acts on it.
//! - [`bench`]: `gpupilot bench gemm | memory | power-sweep | burn`, real load on the GPUs
//!   through CUDA (`power-sweep` and `burn` also gpusim's, with `--source sim`); a load that
//!   cannot run is one line and exit status 2.
//! - [`bridge`]: `gpupilot bridge`, this node's daemon on stdin and stdout for `ssh NODE
//!   gpupilot bridge` (what `attach --host NODE` runs).
//! - [`cluster`]: `gpupilot cluster`, the cluster view through Prometheus.
//! - [`completions`]: `gpupilot completions SHELL` (bash, zsh, fish) and the hidden
//!   `complete-values KIND` they call.
//! - [`console`]: the console's ways in: `gpupilot` (or `top`), `demo`, and the console side
//!   of `run` and `attach`.
//! - [`daemon`]: `gpupilot daemon` (a user's, or `--system`, root's for the node) and `daemon
//!   stop`.
//! - [`doctor`]: `gpupilot doctor`, is this node fit to train: driver, CUDA, PyTorch, GPUs'
//!   health and gpupilot's own directories and daemon.
//! - [`events`]: `gpupilot events`, the node's event log, in words or JSON lines, `--follow`.
//! - [`export`]: `gpupilot export`, the GPU history or a run's trainer metrics as CSV, JSON
//!   lines or Parquet.
//! - `follow`: following a run's logs through the daemon, what `run`, `attach` and `logs -f`
//!   (and `logs --rank`) share.
//! - [`knobs`]: `gpupilot set RUN batch-size N | prefetch N`, a knob change on a live run.
//! - [`man`]: `gpupilot man [DIR]`, manual pages from the command line's definitions.
//! - [`power`]: `gpupilot power`, `power cap | reset | gpu-max`, and `clocks lock | reset`.
//! - [`profile`]: `gpupilot profile check FILE`, a profile loaded as `run` loads it.
//! - [`ranks`]: `gpupilot ranks` (hidden), the process of a `launcher = "ranks"` run.
//! - [`record`]: `gpupilot record` and `gpupilot replay FILE`.
//! - [`report`]: `gpupilot report RUN`, a run's report (text, Markdown, HTML or JSON).
//! - `run_gpu`: `run --gpu SPEC` (indices, UUIDs or one MIG instance) as the run's
//!   `CUDA_VISIBLE_DEVICES`.
//! - [`runs`]: `run`, `attach`, `ps`, `logs` and `stop`.
//! - [`thermal`]: `gpupilot thermal`, `thermal target | off`, and `gpupilot budget`.
//! - [`tune`]: `gpupilot tune energy RUN`, `tune status` and `tune stop`: the energy tuner's
//!   search, a job of the daemon, started and watched.
//!
//! They are clients of the daemon ([`crate::client`]); `demo` of one of its own. The console,
//! `run`, `attach` and the commands that change the GPUs start a daemon in the background when
//! none answers, and say so ([`started_notice`]); `ps`, `logs` and `stop` do not (there is
//! nothing to list, follow or stop without one) and say how to start one.

pub mod advise;
pub mod bench;
pub mod bridge;
pub mod cluster;
pub mod completions;
pub mod console;
pub mod daemon;
pub mod doctor;
pub mod events;
pub mod export;
mod follow;
pub mod knobs;
pub mod man;
pub mod power;
pub mod profile;
pub mod ranks;
pub mod record;
pub mod report;
mod run_gpu;
pub mod runs;
pub mod thermal;
pub mod tune;

use std::ffi::OsString;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context as _;

use crate::cli::{GlobalArgs, SourceKind};
use crate::client::Client;
use crate::config::Paths;

/// The daemon options that carry the global ones over to a daemon started in the background:
/// the telemetry source and the simulated node.
pub fn daemon_args(g: &GlobalArgs) -> Vec<OsString> {
    let source = match g.source {
        SourceKind::Auto => "auto",
        SourceKind::Nvml => "nvml",
        SourceKind::Sim => "sim",
    };
    let mut args: Vec<OsString> = vec!["--source".into(), source.into()];
    if let Some(lib) = &g.nvml_lib {
        // The daemon works from `/`.
        let lib = std::path::absolute(lib).unwrap_or_else(|_| lib.clone());
        args.extend(["--nvml-lib".into(), lib.into_os_string()]);
    }
    let sim = &g.sim;
    for (flag, value) in [
        ("--gpus", sim.gpus.to_string()),
        ("--model", sim.model.clone()),
        ("--workload", sim.workload.clone()),
        ("--seed", sim.seed.to_string()),
    ] {
        args.extend([flag.into(), value.into()]);
    }
    args
}

/// Connect to the daemon, starting one in the background when none answers (and saying so).
pub fn connect_or_spawn(g: &GlobalArgs, paths: &Paths) -> anyhow::Result<Client> {
    if crate::config::paths::system_daemon_selected() {
        // The system daemon is root's to start.
        return crate::client::system::connect(paths);
    }
    let exe = std::env::current_exe().context("finding the gpupilot binary to start a daemon")?;
    let (client, spawned) = Client::connect_or_spawn(paths, &exe, &daemon_args(g))?;
    if let Some(pid) = spawned {
        err_line(&started_notice(g.source, pid, paths));
    }
    Ok(client)
}

/// The one line a command says when it has started a daemon in the background (never when it
/// found one running): which, where, and how to stop it.
pub fn started_notice(source: SourceKind, pid: u32, paths: &Paths) -> String {
    format!(
        "gpupilot: started a gpupilot daemon ({} source, pid {pid}) in {}; stop it with \
         `gpupilot daemon stop` (its log: {})",
        source.as_str(),
        crate::daemon::home_description(paths),
        crate::ipc::log_path(paths).display()
    )
}

/// Connect to a running daemon; no daemon is an error that says how to start one.
pub fn connect(paths: &Paths) -> anyhow::Result<Client> {
    if crate::config::paths::system_daemon_selected() {
        return crate::client::system::connect(paths);
    }
    Ok(Client::connect(paths)?)
}

/// The running daemon's newest snapshot, if a daemon answers within 2 s (none is started):
/// what `status` and `doctor` take its XIDs from, heard since it started, which no one-shot
/// read of NVML can hear.
pub fn daemon_snapshot() -> Option<crate::telemetry::Snapshot> {
    let client = connect(&Paths::from_env()).ok()?;
    client
        .with_timeout(std::time::Duration::from_secs(2))
        .status()
        .ok()?
        .snapshot
}

/// Write to stdout; a closed pipe (`gpupilot logs RUN | head`) is an [`OutputClosed`] error
/// (of kind `BrokenPipe`), which `main` ends on quietly.
pub(crate) fn out(text: &str) -> std::io::Result<()> {
    let mut o = std::io::stdout().lock();
    o.write_all(text.as_bytes())
        .and_then(|()| o.flush())
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::BrokenPipe => {
                std::io::Error::new(std::io::ErrorKind::BrokenPipe, OutputClosed)
            }
            _ => e,
        })
}

/// The reader of our stdout went away: not a failure of the command, and no one is left to
/// tell. Unlike any EPIPE, which may as well come from the daemon's socket.
#[derive(Debug, thiserror::Error)]
#[error("the reader of the output went away")]
pub struct OutputClosed;

/// Whether `e` is [`out`]'s closed stdout.
pub fn is_output_closed(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.is::<OutputClosed>()
            || c.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .is_some_and(|inner| inner.is::<OutputClosed>())
    })
}

/// Write a line to stderr; a closed pipe (`gpupilot profile check X 2>&1 | head`) is not an
/// error, nor a panic as with `eprintln!`.
pub(crate) fn err_line(text: &str) {
    let mut e = std::io::stderr().lock();
    let _ = writeln!(e, "{text}");
}

/// A reader that went away (`gpupilot status | head`) ends a command quietly, with status 0,
/// instead of the panic (status 101) that `println!` raises on EPIPE.
///
/// SIGPIPE stays ignored, as Rust sets it before `main`: restoring its default would make a
/// client die silently when the daemon closes its socket (Unix sockets raise SIGPIPE on write,
/// std does not pass MSG_NOSIGNAL for them), and the daemon must never die of a client. So
/// the writes of the commands go through [`out`] and [`err_line`], which return or swallow
/// EPIPE, and this hook catches the `println!`s left anywhere else. Not for the daemon, whose
/// output goes to its log.
pub fn end_quietly_on_closed_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let what = info.to_string();
        let epipe = format!("(os error {})", rustix::io::Errno::PIPE.raw_os_error());
        if what.contains("failed printing to std") && what.contains(&epipe) {
            std::process::exit(0);
        }
        default(info)
    }));
}

pub(crate) fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// A flag that turns true on Ctrl-C (SIGINT), which then no longer ends the process: followers
/// check it, say they detached, and return. Ready when this returns.
pub(crate) fn ctrl_c_flag() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let set = Arc::clone(&flag);
    let spawned = std::thread::Builder::new()
        .name("ctrl-c".into())
        .spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .build()
            else {
                let _ = ready_tx.send(());
                return;
            };
            rt.block_on(async move {
                use tokio::signal::unix::{SignalKind, signal};
                let Ok(mut sigint) = signal(SignalKind::interrupt()) else {
                    let _ = ready_tx.send(());
                    return;
                };
                let _ = ready_tx.send(());
                while sigint.recv().await.is_some() {
                    set.store(true, Ordering::SeqCst);
                }
            });
        });
    if spawned.is_ok() {
        let _ = ready_rx.recv();
    }
    flag
}

pub use crate::units::format_duration;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn daemon_args_carry_the_source_and_the_simulated_node() {
        use clap::Parser;
        let cli = crate::cli::Cli::try_parse_from([
            "gpupilot", "--source", "sim", "--gpus", "2", "--seed", "7", "ps",
        ])
        .unwrap();
        let args: Vec<String> = daemon_args(&cli.global)
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        assert_eq!(
            args,
            [
                "--source",
                "sim",
                "--gpus",
                "2",
                "--model",
                "h100-sxm",
                "--workload",
                "resnet50",
                "--seed",
                "7"
            ]
        );
    }
}
