//! The client side of the system daemon (`gpupilot --system …`, or `GPUPILOT_SYSTEM=1`):
//! connecting to it (never starting it: that is root's to do), and pointing a user whose own
//! daemon may not change GPU settings at a system daemon that answers.

use std::os::unix::net::UnixStream;

use super::{Client, ClientError};
use crate::config::Paths;
use crate::protocol::ErrorCode;

/// Connect to the system daemon at `paths`; when none answers, say how one is started.
pub fn connect(paths: &Paths) -> anyhow::Result<Client> {
    Client::connect(paths).map_err(|e| match e {
        ClientError::NoDaemon { socket, source } => anyhow::anyhow!(
            "no system gpupilot daemon answers at {} ({source}): root starts one with `sudo \
             gpupilot daemon --system --detach` (docs/operations.md, \"A root daemon for power \
             control\"); or leave out --system (and GPUPILOT_SYSTEM) to use your own daemon",
            socket.display()
        ),
        e => e.into(),
    })
}

/// Whether a system daemon answers on its socket (a connection is accepted).
pub fn system_daemon_answers() -> bool {
    UnixStream::connect(super::socket_path(&Paths::system_from_env())).is_ok()
}

/// A change the user's own daemon refused with `no_permission` (it is not root): when a system
/// daemon answers, the way out is `--system`, so say that instead of how to start one.
/// `args`: this command's arguments, for the line to copy.
pub fn suggest_system(e: ClientError, args: &[String]) -> anyhow::Error {
    let ClientError::Daemon {
        code: ErrorCode::NoPermission,
        message,
    } = &e
    else {
        return e.into();
    };
    if crate::config::paths::system_daemon_selected() || !system_daemon_answers() {
        return e.into();
    }
    anyhow::anyhow!("{}", system_hint(message, args))
}

/// The daemon's message without its advice on starting a root daemon, then the advice that fits.
fn system_hint(message: &str, args: &[String]) -> String {
    let what = message
        .split_once(": start a root daemon")
        .map_or(message, |(what, _)| what);
    format!(
        "{what}, and your own daemon is not root; a system daemon is running: add --system \
         (`gpupilot --system {}`), or set GPUPILOT_SYSTEM=1",
        args.join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hint_keeps_what_failed_and_names_the_flag() {
        let message = crate::control::power::needs_root("setting the power limit", 1).to_string();
        let args = ["power", "cap", "250", "--gpu", "1"].map(String::from);
        let hint = system_hint(&message, &args);
        assert_eq!(
            hint,
            "setting the power limit on GPU 1 needs root (NVML answered NO_PERMISSION), and your \
             own daemon is not root; a system daemon is running: add --system (`gpupilot \
             --system power cap 250 --gpu 1`), or set GPUPILOT_SYSTEM=1"
        );
        // A message of another shape is kept whole.
        assert!(system_hint("no", &args).starts_with("no, and your own daemon"));
    }

    #[test]
    fn other_errors_pass_through() {
        let e = ClientError::Daemon {
            code: ErrorCode::BadRequest,
            message: "150 W is outside GPU 1's range".into(),
        };
        assert_eq!(
            suggest_system(e, &[]).to_string(),
            "150 W is outside GPU 1's range"
        );
    }
}
