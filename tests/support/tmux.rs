//! A private tmux server for the end-to-end tests: a 200×50 pane running a shell with a known
//! prompt, keys in with send-keys, the screen out with capture-pane. Every wait is bounded;
//! the server is killed when the guard drops, whatever happens.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use super::wait::poll;

pub const PROMPT: &str = "E2E_PROMPT$";
pub const WAIT: Duration = Duration::from_secs(15);

/// A private tmux server; dropping it kills the server and everything in it.
pub struct Tmux {
    socket: String,
    /// The socket file, removed after the server is killed (tmux leaves it behind).
    socket_path: Option<String>,
}

impl Tmux {
    pub fn start(home: &Path) -> Tmux {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let mut tmux = Tmux {
            socket: format!("gpupilot-e2e-{}-{nanos}", std::process::id()),
            socket_path: None,
        };
        let shell = format!(
            "env PS1='{PROMPT} ' GPUPILOT_HOME='{}' TERM=xterm-256color LANG=C.UTF-8 bash --norc --noprofile",
            home.display()
        );
        let out = tmux.run(&[
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-x",
            "200",
            "-y",
            "50",
            "-s",
            "e2e",
            &shell,
        ]);
        assert!(
            out.status.success(),
            "tmux new-session: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        tmux.socket_path = Some(tmux.flag("socket_path")).filter(|p| !p.is_empty());
        tmux
    }

    pub fn run(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("tmux is required for this test: apt-get install tmux")
    }

    /// Type keys (tmux key names: "Tab", "Escape", "Enter", or literal text).
    pub fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "e2e"];
        args.extend_from_slice(keys);
        let out = self.run(&args);
        assert!(
            out.status.success(),
            "send-keys {keys:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn resize(&self, w: u16, h: u16) {
        let (w, h) = (w.to_string(), h.to_string());
        let out = self.run(&["resize-window", "-t", "e2e", "-x", &w, "-y", &h]);
        assert!(
            out.status.success(),
            "resize-window: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn screen(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-t", "e2e"]).stdout).into_owned()
    }

    pub fn flag(&self, name: &str) -> String {
        let out = self.run(&[
            "display-message",
            "-p",
            "-t",
            "e2e",
            &format!("#{{{name}}}"),
        ]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Poll the screen every 100 ms until `ok` holds, at most [`WAIT`]; panic with the screen
    /// otherwise.
    pub fn wait_screen(&self, what: &str, ok: impl Fn(&str) -> bool) -> String {
        poll(what, WAIT, Duration::from_millis(100), || {
            let s = self.screen();
            if ok(&s) {
                Ok(s)
            } else {
                Err(format!("; the screen:\n{s}"))
            }
        })
    }

    pub fn wait_text(&self, text: &str) -> String {
        self.wait_screen(&format!("{text:?}"), |s| s.contains(text))
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
        if let Some(path) = &self.socket_path {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl Tmux {
    /// Type a command line into the shell and press Enter.
    pub fn type_line(&self, line: &str) {
        self.keys(&["-l", line]);
        self.keys(&["Enter"]);
    }

    /// Wait until the shell's prompt is the last line on screen (a command has ended).
    pub fn wait_prompt(&self) -> String {
        self.wait_screen("the shell prompt", |s| {
            s.lines()
                .rfind(|l| !l.trim().is_empty())
                .is_some_and(|l| l.trim_end() == PROMPT)
        })
    }
}
