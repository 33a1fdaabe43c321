//! A daemon in a temporary GPUPILOT_HOME on a fake NVML node (the tests of power caps and of
//! runs' caps): the node's setter log, the daemon's records, and `gpupilot` commands on both.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use super::home::{DaemonProc, Home};
use super::nvml::FakeNode;
use serde_json::Value;

pub struct NvmlDaemon {
    pub home: Home,
    pub node: FakeNode,
    /// The daemon (a child of the test); take it to stop it.
    pub daemon: Option<DaemonProc>,
    /// Its sampling rate, Hz (`--rate`).
    rate: &'static str,
}

impl NvmlDaemon {
    /// A daemon on a node made from `scenario` (fake-nvml TOML), with `daemon_args`.
    pub fn new(scenario: &str, daemon_args: &[&str]) -> NvmlDaemon {
        NvmlDaemon::at_rate(scenario, "10", daemon_args)
    }

    /// As [`NvmlDaemon::new`], the daemon sampling at `rate` Hz (the tests' 10, or a user's
    /// default 1).
    pub fn at_rate(scenario: &str, rate: &'static str, daemon_args: &[&str]) -> NvmlDaemon {
        let mut s = NvmlDaemon {
            rate,
            ..NvmlDaemon::unstarted(scenario)
        };
        s.restart(daemon_args);
        s
    }

    /// A home on a node made from `scenario`, no daemon yet (`restart` starts one at 10 Hz).
    pub fn unstarted(scenario: &str) -> NvmlDaemon {
        NvmlDaemon {
            home: Home::new(),
            node: FakeNode::new(scenario),
            daemon: None,
            rate: "10",
        }
    }

    /// Start a daemon with `daemon_args` in this home on this node (the last one has gone: a
    /// test that killed it starts the next one here) and wait until it answers.
    pub fn restart(&mut self, daemon_args: &[&str]) {
        let mut args = vec!["daemon", "--rate", self.rate];
        args.extend_from_slice(daemon_args);
        let child = self
            .cmd(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.daemon = Some(DaemonProc::answering(child, &self.home.paths, "the daemon"));
    }

    /// `gpupilot --source nvml --nvml-lib FAKE ARGS…` in this home, on this node.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = self.node.gpupilot(args);
        cmd.env("GPUPILOT_HOME", self.home.root())
            // No system daemon of this machine's may change the messages under test.
            .env(
                "GPUPILOT_SYSTEM_DIR",
                self.home.dir.path().join("no-system"),
            )
            .env_remove("GPUPILOT_LOG")
            .env_remove("CUDA_VISIBLE_DEVICES")
            .current_dir(self.home.dir.path())
            .stdin(Stdio::null());
        cmd
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().unwrap()
    }

    /// Run `gpupilot ARGS…`, which must succeed; its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "gpupilot {args:?} failed\nstdout: {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Run `gpupilot ARGS…`, which must fail; its stderr.
    pub fn fails(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            !out.status.success(),
            "gpupilot {args:?} succeeded: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8(out.stderr).unwrap()
    }

    /// The fake library's setter log, parsed.
    pub fn setter_calls(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.node.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// A home on a node made from `scenario`, no daemon yet, whose `control.toml` sends every
    /// alert to a hook appending it to the returned file (one JSON object a line).
    pub fn with_alert_hook(scenario: &str) -> (NvmlDaemon, PathBuf) {
        let s = NvmlDaemon::unstarted(scenario);
        // A root daemon (as in CI) runs hooks only as the unprivileged user control.toml
        // names: nobody, who can reach this folder and write in it.
        use std::os::unix::fs::PermissionsExt;
        let root = rustix::process::geteuid().is_root();
        let dir = s.home.dir.path().join("hooks");
        std::fs::create_dir(&dir).unwrap();
        if root {
            std::fs::set_permissions(s.home.dir.path(), PermissionsExt::from_mode(0o711)).unwrap();
            std::fs::set_permissions(&dir, PermissionsExt::from_mode(0o777)).unwrap();
        }
        let hooks = dir.join("hooks.jsonl");
        std::fs::create_dir_all(&s.home.paths.config).unwrap();
        std::fs::write(
            s.home.paths.config.join("control.toml"),
            format!(
                "[alerts]\nhook = [\"sh\", \"-c\", \"cat >> {}\"]\n{}",
                hooks.display(),
                if root { "hook_user = \"nobody\"\n" } else { "" }
            ),
        )
        .unwrap();
        (s, hooks)
    }

    /// `status --json`, which must succeed, parsed.
    pub fn status_json(&self) -> Value {
        let out = self.run(&["status", "--json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// `doctor --json` with a Python that has no PyTorch: its exit status and report.
    pub fn doctor_json(&self) -> (Option<i32>, Value) {
        let py = self.home.dir.path().join("python3");
        std::fs::write(&py, "#!/bin/sh\necho '{\"torch\": null}'\n").unwrap();
        std::fs::set_permissions(
            &py,
            <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755),
        )
        .unwrap();
        let out = self
            .cmd(&["doctor", "--json"])
            .env("GPUPILOT_PYTHON", &py)
            .output()
            .unwrap();
        (
            out.status.code(),
            serde_json::from_slice(&out.stdout).unwrap(),
        )
    }

    /// The daemon's record of the settings before its first change, if any.
    pub fn originals(&self) -> Option<Value> {
        let path = self.home.paths.state.join("control/originals.json");
        std::fs::read_to_string(path)
            .ok()
            .map(|t| serde_json::from_str(&t).unwrap())
    }
}
