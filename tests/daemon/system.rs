//! The system daemon (`gpupilot daemon --system`): root's, its socket open to every local
//! user. Everyone may watch; root and the members of its group may change GPU settings; runs
//! are root's alone. A user whose own daemon is not root is pointed at it.
//!
//! Needs root (the daemon refuses `--system` otherwise, and clients run as uid 65534 through
//! setpriv); CI runs as root. GPUPILOT_SYSTEM_DIR puts the daemon's files in a temporary
//! directory instead of /run and /var/lib.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::support::home::{DaemonProc, Home, node_events};
use crate::support::nvml::FakeNode;
use crate::support::peers::peer;
use crate::support::proc::send;
use crate::support::proc::{Reachable, helper_args, reachable_by_others};
use crate::support::tmux::Tmux;
use crate::support::wait::wait_for;
use gpupilot::client::Client;
use gpupilot::config::Paths;
use serde_json::Value;

/// uid 65534 (nobody), and a primary group that names no group in /etc/group.
const NOBODY: &str = "65534";
const NO_GROUP: &str = "65533";
/// The allowed group in these tests: `nogroup`, gid 65534, which setpriv can hand to nobody.
const ALLOWED: &str = "nogroup";
const ALLOWED_GID: &str = "65534";

/// Whether this test can run: root, and setpriv to be another user. Without setpriv the test
/// says so and passes, unless GPUPILOT_REQUIRE_PEERS=1 (CI), where it fails.
fn can_run() -> bool {
    if gpupilot::config::paths::current_uid() != 0 {
        eprintln!("SKIPPED: the system daemon and changing uid need root");
        return false;
    }
    peer("setpriv").is_some()
}

/// Who runs a client: root, or uid 65534 with a primary group and supplementary groups.
#[derive(Clone, Copy)]
enum As {
    Root,
    Nobody {
        gid: &'static str,
        groups: &'static [&'static str],
    },
}

const PLAIN_NOBODY: As = As::Nobody {
    gid: NO_GROUP,
    groups: &[],
};

/// A system daemon in a temporary GPUPILOT_SYSTEM_DIR; killed when dropped.
struct System {
    dir: tempfile::TempDir,
    paths: Paths,
    daemon: Option<DaemonProc>,
    /// The gpupilot binary where uid 65534 can run it.
    exe: Reachable,
}

