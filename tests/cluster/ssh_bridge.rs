//! Another node's daemon over SSH, end to end: a real `sshd` on a loopback port with throwaway
//! keys, `ssh … gpupilot bridge` started by the client, and the daemon on the "remote" side in
//! its own GPUPILOT_HOME. Needs `sshd` (Debian's openssh-server, which .ci/run installs);
//! without it the tests pass with a printed reason unless GPUPILOT_REQUIRE_PEERS=1.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::home::Home;
use crate::support::net::closed_port;
use crate::support::ssh::{Sshd, remote_command, sshd, user};
use crate::support::wait::wait_for;
use gpupilot::client::Origin;
use gpupilot::protocol::KnobName;

const BIN: &str = env!("CARGO_BIN_EXE_gpupilot");

#[test]
fn runs_knobs_and_status_of_another_node_through_ssh() {
    let Some(sshd) = sshd() else { return };
    let server = Sshd::start(&sshd);
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let profile = home.dir.path().join("synth.toml");
    std::fs::write(
        &profile,
        format!(
            "name = \"synth\"\n[run]\ncommand = [\"{BIN}\", \"synthetic-train\", \"--speed\", \"4\"]\n\
             [knobs.batch_size]\ninitial = 128\nmin = 8\nmax = 1024\n"
        ),
    )
    .unwrap();
    let run = home
        .ok(&["run", "--detach", profile.to_str().unwrap()])
        .trim()
        .to_string();

    let origin = Origin::Command {
        argv: shell_words::split(&server.ssh())
            .unwrap()
            .into_iter()
            .chain([format!("{}@127.0.0.1", user()), remote_command(&home)])
            .map(Into::into)
            .collect(),
        label: "ssh:127.0.0.1".into(),
    };
    let remote = origin
        .connect("ssh-bridge-test")
        .expect("a client over ssh");
    let status = remote.status().unwrap();
    assert_eq!(status.telemetry.gpus, 2);
    assert_eq!(
        status.daemon.pid,
        home.client().status().unwrap().daemon.pid
    );
    assert!(remote.runs().unwrap().iter().any(|r| r.id == run));

    // A knob change through the bridge reaches the trainer on the other side.
    wait_for("the trainer to attach", Duration::from_secs(20), || {
        remote
            .run_metrics(&run, 0)
            .is_ok_and(|m| m.trainer.attached)
    });
    let pending = remote
        .knob_set(
            &run,
            KnobName::BatchSize,
            256,
            false,
            Some("over ssh".into()),
        )
        .unwrap();
    wait_for("the change to be applied", Duration::from_secs(10), || {
        remote.run_metrics(&run, 0).is_ok_and(|m| {
            m.trainer
                .last
                .is_some_and(|p| p.report.batch_size == Some(256))
        })
    });
    let applied = home
        .node_events()
        .into_iter()
        .find(|e| e["event"] == "knob_applied" && e["change"] == pending.seq)
        .expect("knob_applied in the node's log");
    assert_eq!(applied["value"], 256);
    // Who asked: the SSH user, through the bridge's process.
    let changed = home
        .node_events()
        .into_iter()
        .find(|e| e["event"] == "knob_changed")
        .unwrap();
    assert!(
        changed["by"].as_str().unwrap().contains("gpupilot"),
        "{changed}"
    );
    drop(remote);
    home.ok(&["stop", &run]);
}

#[test]
fn attach_host_prints_the_runs_log_and_a_missing_node_or_gpupilot_says_so() {
    let Some(sshd) = sshd() else { return };
    let server = Sshd::start(&sshd);
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let run = home
        .ok(&[
            "run",
            "--detach",
            "--",
            "sh",
            "-c",
            "echo from-the-remote-node; sleep 30",
        ])
        .trim()
        .to_string();
    wait_for("the run's output", Duration::from_secs(10), || {
        std::fs::read_to_string(home.run_dir(&run).path().join("stdout.log"))
            .is_ok_and(|s| s.contains("from-the-remote-node"))
    });
    let attach = |ssh: String, remote: String, target: &str| {
        let mut cmd = Command::new(BIN);
        cmd.args(["attach", "--host", target, &run])
            .env("GPUPILOT_SSH", ssh)
            .env("GPUPILOT_REMOTE_COMMAND", remote)
            .env("GPUPILOT_HOME", home.dir.path().join("elsewhere"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = cmd.spawn().unwrap();
        (Instant::now(), child)
    };
    let target = format!("{}@127.0.0.1", user());

    // The log, read through the bridge (stdout is not a terminal: attach prints and follows).
    let (_, mut child) = attach(server.ssh(), remote_command(&home), &target);
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        use std::io::Read;
        let mut buf = [0u8; 4096];
        let mut seen = String::new();
        while !seen.contains("from-the-remote-node") {
            match stdout.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => seen.push_str(&String::from_utf8_lossy(&buf[..n])),
            }
        }
        seen
    });
    wait_for(
        "the log through the bridge",
        Duration::from_secs(20),
        || reader.is_finished(),
    );
    let _ = child.kill();
    let _ = child.wait();
    assert!(reader.join().unwrap().contains("from-the-remote-node"));

    // No sshd on that port: a clear error, quickly.
    let (_closed, closed) = closed_port();
    let bad_ssh = server
        .ssh()
        .replace(&format!("-p {}", server.port), &format!("-p {closed}"));
    let (started, child) = attach(bad_ssh, remote_command(&home), &target);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("no gpupilot daemon reachable") && err.contains("refused"),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(15));

    // The node answers but has no gpupilot.
    let (_, child) = attach(server.ssh(), "/nonexistent/gpupilot bridge".into(), &target);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("no gpupilot daemon reachable") && err.contains("No such file"),
        "{err}"
    );
    home.ok(&["stop", &run]);
}
