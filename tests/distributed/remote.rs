//! Ranks on another node reach their run's trainer channel through the daemon of the node they
//! run on, which relays them over SSH to the run's daemon. Two daemons on this machine stand
//! for two nodes (`GPUPILOT_NODE_NAME` node-a and node-b, each in its own GPUPILOT_HOME); B
//! reaches A through a real `sshd` on a loopback port with throwaway keys (`GPUPILOT_SSH`) and
//! the test's binary as `gpupilot bridge` in A's home (`GPUPILOT_REMOTE_COMMAND`). Needs `sshd`
//! (Debian's openssh-server, which .ci/run installs); without it the tests pass with a printed
//! reason unless GPUPILOT_REQUIRE_PEERS=1.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::home::{DaemonProc, Home, Raw};
use crate::support::net::closed_port;
use crate::support::ranks::{RANK_SCRIPT, printed, sdk_dir};
use crate::support::ssh::{Sshd, remote_command, sshd};
use crate::support::wait::wait_for;
use gpupilot::client::Client;
use serde_json::{Value, json};

/// A daemon in `home` that calls itself `node` (and reaches other nodes as `env` says).
fn node_daemon(home: &Home, node: &str, env: &[(&str, String)]) -> DaemonProc {
    let child = home
        .gpupilot(&["daemon", "--rate", "10"])
        .env("GPUPILOT_NODE_NAME", node)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let d = DaemonProc { child: Some(child) };
    wait_for("the daemon to answer", Duration::from_secs(20), || {
        Client::connect(&home.paths).is_ok()
    });
    let welcome = home.client().status().unwrap();
    assert_eq!(welcome.daemon.node, node);
    d
}