impl System {
    /// `gpupilot --source sim --gpus 2 daemon --system --rate 10 EXTRA…`.
    fn start(extra: &[&str]) -> System {
        let dir = tempfile::tempdir().unwrap();
        // Other users must pass through to the socket (tempdir makes it 0700).
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut s = System {
            paths: Paths::resolve_system(|k| {
                (k == "GPUPILOT_SYSTEM_DIR").then(|| dir.path().join("sys"))
            }),
            dir,
            daemon: None,
            exe: reachable_by_others(Path::new(env!("CARGO_BIN_EXE_gpupilot"))),
        };
        let mut args = vec!["daemon", "--system", "--rate", "10"];
        args.extend_from_slice(extra);
        let child = s
            .cmd(As::Root, &args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let d = DaemonProc::answering(child, &s.paths, "the system daemon");
        s.daemon = Some(d);
        s
    }

    fn sys_dir(&self) -> PathBuf {
        self.dir.path().join("sys")
    }

    fn socket(&self) -> PathBuf {
        gpupilot::ipc::socket_path(&self.paths)
    }

    /// `gpupilot --source sim --gpus 2 ARGS…` as `who`, with this system directory, from `/`.
    fn cmd(&self, who: As, args: &[&str]) -> Command {
        let exe = self.exe.path();
        let mut cmd = match who {
            As::Root => Command::new(exe),
            As::Nobody { gid, groups } => {
                let mut c = Command::new("setpriv");
                c.args(["--reuid", NOBODY, "--regid", gid]);
                if groups.is_empty() {
                    c.arg("--clear-groups");
                } else {
                    c.args(["--groups", &groups.join(",")]);
                }
                c.arg("--").arg(exe);
                c
            }
        };
        cmd.args(["--source", "sim", "--gpus", "2"])
            .args(args)
            .current_dir("/")
            .env("GPUPILOT_SYSTEM_DIR", self.sys_dir())
            // A user's own daemon would live here; none is started by `--system` commands.
            .env("GPUPILOT_HOME", self.dir.path().join("user-home"))
            .env_remove("GPUPILOT_SYSTEM")
            .env_remove("GPUPILOT_SOURCE")
            .env_remove("GPUPILOT_NVML_LIB")
            .env_remove("GPUPILOT_LOG")
            .stdin(Stdio::null());
        cmd
    }

    fn run(&self, who: As, args: &[&str]) -> Output {
        self.cmd(who, args).output().unwrap()
    }

    fn ok(&self, who: As, args: &[&str]) -> String {
        let out = self.run(who, args);
        assert!(
            out.status.success(),
            "gpupilot {args:?} failed\nstdout: {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn fails(&self, who: As, args: &[&str]) -> String {
        let out = self.run(who, args);
        assert!(
            !out.status.success(),
            "gpupilot {args:?} succeeded: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8(out.stderr).unwrap()
    }

    /// Each GPU's power limit, as `power --json` run by `who` reports it.
    fn limits(&self, who: As) -> Vec<f64> {
        let p: Value =
            serde_json::from_str(&self.ok(who, &["--system", "power", "--json"])).unwrap();
        p["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["power"]["current_w"].as_f64().unwrap())
            .collect()
    }

    fn node_events(&self) -> Vec<Value> {
        node_events(&self.paths)
    }
}

impl Drop for System {
    fn drop(&mut self) {
        drop(self.daemon.take());
        if let Some(pid) = gpupilot::daemon::lock_holder(&self.paths) {
            send(pid, rustix::process::Signal::KILL);
        }
    }
}

/// Not a test of its own: the raw client the tests run as another user. With
/// GPUPILOT_TEST_SOCKET set it connects there, sends the frames in GPUPILOT_TEST_FRAMES (one a
/// line), and prints each answer on a line of its own after `FRAME `; otherwise it does nothing.
#[test]
fn raw_client_child() {
    let Some(socket) = std::env::var_os("GPUPILOT_TEST_SOCKET") else {
        return;
    };
    let frames = std::env::var("GPUPILOT_TEST_FRAMES").unwrap();
    let stream = UnixStream::connect(&socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    let mut out = std::io::stdout().lock();
    for frame in frames.lines() {
        writer.write_all(frame.as_bytes()).unwrap();
        writer.write_all(b"\n").unwrap();
        let id = serde_json::from_str::<Value>(frame).unwrap()["id"].clone();
        // Skip pushes (telemetry after a subscribe) until this frame's answer.
        loop {
            let mut line = String::new();
            assert!(
                reader.read_line(&mut line).unwrap() > 0,
                "the daemon closed"
            );
            if serde_json::from_str::<Value>(&line).unwrap()["id"] == id {
                writeln!(out, "FRAME {}", line.trim_end()).unwrap();
                break;
            }
        }
    }
}

/// Send `frames` to the system daemon as `who` through [`raw_client_child`]; the answers.
fn raw_as(s: &System, who: As, frames: &[&str]) -> Vec<Value> {
    let me = reachable_by_others(&std::env::current_exe().unwrap());
    let me = me.path();
    let mut cmd = match who {
        As::Root => Command::new(me),
        As::Nobody { gid, .. } => {
            let mut c = Command::new("setpriv");
            c.args(["--reuid", NOBODY, "--regid", gid, "--clear-groups", "--"])
                .arg(me);
            c
        }
    };
    let out = cmd
        .args(helper_args(module_path!(), "raw_client_child"))
        .current_dir("/")
        .env("GPUPILOT_TEST_SOCKET", s.socket())
        .env("GPUPILOT_TEST_FRAMES", frames.join("\n"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the raw client failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        // libtest may print `test raw_client_child ... ` on the same line first.
        .filter_map(|l| l.split_once("FRAME ").map(|(_, frame)| frame))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().mode() & 0o777
}

#[test]
fn everyone_watches_and_only_root_and_the_group_change_gpu_settings() {
    if !can_run() {
        return;
    }
    let s = System::start(&["--allow-group", ALLOWED]);
    assert_eq!(mode(&s.socket()), 0o666, "every local user may connect");
    assert_eq!(mode(&s.paths.runtime), 0o755);
    assert_eq!(mode(&s.paths.state), 0o700, "the state stays root's");
    assert_eq!(std::fs::metadata(s.socket()).unwrap().uid(), 0);

    // Watching: the power settings, the run list, status, history and a subscription.
    assert_eq!(s.limits(PLAIN_NOBODY), [700.0, 700.0]);
    assert_eq!(
        s.ok(PLAIN_NOBODY, &["--system", "ps", "--json"]).trim(),
        "[]"
    );
    let answers = raw_as(
        &s,
        PLAIN_NOBODY,
        &[
            r#"{"id":1,"type":"hello","version":1,"client":"test"}"#,
            r#"{"id":2,"type":"status"}"#,
            r#"{"id":3,"type":"history","gpu":0,"metric":"power","from":0,"to":1e12,"max_points":10}"#,
            r#"{"id":4,"type":"subscribe","telemetry":true}"#,
            r#"{"id":5,"type":"logs","run":"last"}"#,
            r#"{"id":6,"type":"power_cap","gpus":"all","watts":300}"#,
        ],
    );
    let types: Vec<&str> = answers
        .iter()
        .map(|a| a["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        [
            "welcome",
            "status",
            "history",
            "subscribed",
            "error",
            "error"
        ],
        "{answers:?}"
    );
    assert_eq!(answers[1]["daemon"]["uid"], 0, "root's daemon");
    assert_eq!(answers[1]["telemetry"]["gpus"], 2);
    assert_eq!(
        answers[4]["code"], "permission_denied",
        "a run's output is root's"
    );
    assert_eq!(answers[5]["code"], "permission_denied");

    // Not in the group: refused, told which group to join, and nothing changes.
    let err = s.fails(
        PLAIN_NOBODY,
        &["--system", "power", "cap", "300", "--gpu", "0"],
    );
    assert!(
        err.contains("changing GPU settings (power_cap) on the system daemon is for root and the members of group `nogroup`"),
        "{err}"
    );
    assert!(err.contains("nobody (uid 65534) is not one"), "{err}");
    assert!(err.contains("sudo usermod -aG nogroup nobody"), "{err}");
    let err = s.fails(
        PLAIN_NOBODY,
        &["--system", "clocks", "lock", "1000", "1500"],
    );
    assert!(err.contains("(clocks_lock)"), "{err}");
    assert_eq!(s.limits(As::Root), [700.0, 700.0]);

    // In the group as a supplementary group of the process (primary group elsewhere): allowed.
    let member = As::Nobody {
        gid: NO_GROUP,
        groups: &[ALLOWED_GID],
    };
    let out = s.ok(member, &["--system", "power", "cap", "300", "--gpu", "0"]);
    assert_eq!(out, "GPU 0: power limit 700 W → 300 W\n");
    // As the primary group: allowed too.
    let primary = As::Nobody {
        gid: ALLOWED_GID,
        groups: &[],
    };
    s.ok(primary, &["--system", "power", "cap", "350", "--gpu", "1"]);
    assert_eq!(s.limits(PLAIN_NOBODY), [300.0, 350.0]);
    // Root may do everything.
    s.ok(As::Root, &["--system", "power", "reset"]);
    assert_eq!(s.limits(As::Root), [700.0, 700.0]);

    // The audit log: who changed what, and every refusal.
    let events = s.node_events();
    let changed: Vec<&Value> = events
        .iter()
        .filter(|e| e["event"] == "gpu_changed")
        .collect();
    assert_eq!(changed.len(), 4, "{changed:?}");
    assert!(changed[0]["by"].as_str().unwrap().contains("uid 65534"));
    let refused: Vec<String> = events
        .iter()
        .filter(|e| e["event"] == "peer_refused" && e["uid"] == 65534)
        .map(|e| e["reason"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        refused,
        [
            "logs: runs on the system daemon are root's",
            "power_cap: not root and not in group nogroup",
            "power_cap: not root and not in group nogroup",
            "clocks_lock: not root and not in group nogroup",
        ]
    );
}

#[test]
fn runs_on_the_system_daemon_are_roots() {
    if !can_run() {
        return;
    }
    let s = System::start(&["--allow-group", ALLOWED]);
    let member = As::Nobody {
        gid: ALLOWED_GID,
        groups: &[ALLOWED_GID],
    };
    let err = s.fails(member, &["--system", "run", "--detach", "--", "true"]);
    assert!(
        err.contains("the system daemon runs no jobs for users (run_start)"),
        "{err}"
    );
    assert!(err.contains("leave out --system"), "{err}");
    assert_eq!(s.ok(As::Root, &["--system", "ps", "--json"]).trim(), "[]");
    // Root's run starts, and users see it listed but may not stop it.
    let id = s.ok(
        As::Root,
        &["--system", "run", "--detach", "--", "sleep", "30"],
    );
    let id = id.trim();
    assert!(s.ok(member, &["--system", "ps"]).contains(id));
    let err = s.fails(member, &["--system", "stop", id]);
    assert!(err.contains("(run_stop)"), "{err}");
    s.ok(As::Root, &["--system", "stop", id, "--kill"]);
    let refusals = s
        .node_events()
        .iter()
        .filter(|e| e["event"] == "peer_refused")
        .count();
    assert_eq!(refusals, 2);
}

#[test]
fn system_mode_needs_root_and_a_group_that_exists_or_only_root_changes() {
    if !can_run() {
        return;
    }
    // Not root: refused before anything is made.
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let exe = reachable_by_others(Path::new(env!("CARGO_BIN_EXE_gpupilot")));
    let out = Command::new("setpriv")
        .args(["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups", "--"])
        .arg(exe.path())
        .args(["--source", "sim", "daemon", "--system"])
        .env("GPUPILOT_SYSTEM_DIR", tmp.path().join("sys"))
        .current_dir("/")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`gpupilot daemon --system` runs as root"),
        "{err}"
    );
    assert!(err.contains("sudo gpupilot daemon --system"), "{err}");
    assert!(!tmp.path().join("sys").exists(), "nothing was made");
    // --allow-group without --system is a mistake, said at once.
    let out = Command::new(env!("CARGO_BIN_EXE_gpupilot"))
        .args(["--source", "sim", "daemon", "--allow-group", "nogroup"])
        .env("GPUPILOT_HOME", tmp.path().join("home"))
        .env_remove("GPUPILOT_SYSTEM")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("add --system"));

    // The default group, `gpupilot`, does not exist here: only root changes settings, and a
    // user is told how the group is made.
    let etc_group = std::fs::read_to_string("/etc/group").unwrap();
    if etc_group.lines().any(|l| l.starts_with("gpupilot:")) {
        eprintln!("SKIPPED the missing-group half: this machine has a `gpupilot` group");
        return;
    }
    let s = System::start(&[]);
    let anyone = As::Nobody {
        gid: NOBODY,
        groups: &[NOBODY],
    };
    let err = s.fails(anyone, &["--system", "power", "cap", "300"]);
    assert!(
        err.contains("group `gpupilot` does not exist on this node"),
        "{err}"
    );
    assert!(err.contains("sudo groupadd gpupilot"), "{err}");
    s.ok(As::Root, &["--system", "power", "cap", "300"]);
    assert_eq!(s.limits(anyone), [300.0, 300.0]);
}

#[test]
fn without_a_system_daemon_clients_say_so_and_start_none() {
    let tmp = tempfile::tempdir().unwrap();
    let sys = tmp.path().join("sys");
    for (flag, env) in [(Some("--system"), None), (None, Some("1"))] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpupilot"));
        cmd.args(["--source", "sim"]);
        if let Some(f) = flag {
            cmd.arg(f);
        }
        cmd.args(["power", "--json"])
            .env("GPUPILOT_SYSTEM_DIR", &sys)
            .env("GPUPILOT_HOME", tmp.path().join("home"))
            .env_remove("GPUPILOT_SYSTEM")
            .stdin(Stdio::null());
        if let Some(v) = env {
            cmd.env("GPUPILOT_SYSTEM", v);
        }
        let out = cmd.output().unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("no system gpupilot daemon answers at")
                && err.contains(&sys.join("run/daemon.sock").display().to_string()),
            "{err}"
        );
        assert!(
            err.contains("sudo gpupilot daemon --system --detach"),
            "{err}"
        );
    }
    // Neither a system daemon nor the user's own was started.
    assert!(!sys.exists());
    assert!(!tmp.path().join("home").exists());
    // GPUPILOT_SYSTEM=0 is off: the user's own daemon is started as usual.
    let home = Home::new();
    let out = home
        .gpupilot(&["power", "--json"])
        .env("GPUPILOT_SYSTEM", "0")
        .env("GPUPILOT_SYSTEM_DIR", &sys)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(home.socket().exists());
}

/// A node whose NVML refuses every setter, as it does to a daemon that is not root.
const REFUSES_SETTERS: &str = r#"
model = "h100-sxm"
count = 2
[[faults]]
kind = "no_permission"
"#;

/// `gpupilot ARGS` on `node` as the user of `home`, with the system daemon in `sys_dir`.
fn user_command(node: &FakeNode, home: &Home, sys_dir: &Path, args: &[&str]) -> Command {
    let mut cmd = node.gpupilot(args);
    cmd.env("GPUPILOT_HOME", home.root())
        .env("GPUPILOT_SYSTEM_DIR", sys_dir)
        .env_remove("GPUPILOT_SYSTEM")
        .env_remove("GPUPILOT_LOG")
        .current_dir(home.dir.path())
        .stdin(Stdio::null());
    cmd
}

/// The user's own daemon on `node`, once it answers.
fn user_daemon(node: &FakeNode, home: &Home, sys_dir: &Path) -> DaemonProc {
    let child = user_command(node, home, sys_dir, &["daemon", "--rate", "10"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let d = DaemonProc { child: Some(child) };
    wait_for("the user's daemon", Duration::from_secs(20), || {
        Client::connect(&home.paths).is_ok()
    });
    d
}

#[test]
fn a_users_daemon_without_root_points_at_the_running_system_daemon() {
    if !can_run() {
        return;
    }
    // The user's own daemon on a node whose NVML refuses setters (as it does to non-root).
    let node = FakeNode::new(REFUSES_SETTERS);
    let home = Home::new();
    let s = System::start(&[]);
    let sys_dir = s.sys_dir();
    let user_cmd = |args: &[&str]| user_command(&node, &home, &sys_dir, args);
    let _user_daemon = user_daemon(&node, &home, &sys_dir);
    let out = user_cmd(&["power", "cap", "250", "--gpu", "1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("setting the power limit on GPU 1 needs root (NVML answered NO_PERMISSION)"),
        "{err}"
    );
    assert!(
        err.contains("a system daemon is running: add --system (`gpupilot --system"),
        "{err}"
    );
    assert!(!err.contains("start a root daemon"), "{err}");

    // With the system daemon gone, the advice is how to start one again.
    drop(s);
    let out = user_cmd(&["power", "cap", "250", "--gpu", "1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("sudo gpupilot daemon --system"), "{err}");
    assert!(!err.contains("a system daemon is running"), "{err}");
}

#[test]
fn the_console_shows_the_system_daemons_gpus_to_any_user() {
    if !can_run() || peer("tmux").is_none() {
        return;
    }
    let s = System::start(&["--allow-group", ALLOWED]);
    let user_home = s.dir.path().join("user-home");
    let tmux = Tmux::start(&user_home);
    tmux.wait_prompt();
    tmux.type_line(&format!(
        "GPUPILOT_SYSTEM_DIR={} setpriv --reuid {NOBODY} --regid {NO_GROUP} --clear-groups {} --system",
        s.sys_dir().display(),
        s.exe.path().display()
    ));
    // The system daemon's two simulated GPUs, live, in a console run by uid 65534.
    tmux.wait_screen("two H100 blocks", |screen| {
        screen.matches("NVIDIA H100 80GB HBM3").count() == 2
    });
    tmux.keys(&["q"]);
    tmux.wait_prompt();
    assert!(
        !user_home.exists(),
        "`--system` started no daemon of the user's own"
    );
}

#[test]
fn a_tuning_job_on_a_users_daemon_sets_caps_through_the_system_daemon() {
    if !can_run() {
        return;
    }
    // The user's daemon on a node whose NVML refuses it every setter; the system daemon's
    // GPUs take the caps instead, as `gpupilot --system power cap` would.
    let node = FakeNode::new(REFUSES_SETTERS);
    let home = Home::new();
    let s = System::start(&[]);
    let sys_dir = s.sys_dir();
    let user_cmd = |args: &[&str]| user_command(&node, &home, &sys_dir, args);
    let _user_daemon = user_daemon(&node, &home, &sys_dir);
    let ok = |args: &[&str]| {
        let out = user_cmd(args).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let profile = home.dir.path().join("synth.toml");
    std::fs::write(
        &profile,
        format!(
            "name = \"synth\"\n[run]\ncommand = [\"{}\", \"synthetic-train\", \"--speed\", \"4\"]\n",
            env!("CARGO_BIN_EXE_gpupilot")
        ),
    )
    .unwrap();
    let run = ok(&["run", "--detach", &profile.display().to_string()])
        .trim()
        .to_string();
    let c = Client::connect(&home.paths).unwrap();
    wait_for("the trainer to report", Duration::from_secs(30), || {
        c.run_metrics(&run, 0)
            .is_ok_and(|m| m.trainer.attached && !m.points.is_empty())
    });
    let before = s.limits(As::Root);
    ok(&[
        "tune",
        "energy",
        &run,
        "--detach",
        "--seconds",
        "2",
        "--warmup",
        "1",
        "--step-w",
        "250",
    ]);
    // The search's caps land on the system daemon's GPUs, with the job as the reason.
    wait_for(
        "a cap set through the system daemon",
        Duration::from_secs(60),
        || {
            s.node_events().iter().any(|e| {
                e["event"] == "gpu_changed"
                    && e["what"] == "power_limit"
                    && e["why"].as_str().is_some_and(|w| w.contains("tune"))
            })
        },
    );
    // The search starts at the default cap (the one set now); its next probe is below it.
    wait_for(
        "a probe below the default cap",
        Duration::from_secs(60),
        || s.limits(As::Root) != before,
    );
    // Stopping the job puts the system daemon's caps back.
    ok(&["tune", "stop", &run]);
    wait_for("the caps back", Duration::from_secs(30), || {
        s.limits(As::Root) == before
    });
    ok(&["stop", &run, "--kill"]);
}
