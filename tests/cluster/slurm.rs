//! `launcher = "slurm"` against a real single-node Slurm: munged, slurmctld and slurmd
//! (Debian's packages) started by the test as root on localhost with a minimal configuration
//! in a temporary directory, then a daemon in a temporary GPUPILOT_HOME that submits profiles
//! through `sbatch`, follows them with `squeue`, and stops them with `scancel`.
//!
//! torchrun is replaced by a stand-in script (the profile's `program`) that prints the
//! arguments and rendezvous it was given and then runs the command, so no PyTorch is needed;
//! everything else (`sbatch`, `srun`, `scontrol show hostnames`, the job's output files) is
//! Slurm's own.
//!
//! Needs root and the packages (`.ci/run` installs them); without them the test passes with a
//! printed reason, unless GPUPILOT_REQUIRE_PEERS=1 (CI), where it fails.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::home::Home;
use crate::support::json;
use crate::support::net::free_port;
use crate::support::proc::send;
use crate::support::wait::wait_for;
use crate::support::write_exec;
use rustix::process::Signal;

const PROGRAMS: [&str; 8] = [
    "/usr/sbin/munged",
    "/usr/sbin/slurmctld",
    "/usr/sbin/slurmd",
    "/usr/bin/sbatch",
    "/usr/bin/squeue",
    "/usr/bin/scancel",
    "/usr/bin/scontrol",
    "/usr/bin/srun",
];

/// Why the test cannot run here, if it cannot.
fn missing() -> Option<String> {
    if let Some(p) = PROGRAMS.iter().find(|p| !Path::new(p).exists()) {
        return Some(format!(
            "{p} is not installed (apt-get install slurmctld slurmd slurm-client munge; .ci/run does it)"
        ));
    }
    if !rustix::process::geteuid().is_root() {
        return Some(
            "slurmd and munged must run as root for this test (run it as root, as CI does)".into(),
        );
    }
    None
}

fn required() -> bool {
    if let Some(why) = missing() {
        crate::support::peers::missing(&format!("a local Slurm: {why}"));
        return false;
    }
    true
}

