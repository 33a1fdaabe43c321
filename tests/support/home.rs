//! The daemon tests' home: a temporary GPUPILOT_HOME, a real daemon on the simulator that is
//! stopped (and killed if need be) when the test ends, the binary, raw sockets.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use gpupilot::client::Client;
use gpupilot::config::Paths;
use gpupilot::daemon;
use gpupilot::supervisor::{RunDir, adopt, signal};
use rustix::process::Signal;

use super::proc::send;
use super::wait::{finish, poll, wait_for};

/// `tune energy` options for a search of 700, 450 and 200 W on the simulator, 1 s warm-up and
/// 2 s measured each: about ten seconds.
pub const QUICK_SEARCH: [&str; 8] = [
    "--seconds",
    "2",
    "--warmup",
    "1",
    "--step-w",
    "250",
    "--eta",
    "1",
];

/// A temporary GPUPILOT_HOME. Dropping it kills the daemon holding its lock and every run it
/// still has alive, so a failing test leaves nothing behind.
pub struct Home {
    pub dir: tempfile::TempDir,
    pub paths: Paths,
}

impl Home {
    pub fn new() -> Home {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("home");
        Home {
            paths: Paths {
                config: root.join("config"),
                state: root.join("state"),
                runtime: root.join("run"),
            },
            dir,
        }
    }