/// A process the test started; killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn ranks_on_another_node_switch_at_the_same_step_through_its_daemon_and_ssh() {
    let Some(sshd) = sshd() else { return };
    let server = Sshd::start(&sshd);
    let a = Home::new();
    let b = Home::new();
    let _da = node_daemon(&a, "node-a", &[]);
    let _db = node_daemon(
        &b,
        "node-b",
        &[
            ("GPUPILOT_SSH", server.ssh_to_any_node(server.port)),
            ("GPUPILOT_REMOTE_COMMAND", remote_command(&a)),
        ],
    );

    // A run of a world of 4 on node-a, whose ranks 0 and 1 run there.
    let script = a.dir.path().join("rank.py");
    std::fs::write(&script, RANK_SCRIPT).unwrap();
    let local: Vec<String> = (0..2)
        .map(|r| {
            format!(
                "RANK={r} LOCAL_RANK={r} WORLD_SIZE=4 python3 {} &",
                script.display()
            )
        })
        .collect();
    let profile = a.dir.path().join("ddp.toml");
    std::fs::write(
        &profile,
        format!(
            "name = \"ddp\"\n[run]\ncommand = [\"sh\", \"-c\", \"{} wait\"]\nenv = {{ SDK_DIR = \"{}\" }}\n\
             [knobs.batch_size]\ninitial = 32\nmin = 1\nmax = 1024\n",
            local.join(" "),
            sdk_dir().display()
        ),
    )
    .unwrap();
    let out = a
        .gpupilot(&["run", "--detach", &profile.display().to_string()])
        .env("GPUPILOT_NODE_NAME", "node-a")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let run = String::from_utf8(out.stdout).unwrap().trim().to_string();

    // The run's environment names its node next to its socket.
    let launch: Value =
        serde_json::from_slice(&std::fs::read(a.run_dir(&run).path().join("launch.json")).unwrap())
            .unwrap();
    let env = &launch["env"];
    assert_eq!(env["GPUPILOT_RUN_NODE"], "node-a", "{env}");
    assert_eq!(env["GPUPILOT_SOCKET"], a.socket().display().to_string());

    // Ranks 2 and 3 on node-b, with the run's environment as a Slurm job would pass it on.
    let remote: Vec<(Proc, PathBuf)> = (2..4)
        .map(|r| {
            let log = b.dir.path().join(format!("rank{r}.log"));
            let child = Command::new("python3")
                .arg(&script)
                .env_remove("GPUPILOT_HOME")
                .env("SDK_DIR", sdk_dir())
                .env("RANK", r.to_string())
                .env("LOCAL_RANK", (r - 2).to_string())
                .env("WORLD_SIZE", "4")
                .env("GPUPILOT_SOCKET", env["GPUPILOT_SOCKET"].as_str().unwrap())
                .env("GPUPILOT_RUN_ID", env["GPUPILOT_RUN_ID"].as_str().unwrap())
                .env(
                    "GPUPILOT_RUN_NODE",
                    env["GPUPILOT_RUN_NODE"].as_str().unwrap(),
                )
                .env("GPUPILOT_NODE_NAME", "node-b")
                .env("GPUPILOT_NODE_SOCKET", b.socket())
                .stdin(Stdio::null())
                .stdout(std::fs::File::create(&log).unwrap())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            (Proc(child), log)
        })
        .collect();

    let c = a.client();
    wait_for(
        "4 ranks to attach and report on node-a",
        Duration::from_secs(60),
        || {
            c.run_metrics(&run, 0).is_ok_and(|m| {
                m.trainer
                    .ranks
                    .iter()
                    .filter(|r| {
                        r.attached && r.last.as_ref().is_some_and(|p| p.report.step.is_some())
                    })
                    .count()
                    == 4
            })
        },
    );
    // node-b relays them and says so; node-a sees ordinary ranks (it knows no relay).
    let opened = b.events_named("relay_opened");
    let mut relayed: Vec<u64> = opened.iter().map(|e| e["rank"].as_u64().unwrap()).collect();
    relayed.sort();
    assert_eq!(relayed, [2, 3], "{opened:?}");
    assert!(
        opened
            .iter()
            .all(|e| e["node"] == "node-a" && e["run"] == run)
    );
    assert!(b.events_named("relay_failed").is_empty());
    assert!(a.events_named("relay_opened").is_empty());
    assert!(
        b.client().runs().unwrap().is_empty(),
        "node-b has no run of its own"
    );

    // A relayed rank attaches once SSH is up, its first reports in one burst: until its pace
    // is measured over a longer stretch, the apply step would be chosen far ahead.
    wait_for(
        "every rank's pace to settle",
        Duration::from_secs(20),
        || {
            c.run_metrics(&run, 0).is_ok_and(|m| {
                m.trainer
                    .ranks
                    .iter()
                    .all(|r| r.steps_per_s.is_some_and(|v| v < 80.0))
            })
        },
    );
    let out = a.run(&["set", &run, "batch-size", "64"], Duration::from_secs(30));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let applied = a.events_named("knob_applied");
    assert_eq!(applied.len(), 1, "{applied:?}");
    assert_eq!(applied[0]["ranks"], 4);
    let at = applied[0]["step"].as_u64().unwrap();
    assert!(
        text.contains("4/4 ranks") && text.contains(&format!("step {at}")),
        "{text}"
    );

    // Every rank, on either node, printed 32 up to the step before and 64 from it on.
    let outputs = || {
        let mut texts =
            vec![std::fs::read_to_string(a.run_dir(&run).path().join("stdout.log")).unwrap()];
        texts.extend(
            remote
                .iter()
                .map(|(_, log)| std::fs::read_to_string(log).unwrap()),
        );
        printed(texts.iter().map(String::as_str))
    };
    wait_for("every rank past the step", Duration::from_secs(10), || {
        let by_rank = outputs();
        by_rank.len() == 4
            && by_rank
                .values()
                .all(|steps| steps.keys().max().is_some_and(|&s| s > at + 3))
    });
    for (rank, steps) in &outputs() {
        let first_new = steps.iter().find(|(_, bs)| **bs == 64).map(|(s, _)| *s);
        assert_eq!(
            first_new,
            Some(at),
            "rank {rank} switched at {first_new:?}, not {at}"
        );
        assert!(
            steps
                .iter()
                .all(|(s, bs)| (*s < at && *bs == 32) || (*s >= at && *bs == 64)),
            "rank {rank}: {steps:?}"
        );
    }

    // A rank that leaves node-b leaves node-a's table too: the relay closes both ways.
    drop(remote);
    wait_for("ranks 2 and 3 to detach", Duration::from_secs(10), || {
        c.run_metrics(&run, 0).is_ok_and(|m| {
            m.trainer
                .ranks
                .iter()
                .filter(|r| r.attached)
                .map(|r| r.spec.rank)
                .eq([0, 1])
        })
    });
    a.ok(&["stop", &run]);
}

