//! `gpupilot daemon [--detach] [--readonly] [--rate HZ]`, and `gpupilot daemon --system
//! [--allow-group NAME]`, the system daemon (root's, one per node, its socket open to every
//! local user; see `daemon::auth` for who may do what); `gpupilot daemon stop`.

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use crate::cli::{DaemonArgs, DaemonCommand, GlobalArgs, SourceKind};
use crate::config::Paths;
use crate::control::power::open_node;
use crate::daemon::{self, DaemonOptions, detach, logging};

/// Run the daemon in the foreground, or (`--detach`) start it in the background and print its
/// pid once it answers.
pub fn daemon(g: &GlobalArgs, args: &DaemonArgs) -> anyhow::Result<ExitCode> {
    if let Some(DaemonCommand::Stop { wait }) = &args.action {
        if let Some(flag) = daemon_only_flag(args) {
            anyhow::bail!(
                "{flag} is an option of the daemon, not of `daemon stop`: leave it out \
                 (`gpupilot daemon stop [--wait SECONDS]`)"
            );
        }
        return stop(g.system, Duration::from_secs_f64(*wait));
    }
    let system_group = system_group(g.system, args.allow_group.as_deref(), is_root())?;
    let paths = match system_group {
        Some(_) => Paths::system_from_env(),
        None => Paths::from_env(),
    };
    if system_group.is_some() {
        // First, so that directories it makes on the way are 0755 (reachable), not 0700.
        daemon::prepare_shared_dir(&paths.runtime)?;
    }
    if args.detach {
        let exe = std::env::current_exe()?;
        let mut forward: Vec<OsString> = super::daemon_args(g);
        if let Some(group) = &system_group {
            forward.extend(["--system".into(), "--allow-group".into(), group.into()]);
        }
        if args.readonly {
            forward.push("--readonly".into());
        }
        if args.restore_on_exit {
            forward.push("--restore-on-exit".into());
        }
        forward.extend(["--rate".into(), args.rate.to_string().into()]);
        if let Some(addr) = &args.metrics_addr {
            forward.extend(["--metrics-addr".into(), addr.into()]);
        }
        let pid = detach::spawn(&paths, &exe, &forward, detach::ANSWER_WITHIN)?;
        println!("{pid}");
        eprintln!(
            "gpupilot: daemon running in the background (pid {pid}); socket {}, log {}; \
             `gpupilot{} daemon stop` stops it",
            crate::ipc::socket_path(&paths).display(),
            crate::ipc::log_path(&paths).display(),
            if system_group.is_some() {
                " --system"
            } else {
                ""
            }
        );
        return Ok(ExitCode::SUCCESS);
    }
    if args.new_session {
        // Started by --detach without a process group of its own: setsid(2) cannot fail here,
        // and if it did the daemon would still work (a hangup is ignored anyway).
        let _ = rustix::process::setsid();
    }
    daemon::prepare_private_dir(&paths.state)?;
    let (metrics_addr, metrics_hostname_label) =
        exporter_settings(args.metrics_addr.as_deref(), &paths)?;
    logging::init(&crate::ipc::log_path(&paths), !args.new_session);
    // The simulator's energy counters go on across restarts, as NVML's do.
    let sim = crate::telemetry::open::SimSpec {
        counters: Some(paths.state.join(crate::telemetry::sim_energy::FILE)),
        ..g.sim.spec()
    };
    let node = match open_node(g.source, g.nvml_lib.as_deref(), &sim) {
        Ok(n) => Ok(n),
        // `auto` on a machine without NVML: supervise runs all the same, without telemetry.
        Err(e) if g.source == SourceKind::Auto => {
            tracing::warn!("no GPU telemetry: {e}");
            Err(e.to_string())
        }
        Err(e) => return Err(e.into()),
    };
    let (source, control) = match node {
        Ok(n) => (Ok(n.source), Some(n.control)),
        Err(e) => (Err(e), None),
    };
    daemon::run(DaemonOptions {
        paths,
        source,
        control,
        restore_on_exit: args.restore_on_exit,
        rate_hz: args.rate,
        readonly: args.readonly,
        system_group,
        metrics_addr,
        metrics_hostname_label,
    })?;
    Ok(ExitCode::SUCCESS)
}

/// `daemon stop`: stop this home's daemon (the system daemon with `--system`), and say what
/// became of it and of its runs.
fn stop(system: bool, wait: Duration) -> anyhow::Result<ExitCode> {
    let paths = match system {
        true => Paths::system_from_env(),
        false => Paths::from_env(),
    };
    // Counted before it goes, to say what goes on without it; a daemon that does not answer
    // is stopped all the same.
    let live = crate::client::Client::connect(&paths)
        .ok()
        .map(|c| c.with_timeout(Duration::from_secs(2)))
        .and_then(|c| c.runs().ok())
        .map(|runs| runs.iter().filter(|r| !r.is_final()).count());
    match daemon::stop::stop(&paths, wait) {
        Ok(stopped) => {
            super::err_line(&format!(
                "gpupilot: stopped the gpupilot daemon (pid {}) of {} in {:.1} s; {}",
                stopped.pid,
                stopped.home,
                stopped.took.as_secs_f64(),
                runs_left(live)
            ));
            Ok(ExitCode::SUCCESS)
        }
        Err(e @ daemon::stop::StopError::NotRunning { .. }) => {
            super::err_line(&format!("gpupilot: {e}"));
            Ok(ExitCode::FAILURE)
        }
        Err(e) => Err(e.into()),
    }
}

