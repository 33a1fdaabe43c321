//! `gpupilot record` and `gpupilot replay FILE`: the recorder ([`crate::client::record`]) into
//! a new file, and the console on a recording ([`crate::tui::feed::replay`]).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::Context as _;

use crate::cli::{GlobalArgs, RecordArgs, ReplayArgs};
use crate::client::record::{RecordError, Stopped, record as run_recorder};
use crate::config::Paths;
use crate::config::safe_fs::{DirKind, own_dir};
use crate::control::tuner::session::stop_flag;
use crate::recording::EXTENSION;
use crate::tui::{self, DataSource, TuiOptions};

/// `gpupilot record [--out FILE] [--for DURATION]`.
pub fn record(args: &RecordArgs) -> anyhow::Result<ExitCode> {
    let paths = Paths::from_env();
    let client = super::connect(&paths)?;
    let path = match &args.out {
        Some(p) => p.clone(),
        None => default_path(&paths)?,
    };
    let file = create(&path)?;
    // Ctrl-C, SIGTERM and SIGHUP end the recording with its end mark.
    let stop = stop_flag();
    let shown = path.display().to_string();
    let result = run_recorder(&client, file, args.duration, &stop, |h| {
        let until = match args.duration {
            Some(d) => format!("for {}", super::format_duration(d.as_secs_f64())),
            None => "until Ctrl-C".into(),
        };
        eprintln!("gpupilot: recording node {} to {shown} {until}", h.node);
    });
    let size = std::fs::metadata(&path).map_or(0, |m| m.len());
    match result {
        Ok((rec, _)) => {
            let span = super::format_duration((rec.to_s - rec.from_s).max(0.0));
            let what = format!(
                "{span} of node {} ({} records, {}) in {shown}",
                client.welcome().node,
                rec.records,
                kib(size)
            );
            match rec.stopped {
                Stopped::Duration | Stopped::Signal => {
                    eprintln!("gpupilot: recorded {what}; `gpupilot replay {shown}` plays it");
                    Ok(ExitCode::SUCCESS)
                }
                Stopped::DaemonGone(why) => {
                    eprintln!(
                        "gpupilot: the daemon went away ({why}): recorded {what}; `gpupilot replay {shown}` plays it"
                    );
                    Ok(ExitCode::FAILURE)
                }
            }
        }
        Err(RecordError::Write(e)) => Err(anyhow::anyhow!(
            "recording stopped: writing {shown} failed: {e}. What was written up to the last \
             flush ({}) plays with `gpupilot replay {shown}`; the daemon goes on",
            kib(size)
        )),
        Err(e) => Err(e.into()),
    }
}

/// `gpupilot replay FILE [--speed N]`.
pub fn replay(g: &GlobalArgs, args: &ReplayArgs) -> anyhow::Result<ExitCode> {
    // What is wrong with the file is said before the console takes the terminal.
    let replay = tui::feed::replay::Replay::open(&args.file, args.speed)?;
    tui::run(TuiOptions {
        source: DataSource::Replay(Box::new(replay)),
        theme: g.theme.clone(),
        refresh: Duration::from_secs_f64(g.refresh),
        open_run: None,
    })?;
    Ok(ExitCode::SUCCESS)
}

/// `$STATE/recordings/YYYYMMDD-HHMMSS.gprec` (the directory made 0700 if need be).
fn default_path(paths: &Paths) -> anyhow::Result<PathBuf> {
    let dir = paths.state.join("recordings");
    own_dir(&dir, DirKind::Private).with_context(|| format!("making {}", dir.display()))?;
    let stamp = crate::time::compact(SystemTime::now());
    Ok(dir.join(format!("{stamp}.{EXTENSION}")))
}

/// A new file at `path`, 0600, never through a link and never over an existing file.
fn create(path: &Path) -> anyhow::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => anyhow::anyhow!(
                "{} exists: a recording never replaces a file; name another with --out",
                path.display()
            ),
            _ => anyhow::Error::new(e).context(format!("creating {}", path.display())),
        })
}

fn kib(bytes: u64) -> String {
    if bytes >= 10 << 20 {
        format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
    } else {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    }
}