#[test]
fn a_relay_that_cannot_open_says_why_and_the_connection_stays_usable() {
    let Some(sshd) = sshd() else { return };
    let server = Sshd::start(&sshd);
    let a = Home::new();
    let _da = node_daemon(&a, "node-a", &[]);
    // node-b reaches an SSH port where nothing listens; node-c reaches node-a, which has no
    // gpupilot at the path it is given.
    let (_closed, closed) = closed_port();
    let b = Home::new();
    let _db = node_daemon(
        &b,
        "node-b",
        &[
            ("GPUPILOT_SSH", server.ssh_to_any_node(closed)),
            ("GPUPILOT_REMOTE_COMMAND", remote_command(&a)),
        ],
    );
    let c = Home::new();
    let _dc = node_daemon(
        &c,
        "node-c",
        &[
            ("GPUPILOT_SSH", server.ssh_to_any_node(server.port)),
            (
                "GPUPILOT_REMOTE_COMMAND",
                "/nonexistent/gpupilot bridge".into(),
            ),
        ],
    );
    let attach = json!({
        "id": 2, "type": "trainer_attach", "run": "20261130-041500-ddp", "pid": 4242,
        "rank": 2, "world_size": 4, "via_node": "node-a",
    });
    for (home, says) in [(&b, "refused"), (&c, "No such file")] {
        let mut raw = Raw::connect(&home.socket());
        raw.hello();
        let started = Instant::now();
        raw.send(format!("{attach}\n").as_bytes()).unwrap();
        let answer = raw.recv().expect("an answer");
        assert_eq!(answer["id"], 2, "{answer}");
        assert_eq!(answer["type"], "error", "{answer}");
        assert_eq!(answer["code"], "internal", "{answer}");
        let message = answer["message"].as_str().unwrap();
        assert!(
            message.contains("no gpupilot daemon reachable through `ssh ")
                && message.contains(says)
                && message.contains("gpupilot attach --host node-a"),
            "{message}"
        );
        assert!(started.elapsed() < Duration::from_secs(15));
        let failed = home.events_named("relay_failed");
        assert_eq!(failed.len(), 1, "{failed:?}");
        assert_eq!(failed[0]["node"], "node-a");
        assert_eq!(failed[0]["rank"], 2);
        assert!(
            failed[0]["reason"].as_str().unwrap().contains(says),
            "{failed:?}"
        );
        // The same failure again (the SDK retries) is answered, not recorded again.
        raw.send(format!("{attach}\n").as_bytes()).unwrap();
        let again = raw.recv().expect("an answer");
        assert_eq!(again["type"], "error", "{again}");
        assert_eq!(home.events_named("relay_failed").len(), 1);
        // The connection is still an ordinary one: an attach to this node's own runs is
        // answered by this daemon.
        raw.send(b"{\"id\":3,\"type\":\"trainer_attach\",\"run\":\"nope\"}\n")
            .unwrap();
        let own = raw.recv().expect("an answer");
        assert_eq!(own["code"], "unknown_run", "{own}");
    }
}