/// The first option given that only a daemon being started takes (which `daemon stop` would
/// otherwise ignore without a word).
fn daemon_only_flag(args: &DaemonArgs) -> Option<&'static str> {
    [
        (args.detach, "--detach"),
        (args.readonly, "--readonly"),
        (args.restore_on_exit, "--restore-on-exit"),
        (args.allow_group.is_some(), "--allow-group"),
        (args.metrics_addr.is_some(), "--metrics-addr"),
        (args.rate != 1.0, "--rate"),
    ]
    .into_iter()
    .find_map(|(given, flag)| given.then_some(flag))
}

/// What `daemon stop` says of the runs the daemon supervised.
fn runs_left(live: Option<usize>) -> String {
    match live {
        Some(0) => "it supervised no live run".into(),
        Some(1) => "its live run goes on, and the next daemon adopts it".into(),
        Some(n) => format!("its {n} live runs go on, and the next daemon adopts them"),
        None => "any runs it supervised go on, and the next daemon adopts them".into(),
    }
}

/// Where to serve `/metrics` (the option, else `$CONFIG/prometheus.toml`, else the default)
/// and how to spell the node's label there (the file, else `Hostname`).
fn exporter_settings(
    flag: Option<&str>,
    paths: &Paths,
) -> anyhow::Result<(Option<std::net::SocketAddr>, crate::exporter::HostnameLabel)> {
    let file = crate::config::prometheus::load(&paths.config)?.exporter;
    let addr = flag
        .map(str::to_string)
        .or(file.listen)
        .unwrap_or_else(|| daemon::DEFAULT_METRICS_ADDR.to_string());
    let addr = daemon::parse_metrics_addr(&addr).map_err(anyhow::Error::msg)?;
    Ok((addr, file.hostname_label.unwrap_or_default()))
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Whether to be the system daemon, and for which group: `--system` needs root, and
/// `--allow-group` needs `--system`.
fn system_group(
    system: bool,
    allow_group: Option<&str>,
    root: bool,
) -> anyhow::Result<Option<String>> {
    match (system, allow_group) {
        (false, None) => Ok(None),
        (false, Some(_)) => anyhow::bail!(
            "--allow-group names who may change GPU settings on the system daemon: add --system \
             (`sudo gpupilot daemon --system --allow-group NAME`)"
        ),
        (true, _) if !root => anyhow::bail!(
            "`gpupilot daemon --system` runs as root: it changes GPU settings for the users of \
             this node. Start it with `sudo gpupilot daemon --system --detach` (or as a systemd \
             service: docs/operations.md, \"A root daemon for power control\"); for a daemon of \
             your own, leave out --system (and GPUPILOT_SYSTEM)"
        ),
        (true, group) => Ok(Some(
            group
                .filter(|g| !g.is_empty())
                .unwrap_or(daemon::DEFAULT_GROUP)
                .to_string(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn daemon_stop_refuses_the_options_of_a_daemon_being_started() {
        use clap::Parser as _;
        let args = |argv: &[&str]| {
            let cli = crate::cli::Cli::try_parse_from(argv).unwrap();
            let Some(crate::cli::Command::Daemon(d)) = cli.command else {
                panic!("not daemon")
            };
            d
        };
        assert_eq!(
            daemon_only_flag(&args(&["gpupilot", "daemon", "stop", "--wait", "2"])),
            None
        );
        assert_eq!(
            daemon_only_flag(&args(&["gpupilot", "--system", "daemon", "stop"])),
            None
        );
        for (flag, argv) in [
            ("--detach", &["gpupilot", "daemon", "--detach", "stop"][..]),
            ("--readonly", &["gpupilot", "daemon", "--readonly", "stop"]),
            ("--rate", &["gpupilot", "daemon", "--rate", "5", "stop"]),
            (
                "--metrics-addr",
                &["gpupilot", "daemon", "--metrics-addr", "off", "stop"],
            ),
        ] {
            assert_eq!(daemon_only_flag(&args(argv)), Some(flag), "{argv:?}");
        }
    }

    #[test]
    fn system_needs_root_and_allow_group_needs_system() {
        assert_eq!(system_group(false, None, false).unwrap(), None);
        assert_eq!(system_group(false, None, true).unwrap(), None);
        let err = system_group(true, None, false).unwrap_err().to_string();
        assert!(
            err.contains("runs as root") && err.contains("sudo gpupilot daemon --system"),
            "{err}"
        );
        let err = system_group(false, Some("ops"), true)
            .unwrap_err()
            .to_string();
        assert!(err.contains("add --system"), "{err}");
        assert_eq!(
            system_group(true, None, true).unwrap().as_deref(),
            Some("gpupilot")
        );
        assert_eq!(
            system_group(true, Some("ops"), true).unwrap().as_deref(),
            Some("ops")
        );
    }
}