    pub fn root(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    pub fn socket(&self) -> PathBuf {
        gpupilot::ipc::socket_path(&self.paths)
    }

    /// `gpupilot --source sim --gpus 2 ARGS…` in this home (cwd: the temp dir).
    pub fn gpupilot(&self, args: &[&str]) -> Command {
        self.gpupilot_via(Path::new(env!("CARGO_BIN_EXE_gpupilot")), args)
    }

    /// The same through `program`: a link to the binary, whose name the process takes.
    pub fn gpupilot_via(&self, program: &Path, args: &[&str]) -> Command {
        let mut cmd = Command::new(program);
        cmd.args(["--source", "sim", "--gpus", "2"])
            .args(args)
            .current_dir(self.dir.path())
            .env("GPUPILOT_HOME", self.root())
            .env_remove("GPUPILOT_SOURCE")
            .env_remove("GPUPILOT_NVML_LIB")
            .env_remove("GPUPILOT_LOG")
            // The user's own daemon, never the system daemon.
            .env_remove("GPUPILOT_SYSTEM")
            .stdin(Stdio::null());
        cmd
    }

    /// Run `gpupilot ARGS…` to the end (at most `timeout`), output captured.
    pub fn run(&self, args: &[&str], timeout: Duration) -> Output {
        let child = self
            .gpupilot(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        finish(child, &format!("gpupilot {args:?}"), timeout)
    }

    /// `gpupilot report RUN --json`, parsed. It carries every point of the run, more than a
    /// pipe holds while the test waits, so it goes through a file.
    pub fn report_json(&self, run: &str) -> serde_json::Value {
        let path = self.dir.path().join(format!("report-{run}.json"));
        let status = self
            .gpupilot(&["report", run, "--json"])
            .stdout(std::fs::File::create(&path).unwrap())
            .status()
            .unwrap();
        assert!(status.success(), "gpupilot report {run} --json failed");
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
    }

    /// Run `gpupilot ARGS…`, which must succeed; its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args, Duration::from_secs(30));
        assert!(
            out.status.success(),
            "gpupilot {args:?} failed ({})\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Start a daemon in the foreground (a child of the test) and wait until it answers;
    /// it samples at 10 Hz unless `extra` says `--rate`.
    pub fn daemon(&self, extra: &[&str]) -> DaemonProc {
        let mut args = vec!["daemon"];
        if !extra.contains(&"--rate") {
            args.extend(["--rate", "10"]);
        }
        args.extend_from_slice(extra);
        let child = self
            .gpupilot(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        DaemonProc::answering(child, &self.paths, "the daemon")
    }

    pub fn client(&self) -> Client {
        Client::connect(&self.paths).expect("connecting to the daemon")
    }

    /// The run directory of `id`.
    pub fn run_dir(&self, id: &str) -> RunDir {
        RunDir::open(RunDir::runs_root(&self.paths.state).join(id)).unwrap()
    }

    /// Start the synthetic trainer as a run (`synthetic-train --speed 4`) and wait until it
    /// reports over the trainer channel; its id.
    pub fn start_synthetic(&self) -> String {
        self.start_synthetic_with("")
    }

    /// The synthetic trainer under a profile with `extra` appended (its knobs, its restart
    /// policy), once it reports.
    pub fn start_synthetic_with(&self, extra: &str) -> String {
        let path = self.dir.path().join("synth.toml");
        let bin = env!("CARGO_BIN_EXE_gpupilot");
        let body = format!(
            "name = \"synth\"\n{extra}\n[run]\ncommand = [\"{bin}\", \"synthetic-train\", \"--speed\", \"4\"]\n"
        );
        std::fs::write(&path, body).unwrap();
        let run = self
            .ok(&["run", "--detach", &path.display().to_string()])
            .trim()
            .to_string();
        let c = self.client();
        wait_for("the trainer to report", Duration::from_secs(20), || {
            c.run_metrics(&run, 0)
                .is_ok_and(|m| m.trainer.attached && !m.points.is_empty())
        });
        run
    }

    /// The node's events.jsonl, parsed.
    /// `bench power-sweep` of GPU 0 over `caps` (`MAX:MIN:STEP`), 0.5 s of warm-up and a 1 s
    /// window a cap: its JSON.
    pub fn power_sweep(&self, caps: &str) -> serde_json::Value {
        let out = self.ok(&[
            "bench",
            "power-sweep",
            "--gpu",
            "0",
            "--caps",
            caps,
            "--warmup",
            "0.5s",
            "--window",
            "1s",
            "--json",
        ]);
        serde_json::from_str(&out).unwrap()
    }

    pub fn node_events(&self) -> Vec<serde_json::Value> {
        node_events(&self.paths)
    }

    /// The node events named `name`, oldest first.
    pub fn events_named(&self, name: &str) -> Vec<serde_json::Value> {
        self.node_events()
            .into_iter()
            .filter(|e| e["event"] == name)
            .collect()
    }
}

/// The events.jsonl of the daemon of `paths`, parsed (none when there is no file yet).
pub fn node_events(paths: &Paths) -> Vec<serde_json::Value> {
    std::fs::read_to_string(paths.state.join("events.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

impl Drop for Home {
    fn drop(&mut self) {
        if let Some(pid) = daemon::lock_holder(&self.paths) {
            send(pid, Signal::KILL);
        }
        for dir in RunDir::list(&self.paths.state).unwrap_or_default() {
            if let Ok(Some(rec)) = dir.read_pid() {
                if adopt::is_alive(&rec) {
                    let _ = signal::to_group(rec.pid, signal::Sig::Kill);
                }
            }
        }
    }
}

/// A daemon the test started; SIGTERM then SIGKILL when dropped.
pub struct DaemonProc {
    pub child: Option<Child>,
}

impl DaemonProc {
    /// The daemon `child` just started, once it answers on `paths` (at most 20 s). If it exits
    /// first the test fails naming `what`, with its stderr when that was piped.
    pub fn answering(child: Child, paths: &Paths, what: &str) -> DaemonProc {
        let mut d = DaemonProc { child: Some(child) };
        poll(
            &format!("{what} to answer"),
            Duration::from_secs(20),
            Duration::from_millis(20),
            || {
                if Client::connect(paths).is_ok() {
                    return Ok(());
                }
                if let Some(status) = d.child.as_mut().unwrap().try_wait().unwrap() {
                    let out = d.child.take().unwrap().wait_with_output().unwrap();
                    panic!(
                        "{what} exited at once ({status}): {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
                Err(String::new())
            },
        );
        d
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Send `sig` and wait (at most 10 s) for the daemon to exit; its exit status and stderr.
    pub fn signal_and_wait(&mut self, sig: Signal) -> (std::process::ExitStatus, String) {
        let child = self.child.take().expect("still running");
        send(child.id(), sig);
        let out = finish(
            child,
            &format!("the daemon, sent {sig:?},"),
            Duration::from_secs(10),
        );
        (
            out.status,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

impl Drop for DaemonProc {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            send(child.id(), Signal::TERM);
            let deadline = Instant::now() + Duration::from_secs(3);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A raw connection: frames in and out by hand.
pub struct Raw {
    pub reader: BufReader<UnixStream>,
    pub writer: UnixStream,
}

impl Raw {
    pub fn connect(socket: &Path) -> Raw {
        let s = UnixStream::connect(socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Raw {
            reader: BufReader::new(s.try_clone().unwrap()),
            writer: s,
        }
    }

    /// Write bytes; an error (the daemon closed on us) is returned, not a panic.
    pub fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.writer.write_all(bytes)
    }

    /// The next frame as JSON, or None at the end of the stream.
    pub fn recv(&mut self) -> Option<serde_json::Value> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => None,
            Ok(_) => Some(serde_json::from_str(&line).unwrap()),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => None,
            Err(e) => panic!("reading a frame: {e}"),
        }
    }

    pub fn hello(&mut self) -> serde_json::Value {
        self.send(b"{\"id\":1,\"type\":\"hello\",\"version\":1,\"client\":\"test\"}\n")
            .unwrap();
        self.recv().expect("a welcome")
    }
}

/// A shell loop that prints 1, 2, 3, … every `ms` milliseconds, forever.
pub fn counter_script(ms: u32) -> String {
    format!(
        "i=0; while true; do i=$((i+1)); echo $i; sleep {}; done",
        ms as f64 / 1000.0
    )
}

/// The numbers a counter printed, checked to be 1..=n with none missing; returns n.
pub fn counted(log: &Path) -> usize {
    let text = std::fs::read_to_string(log).unwrap();
    let nums: Vec<usize> = text
        .lines()
        .map(|l| l.parse().unwrap_or_else(|_| panic!("bad line {l:?}")))
        .collect();
    for (i, n) in nums.iter().enumerate() {
        assert_eq!(
            *n,
            i + 1,
            "line {} of {} is {n}: a line was lost",
            i + 1,
            log.display()
        );
    }
    nums.len()
}

/// Every GPU's power limit now, watts, as the daemon's `power` answer gives it.
pub fn power_caps(c: &Client) -> Vec<f64> {
    let gpupilot::protocol::Response::Power { gpus, .. } =
        c.request(gpupilot::protocol::Request::Power {}).unwrap()
    else {
        panic!("power answered otherwise")
    };
    gpus.iter().map(|g| g.power.unwrap().current_w).collect()
}