/// munged, slurmctld and slurmd in a temporary directory; everything is cancelled and killed
/// when dropped.
struct Slurm {
    dir: tempfile::TempDir,
    conf: PathBuf,
    daemons: Vec<(&'static str, Child)>,
}

impl Slurm {
    fn start() -> Slurm {
        let dir = tempfile::Builder::new().prefix("gps").tempdir().unwrap();
        let d = dir.path();
        for sub in ["munge", "state", "spool", "log"] {
            std::fs::create_dir(d.join(sub)).unwrap();
            std::fs::set_permissions(d.join(sub), std::fs::Permissions::from_mode(0o700)).unwrap();
        }
        let key = d.join("munge/munge.key");
        let mut random = vec![0u8; 1024];
        use std::io::Read;
        std::fs::File::open("/dev/urandom")
            .unwrap()
            .read_exact(&mut random)
            .unwrap();
        std::fs::write(&key, &random).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o400)).unwrap();
        let socket = d.join("munge/munge.socket.2");
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let conf = d.join("slurm.conf");
        let p = |sub: &str| d.join(sub).display().to_string();
        std::fs::write(
            &conf,
            format!(
                "ClusterName=gpupilot-test\n\
                 SlurmctldHost=localhost(127.0.0.1)\n\
                 SlurmctldPort={ctld}\n\
                 SlurmdPort={slurmd}\n\
                 SlurmUser=root\n\
                 SlurmdUser=root\n\
                 AuthType=auth/munge\n\
                 CredType=cred/munge\n\
                 AuthInfo=socket={socket}\n\
                 StateSaveLocation={state}\n\
                 SlurmdSpoolDir={spool}\n\
                 SlurmctldPidFile={pid_ctld}\n\
                 SlurmdPidFile={pid_d}\n\
                 ProctrackType=proctrack/linuxproc\n\
                 TaskPlugin=task/none\n\
                 SelectType=select/cons_tres\n\
                 SelectTypeParameters=CR_Core\n\
                 MpiDefault=none\n\
                 JobAcctGatherType=jobacct_gather/none\n\
                 AccountingStorageType=accounting_storage/none\n\
                 SchedulerType=sched/builtin\n\
                 ReturnToService=2\n\
                 KillWait=5\n\
                 MinJobAge=300\n\
                 NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN\n\
                 PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP\n",
                ctld = free_port(),
                slurmd = free_port(),
                socket = socket.display(),
                state = p("state"),
                spool = p("spool"),
                pid_ctld = p("log/slurmctld.pid"),
                pid_d = p("log/slurmd.pid"),
            ),
        )
        .unwrap();
        let mut slurm = Slurm {
            conf,
            daemons: Vec::new(),
            dir,
        };
        let d = slurm.dir.path().to_path_buf();
        slurm.spawn(
            "munged",
            Command::new("/usr/sbin/munged").args([
                "--foreground",
                "--force",
                &format!("--key-file={}", key.display()),
                &format!("--socket={}", socket.display()),
                &format!("--log-file={}", d.join("log/munged.log").display()),
                &format!("--pid-file={}", d.join("munge/munged.pid").display()),
                &format!("--seed-file={}", d.join("munge/seed").display()),
            ]),
        );
        slurm.wait_up("munged's socket", |_| socket.exists());
        let conf_arg = slurm.conf.display().to_string();
        slurm.spawn(
            "slurmctld",
            Command::new("/usr/sbin/slurmctld").args(["-D", "-i", "-f", &conf_arg]),
        );
        slurm.spawn(
            "slurmd",
            Command::new("/usr/sbin/slurmd").args(["-D", "-N", "localhost", "-f", &conf_arg]),
        );
        slurm.wait_up("the node to be idle in sinfo", |slurm| {
            let out = slurm.client(&["sinfo", "-h", "-n", "localhost", "-o", "%t"]);
            String::from_utf8_lossy(&out.stdout).trim() == "idle"
        });
        slurm
    }

    fn spawn(&mut self, name: &'static str, cmd: &mut Command) -> u32 {
        let log = std::fs::File::create(self.dir.path().join(format!("log/{name}.out"))).unwrap();
        let child = cmd
            .env("SLURM_CONF", &self.conf)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        let pid = child.id();
        self.daemons.push((name, child));
        pid
    }

    /// Wait (at most 60 s) for `cond`; on timeout, or when a daemon exits, fail with the
    /// daemons' logs.
    fn wait_up(&mut self, what: &str, mut cond: impl FnMut(&Slurm) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !cond(self) {
            let mut exited = None;
            for (name, child) in &mut self.daemons {
                if let Some(status) = child.try_wait().unwrap() {
                    exited = Some(format!("{name} exited ({status})"));
                }
            }
            if let Some(e) = exited {
                panic!("{e} while waiting for {what}:\n{}", self.logs());
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn logs(&self) -> String {
        let mut all = String::new();
        for name in ["munged", "slurmctld", "slurmd"] {
            let text = std::fs::read_to_string(self.dir.path().join(format!("log/{name}.out")))
                .unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            all.push_str(&format!("--- {name}\n"));
            for l in tail.iter().rev() {
                all.push_str(l);
                all.push('\n');
            }
        }
        all
    }

    /// A Slurm client command against this cluster, at most 20 s.
    fn client(&self, args: &[&str]) -> Output {
        let mut child = Command::new(args[0])
            .args(&args[1..])
            .env("SLURM_CONF", &self.conf)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while child.try_wait().unwrap().is_none() {
            if Instant::now() >= deadline {
                let _ = child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child.wait_with_output().unwrap()
    }

    /// `squeue`'s state for `job` (empty once it is gone).
    fn job_state(&self, job: &str) -> String {
        let out = self.client(&["squeue", "-h", "--states=all", "-j", job, "-o", "%T"]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        // Cancel whatever is left, give the steps a moment to go, then stop the daemons.
        let _ = self.client(&["scancel", "--user=root"]);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let out = self.client(&["squeue", "-h", "-o", "%i"]);
            if !out.status.success() || out.stdout.iter().all(u8::is_ascii_whitespace) {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        for (_, child) in self.daemons.iter_mut().rev() {
            send(child.id(), Signal::TERM);
            let deadline = Instant::now() + Duration::from_secs(5);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `gpupilot ARGS…` as a user of this cluster (SLURM_CONF set), which must succeed.
fn gp(home: &Home, slurm: &Slurm, args: &[&str]) -> String {
    let out = home
        .gpupilot(args)
        .env("SLURM_CONF", &slurm.conf)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "gpupilot {args:?} failed ({})\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn run_info(home: &Home, id: &str) -> serde_json::Value {
    let ps = json(&home.ok(&["ps", "--json"]));
    ps.as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == id)
        .unwrap_or_else(|| panic!("{id} not in ps: {ps}"))
        .clone()
}

/// The profile of a Slurm run of `work.sh STEPS EXIT`.
fn profile(dir: &Path, name: &str, steps: u32, exit: i32) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    let d = dir.display();
    std::fs::write(
        &path,
        format!(
            "name = \"{name}\"\n\
             [run]\n\
             launcher = \"slurm\"\n\
             command = [\"{d}/work.sh\", \"{steps}\", \"{exit}\"]\n\
             cwd = \"{d}\"\n\
             [run.slurm]\n\
             nodes = 1\n\
             gpus_per_node = 0\n\
             partition = \"debug\"\n\
             time_limit = \"00:10:00\"\n\
             sbatch_args = [\"--cpus-per-task=1\"]\n\
             program = [\"{d}/fake-torchrun\"]\n"
        ),
    )
    .unwrap();
    path
}

#[test]
fn slurm_runs_finish_and_stop_and_are_adopted() {
    if !required() {
        return;
    }
    let slurm = Slurm::start();
    let home = Home::new();
    let work = home.dir.path();
    // torchrun's stand-in: says what it was asked, then runs the script.
    write_exec(
        &work.join("fake-torchrun"),
        "#!/bin/sh\n\
         echo \"torchrun $*\"\n\
         while [ $# -gt 0 ]; do\n\
           case \"$1\" in\n\
             --nnodes) nnodes=$2; shift 2;;\n\
             --nproc_per_node) nproc=$2; shift 2;;\n\
             --rdzv_backend) backend=$2; shift 2;;\n\
             --rdzv_endpoint) endpoint=$2; shift 2;;\n\
             --rdzv_id) id=$2; shift 2;;\n\
             --*) shift;;\n\
             *) break;;\n\
           esac\n\
         done\n\
         echo \"rendezvous backend=$backend endpoint=$endpoint id=$id nnodes=$nnodes nproc=$nproc\"\n\
         exec \"$@\"\n",
    );
    write_exec(
        &work.join("work.sh"),
        "#!/bin/sh\n\
         trap 'echo \"got SIGTERM at step $i\"; exit 143' TERM\n\
         i=0\n\
         while [ $i -lt $1 ]; do i=$((i+1)); echo \"step $i on $(hostname) job $SLURM_JOB_ID\"; sleep 1; done\n\
         echo done >&2\n\
         exit $2\n",
    );
    let _d = home.daemon(&[]);

    // A short run: submitted, running, then succeeded, its output in the run's logs.
    let short = profile(work, "slurm-short", 3, 0);
    let id = gp(&home, &slurm, &["run", "--detach", short.to_str().unwrap()])
        .trim()
        .to_string();
    // …and one that fails, next to it.
    let failing = profile(work, "slurm-fail", 1, 3);
    let failed_id = gp(
        &home,
        &slurm,
        &["run", "--detach", failing.to_str().unwrap()],
    )
    .trim()
    .to_string();
    let info = run_info(&home, &id);
    let job = info["slurm"]["job_id"]
        .as_str()
        .expect("a job id")
        .to_string();
    assert!(info["pid"].is_null(), "{info}");
    assert_eq!(info["command"][0], "srun", "{info}");
    wait_for("the short job to run", Duration::from_secs(60), || {
        let i = run_info(&home, &id);
        i["slurm"]["state"] == "RUNNING" || i["status"] != "running"
    });
    let running = run_info(&home, &id);
    assert_eq!(running["status"], "running", "{running}");
    assert_eq!(running["slurm"]["nodes"], serde_json::json!(["localhost"]));
    wait_for("the short run to end", Duration::from_secs(60), || {
        run_info(&home, &id)["status"] != "running"
    });
    let done = run_info(&home, &id);
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(done["exit_code"], 0, "{done}");
    assert_eq!(done["slurm"]["state"], "COMPLETED", "{done}");
    let dir = home.run_dir(&id);
    let out = std::fs::read_to_string(dir.stdout_path()).unwrap();
    assert!(
        out.contains(&format!(
            "rendezvous backend=c10d endpoint=localhost:29500 id={job} nnodes=1 nproc=1"
        )),
        "{out}"
    );
    for i in 1..=3 {
        assert!(
            out.contains(&format!("step {i} on ")) && out.contains(&format!("job {job}")),
            "{out}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(dir.stderr_path()).unwrap().trim(),
        "done"
    );
    wait_for("the failing run to end", Duration::from_secs(60), || {
        run_info(&home, &failed_id)["status"] != "running"
    });
    let failed = run_info(&home, &failed_id);
    assert_eq!(failed["status"], "failed", "{failed}");
    assert_eq!(failed["exit_code"], 3, "{failed}");
    assert_eq!(failed["slurm"]["state"], "FAILED", "{failed}");
    let logs = home.ok(&["logs", &id]);
    assert!(logs.contains("step 3 on "), "{logs}");
    let script = std::fs::read_to_string(dir.path().join("job.sh")).unwrap();
    assert!(script.contains("#SBATCH --partition=debug"), "{script}");
    let events = std::fs::read_to_string(dir.events_path()).unwrap();
    assert!(
        events.contains(&format!(
            "\"event\":\"submitted\",\"attempt\":0,\"job_id\":\"{job}\""
        )),
        "{events}"
    );

    // A long run: adopted by a new daemon from slurm.json, then stopped with scancel.
    let long = profile(work, "slurm-long", 600, 0);
    let id = gp(&home, &slurm, &["run", "--detach", long.to_str().unwrap()])
        .trim()
        .to_string();
    let job = run_info(&home, &id)["slurm"]["job_id"]
        .as_str()
        .unwrap()
        .to_string();
    let dir = home.run_dir(&id);
    wait_for("the long job's first step", Duration::from_secs(60), || {
        std::fs::read_to_string(dir.stdout_path()).is_ok_and(|t| t.contains("step 1 "))
    });
    drop(_d);
    assert_eq!(
        slurm.job_state(&job),
        "RUNNING",
        "the job outlives the daemon"
    );
    let _d = home.daemon(&[]);
    let adopted = run_info(&home, &id);
    assert_eq!(adopted["status"], "running", "{adopted}");
    assert_eq!(adopted["adopted"], true, "{adopted}");
    assert_eq!(adopted["slurm"]["job_id"], job.as_str(), "{adopted}");

    let stopped = gp(&home, &slurm, &["stop", &id]);
    // SIGTERM reached the script first (its trap exits 143), as the grace period intends.
    assert_eq!(stopped.trim(), format!("{id}: stopped: exit 143"));
    let out = std::fs::read_to_string(dir.stdout_path()).unwrap();
    assert!(out.contains("got SIGTERM at step "), "{out}");
    assert!(stopped.contains(": stopped"), "{stopped}");
    let info = run_info(&home, &id);
    assert_eq!(info["status"], "stopped", "{info}");
    wait_for("Slurm to end the job", Duration::from_secs(30), || {
        let state = slurm.job_state(&job);
        state.is_empty() || ["CANCELLED", "FAILED", "COMPLETED"].contains(&state.as_str())
    });
    let events = std::fs::read_to_string(dir.events_path()).unwrap();
    assert!(events.contains("\"event\":\"adopted_job\""), "{events}");
    assert!(events.contains("\"event\":\"stop_requested\""), "{events}");
}
