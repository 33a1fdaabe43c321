//! The supervisor's side of `launcher = "slurm"` against stand-in Slurm commands (`sbatch`,
//! `squeue`, `scontrol`, `scancel`, `sacct` as small scripts on the run's PATH), so that it is
//! tested on machines without Slurm too: submission, states and nodes from `squeue --json`, the
//! end and its exit code, stop through `scancel`, and adoption from `slurm.json`.
//! `tests/slurm.rs` does the same against a real Slurm.

use std::time::Duration;

use crate::support::wait::poll;
use crate::support::write_exec;
use gpupilot::profile;
use gpupilot::supervisor::{Caller, LaunchOptions, Run, RunStatus, SystemClock};

/// A temp dir with `bin/` (the stand-ins) and `fake/` (what they read and write).
struct Fake {
    dir: tempfile::TempDir,
}

impl Fake {
    fn new() -> Fake {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        let fake = dir.path().join("fake");
        std::fs::create_dir(&bin).unwrap();
        std::fs::create_dir(&fake).unwrap();
        let f = fake.display();
        write_exec(
            &bin.join("sbatch"),
            &format!("#!/bin/sh\necho \"$@\" > {f}/sbatch.args\necho '77;cluster'\n"),
        );
        write_exec(
            &bin.join("squeue"),
            &format!(
                "#!/bin/sh\ncase \"$*\" in *--json*) cat {f}/squeue.json;; \
                 *) echo 'squeue: unrecognized option' >&2; exit 1;; esac\n"
            ),
        );
        write_exec(
            &bin.join("scontrol"),
            "#!/bin/sh\nif [ \"$1 $2\" = 'show hostnames' ]; then \
             [ \"$3\" = 'n[1-2]' ] && { echo n1; echo n2; exit 0; }; echo \"$3\"; exit 0; fi\n\
             echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1\n",
        );
        write_exec(
            &bin.join("scancel"),
            &format!("#!/bin/sh\necho \"$@\" >> {f}/scancel.log\n"),
        );
        write_exec(
            &bin.join("sacct"),
            "#!/bin/sh\necho 'Slurm accounting storage is disabled' >&2; exit 1\n",
        );
        Fake { dir }
    }

    fn caller(&self) -> Caller {
        let path = format!("{}:/usr/bin:/bin", self.dir.path().join("bin").display());
        Caller {
            cwd: self.dir.path().to_path_buf(),
            env: [("PATH".to_string(), path)].into(),
        }
    }

    /// What `squeue --json` says of job 77 from now on.
    fn job(&self, state: &str, nodes: &str, exit_status: i32) {
        std::fs::write(
            self.dir.path().join("fake/squeue.json"),
            format!(
                r#"{{"jobs":[{{"job_id":77,"job_state":"{state}","nodes":"{nodes}","exit_code":{exit_status}}}]}}"#
            ),
        )
        .unwrap();
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join("fake").join(name)).unwrap_or_default()
    }

    fn start(&self) -> Run {
        let p = profile::parse_str(
            "s.toml",
            "name = \"fake\"\n[run]\nlauncher = \"slurm\"\ncommand = [\"train.py\", \"--lr\", \"0.1\"]\n\
             [run.slurm]\nnodes = 2\ngpus_per_node = 4\npartition = \"gpu\"\n",
        )
        .unwrap();
        let state = self.dir.path().join("state");
        Run::start_new(
            &state,
            &p,
            &self.caller(),
            &LaunchOptions::default(),
            &SystemClock,
        )
        .unwrap()
    }
}

/// Poll until `cond` holds (at most 10 s of real time).
fn poll_until(run: &mut Run, what: &str, mut cond: impl FnMut(&Run) -> bool) {
    poll(
        what,
        Duration::from_secs(10),
        Duration::from_millis(20),
        || {
            if cond(run) {
                return Ok(());
            }
            let state = format!(": {:?} {:?}", run.summary(), run.slurm_job());
            run.poll(&SystemClock).unwrap();
            Err(state)
        },
    );
}

#[test]
fn a_job_is_submitted_watched_and_ends() {
    let fake = Fake::new();
    fake.job("PENDING", "", 0);
    let mut run = fake.start();
    assert_eq!(run.status(), RunStatus::Running);
    assert_eq!(run.pid(), None);
    let job = run.slurm_job().unwrap().clone();
    assert_eq!(job.job_id, "77");
    assert!(fake.read("sbatch.args").starts_with("--parsable "));
    let script = std::fs::read_to_string(run.dir().path().join("job.sh")).unwrap();
    assert!(script.contains("#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gpus-per-node=4\n#SBATCH --partition=gpu\n"), "{script}");
    assert!(
        script.contains("--nproc_per_node 4 --rdzv_backend c10d"),
        "{script}"
    );

    fake.job("RUNNING", "n[1-2]", 0);
    poll_until(&mut run, "the job to run", |r| {
        r.slurm_job().unwrap().state.as_deref() == Some("RUNNING")
    });
    assert_eq!(run.slurm_job().unwrap().nodes, ["n1", "n2"]);
    let on_disk: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.dir().path().join("slurm.json")).unwrap())
            .unwrap();
    assert_eq!(on_disk["nodes"], serde_json::json!(["n1", "n2"]));

    // Adopted by another supervisor while it runs.
    let mut adopted = Run::adopt(run.dir().clone(), &SystemClock);
    assert_eq!(adopted.status(), RunStatus::Running);
    assert_eq!(adopted.slurm_job().unwrap().job_id, "77");

    fake.job("FAILED", "n[1-2]", 3 << 8);
    poll_until(&mut adopted, "the job to end", |r| r.is_finished());
    assert_eq!(adopted.status(), RunStatus::Failed);
    assert_eq!(adopted.summary().exit_code, Some(3));
    let events = std::fs::read_to_string(adopted.dir().events_path()).unwrap();
    assert!(events.contains("\"event\":\"submitted\""), "{events}");
    assert!(events.contains("\"event\":\"adopted_job\""), "{events}");
}

#[test]
fn stop_signals_then_cancels() {
    let fake = Fake::new();
    fake.job("RUNNING", "n1", 0);
    let mut run = fake.start();
    poll_until(&mut run, "the job to run", |r| {
        r.slurm_job().unwrap().state.as_deref() == Some("RUNNING")
    });
    run.stop(Duration::from_millis(300), &SystemClock).unwrap();
    assert_eq!(run.status(), RunStatus::Stopping);
    assert_eq!(fake.read("scancel.log"), "--signal=TERM 77\n");
    // The job ignores SIGTERM: after the grace period, scancel.
    poll_until(&mut run, "scancel", |_| {
        fake.read("scancel.log").lines().count() == 2
    });
    assert_eq!(fake.read("scancel.log"), "--signal=TERM 77\n77\n");
    fake.job("CANCELLED", "n1", 9);
    poll_until(&mut run, "the end", |r| r.is_finished());
    assert_eq!(run.status(), RunStatus::Stopped);
    assert_eq!(run.summary().signal_name.as_deref(), Some("SIGKILL"));

    // A job Slurm forgot (no accounting) while no supervisor watched: unknown.
    let fake = Fake::new();
    fake.job("RUNNING", "n1", 0);
    let run = fake.start();
    let dir = run.dir().clone();
    drop(run);
    std::fs::write(fake.dir.path().join("fake/squeue.json"), r#"{"jobs":[]}"#).unwrap();
    let adopted = Run::adopt(dir, &SystemClock);
    assert_eq!(adopted.status(), RunStatus::Unknown);
}
