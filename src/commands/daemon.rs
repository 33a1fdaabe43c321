//! `gpupilot daemon [--detach] [--readonly] [--rate HZ]`.

use std::ffi::OsString;
use std::process::ExitCode;

use crate::cli::{DaemonArgs, GlobalArgs, SourceKind};
use crate::config::Paths;
use crate::daemon::{self, DaemonOptions, detach, logging};
use crate::telemetry::open::open_source;

/// Run the daemon in the foreground, or (`--detach`) start it in the background and print its
/// pid once it answers.
pub fn daemon(g: &GlobalArgs, args: &DaemonArgs) -> anyhow::Result<ExitCode> {
    let paths = Paths::from_env();
    if args.detach {
        let exe = std::env::current_exe()?;
        let mut forward: Vec<OsString> = super::daemon_args(g);
        if args.readonly {
            forward.push("--readonly".into());
        }
        forward.extend(["--rate".into(), args.rate.to_string().into()]);
        let pid = detach::spawn(&paths, &exe, &forward, detach::ANSWER_WITHIN)?;
        println!("{pid}");
        eprintln!(
            "gpupilot: daemon running in the background (pid {pid}); socket {}, log {}",
            daemon::socket_path(&paths).display(),
            daemon::log_path(&paths).display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    if args.new_session {
        // Started by --detach without a process group of its own: setsid(2) cannot fail here,
        // and if it did the daemon would still work (a hangup is ignored anyway).
        let _ = rustix::process::setsid();
    }
    daemon::prepare_private_dir(&paths.state)?;
    logging::init(&daemon::log_path(&paths), !args.new_session);
    let source = match open_source(g.source, g.nvml_lib.as_deref(), &g.sim) {
        Ok(s) => Ok(s),
        // `auto` on a machine without NVML: supervise runs all the same, without telemetry.
        Err(e) if g.source == SourceKind::Auto => {
            tracing::warn!("no GPU telemetry: {e}");
            Err(e.to_string())
        }
        Err(e) => return Err(e.into()),
    };
    daemon::run(DaemonOptions {
        paths,
        source,
        rate_hz: args.rate,
        readonly: args.readonly,
    })?;
    Ok(ExitCode::SUCCESS)
}
