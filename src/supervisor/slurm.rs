//! Runs that are Slurm batch jobs (`launcher = "slurm"`, see `docs/slurm.md`).
//!
//! Such a run has no local process: each attempt is a job submitted with `sbatch --parsable`
//! from a script written into the run directory (`job.sh`), which runs
//! `srun torchrun … --rdzv_backend c10d --rdzv_endpoint FIRST_NODE:PORT … SCRIPT ARGS…` with
//! its output appended to the run's `stdout.log` and `stderr.log`. The job id and what is known
//! of the job (state, nodes) live in `slurm.json`, so a new daemon can adopt the run.
//!
//! The job is watched with `squeue --json` (22.05 and later; `squeue -h -o %T|%N` when that
//! is not supported); once it has left the queue, its exit comes from `squeue` while the
//! controller still remembers it, else `scontrol show job`, else `sacct` where accounting is
//! enabled, else it is unknown. `stop` is `scancel --signal=TERM` (to the job's steps), then
//! `scancel` when the grace period is over; pause and resume are `scontrol suspend` /
//! `scontrol resume`.
//!
//! Every Slurm command runs with the run's environment (the caller's, which names the
//! cluster through `PATH` and `SLURM_CONF`) and a time limit, so a hung controller cannot
//! hang the daemon.

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::events::ExitInfo;
use super::launch::LaunchPlan;
use super::rundir::RunDir;
use super::signal;
use crate::profile::SlurmSpec;

/// The job's file in the run directory.
pub const JOB_FILE: &str = "slurm.json";
/// The batch script in the run directory.
pub const SCRIPT_FILE: &str = "job.sh";

/// Words of the `srun` line that the job's shell expands (everything else is quoted).
pub const NNODES_WORD: &str = "$SLURM_NNODES";
pub const JOB_ID_WORD: &str = "$SLURM_JOB_ID";
const HEAD_VAR: &str = "GPUPILOT_RDZV_HOST";

/// How often a job's state is asked for.
pub const POLL_EVERY: Duration = Duration::from_secs(1);
/// The longest a Slurm command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(20);

/// The job behind a run's current attempt (`slurm.json`; also in `ps --json` as `slurm`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlurmJob {
    pub job_id: String,
    /// The attempt this job is.
    pub attempt: u32,
    /// Slurm's state as last seen: `PENDING`, `RUNNING`, `COMPLETED`, `CANCELLED`, …
    #[serde(default)]
    pub state: Option<String>,
    /// The job's nodes, one name each (empty while it is pending).
    #[serde(default)]
    pub nodes: Vec<String>,
    #[serde(default)]
    pub partition: Option<String>,
}

impl SlurmJob {
    pub fn path(dir: &RunDir) -> PathBuf {
        dir.path().join(JOB_FILE)
    }

    pub fn write(&self, dir: &RunDir) -> io::Result<()> {
        let mut json = serde_json::to_vec_pretty(self).map_err(io::Error::other)?;
        json.push(b'\n');
        crate::config::safe_fs::write_atomic(&SlurmJob::path(dir), &json)
    }

    /// The run directory's job, or None when it has none (yet).
    pub fn read(dir: &RunDir) -> io::Result<Option<SlurmJob>> {
        // Bounded (a job of thousands of nodes is well under it), never through a link.
        match crate::config::safe_fs::read_capped(&SlurmJob::path(dir), 4 << 20) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: {e}", SlurmJob::path(dir).display()),
                )
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// `srun torchrun --nnodes $SLURM_NNODES --nproc_per_node G --rdzv_backend c10d
/// --rdzv_endpoint $HEAD:PORT --rdzv_id $SLURM_JOB_ID [args…] SCRIPT ARGS…`: the line the job
/// script runs (three words expanded by its shell, see [`job_script`]).
pub fn srun_argv(spec: &SlurmSpec, script_and_args: &[String]) -> Vec<String> {
    let mut argv = vec!["srun".to_string()];
    argv.extend(spec.program.iter().cloned());
    argv.extend([
        "--nnodes".into(),
        NNODES_WORD.into(),
        "--nproc_per_node".into(),
        spec.nproc_per_node.to_string(),
        "--rdzv_backend".into(),
        "c10d".into(),
        "--rdzv_endpoint".into(),
        endpoint_word(spec),
        "--rdzv_id".into(),
        JOB_ID_WORD.into(),
    ]);
    argv.extend(spec.args.iter().cloned());
    argv.extend(script_and_args.iter().cloned());
    argv
}

fn endpoint_word(spec: &SlurmSpec) -> String {
    format!("${{{HEAD_VAR}}}:{}", spec.rdzv_port)
}

/// A word of the srun line for the script: the generated Slurm words in double quotes (the
/// shell expands them), everything else quoted literally.
fn script_word(spec: &SlurmSpec, word: &str) -> String {
    if word == NNODES_WORD || word == JOB_ID_WORD || word == endpoint_word(spec) {
        format!("\"{word}\"")
    } else {
        shell_words::quote(word).into_owned()
    }
}

/// The batch script for `argv` (an [`srun_argv`] line, knob values filled in).
pub fn job_script(
    spec: &SlurmSpec,
    argv: &[String],
    cwd: &Path,
    run_id: &str,
    dir: &RunDir,
) -> String {
    let mut s = String::from("#!/bin/bash\n");
    s.push_str("# Written by gpupilot for run ");
    s.push_str(run_id);
    s.push_str("; submitted with `sbatch --parsable job.sh`.\n");
    let mut opt = |line: String| {
        s.push_str("#SBATCH ");
        s.push_str(&line);
        s.push('\n');
    };
    opt(format!("--job-name=gpupilot-{run_id}"));
    opt(format!("--nodes={}", spec.nodes));
    opt("--ntasks-per-node=1".into());
    if spec.gpus_per_node > 0 {
        opt(format!("--gpus-per-node={}", spec.gpus_per_node));
    }
    if let Some(p) = &spec.partition {
        opt(format!("--partition={p}"));
    }
    if let Some(t) = &spec.time_limit {
        opt(format!("--time={t}"));
    }
    if let Some(a) = &spec.account {
        opt(format!("--account={a}"));
    }
    opt(format!("--chdir={}", cwd.display()));
    opt(format!("--output={}", dir.stdout_path().display()));
    opt(format!("--error={}", dir.stderr_path().display()));
    opt("--open-mode=append".into());
    for a in &spec.sbatch_args {
        opt(a.clone());
    }
    s.push_str(&format!(
        "\n# The c10d rendezvous runs on the job's first node.\n\
         {HEAD_VAR}=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1)\n\
         export {HEAD_VAR}\n"
    ));
    s.push_str(NODE_SETUP);
    s.push_str("exec");
    for (i, w) in argv.iter().enumerate() {
        s.push(' ');
        s.push_str(&script_word(spec, w));
        // Each node's task runs the setup first, then torchrun in its place.
        if i == 0 && w == "srun" {
            s.push_str(&format!(" /bin/sh -c \"${NODE_SETUP_VAR}\" gpupilot-node"));
        }
    }
    s.push('\n');
    s
}

/// The variable of the job script that holds [`NODE_SETUP`]'s commands.
const NODE_SETUP_VAR: &str = "GPUPILOT_NODE_SETUP";

/// What each node's task does before torchrun (`sh -c "$GPUPILOT_NODE_SETUP" gpupilot-node
/// torchrun …`). A rank on a node other than the run's (`GPUPILOT_RUN_NODE`, the node whose
/// daemon submitted the job) attaches through a daemon of its own node, which relays it to the
/// run's daemon over SSH (`daemon::relay`). So on such a node, unless the job names one
/// (`GPUPILOT_NODE_SOCKET`), the task starts the user's daemon in a home of the node's own
/// (`/tmp`: a home directory shared by the nodes would have that daemon adopt the login node's
/// runs), which `--detach` does only where none runs yet, and points the ranks at it.
const NODE_SETUP: &str = r#"
# Ranks on nodes other than the run's reach its trainer channel through a gpupilot daemon of
# their own node, which relays them to the run's daemon over SSH (docs/slurm.md).
GPUPILOT_NODE_SETUP='if [ -n "$GPUPILOT_RUN_NODE" ] && [ -z "$GPUPILOT_NODE_SOCKET" ] &&
    [ "${GPUPILOT_NODE_NAME:-$(uname -n)}" != "$GPUPILOT_RUN_NODE" ] && command -v gpupilot >/dev/null; then
  GPUPILOT_HOME=/tmp/gpupilot-node-$(id -u) gpupilot daemon --detach >/dev/null 2>&1
  export GPUPILOT_NODE_SOCKET=/tmp/gpupilot-node-$(id -u)/run/daemon.sock
fi
exec "$@"'
"#;

/// Write the job script for `plan` into the run directory and submit it; the job.
pub fn submit(
    spec: &SlurmSpec,
    plan: &LaunchPlan,
    argv: &[String],
    dir: &RunDir,
    attempt: u32,
) -> io::Result<SlurmJob> {
    let script = dir.path().join(SCRIPT_FILE);
    let body = job_script(spec, argv, &plan.cwd, dir.id(), dir);
    crate::config::safe_fs::write_atomic(&script, body.as_bytes())?;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o700))?;
    let script_arg = script.display().to_string();
    let out = run(&["sbatch", "--parsable", &script_arg], &plan.env, &plan.cwd)?;
    if !out.ok {
        return Err(io::Error::other(format!(
            "sbatch refused the job: {}",
            out.stderr.trim()
        )));
    }
    // `--parsable`: `JOBID` or `JOBID;CLUSTER`.
    let job_id = out
        .stdout
        .lines()
        .next()
        .and_then(|l| l.split(';').next())
        .map(str::trim)
        .filter(|id| !id.is_empty() && id.chars().all(|c| c.is_ascii_digit() || c == '_'))
        .ok_or_else(|| {
            io::Error::other(format!("sbatch printed no job id: {:?}", out.stdout.trim()))
        })?
        .to_string();
    Ok(SlurmJob {
        job_id,
        attempt,
        state: Some("PENDING".into()),
        nodes: Vec::new(),
        partition: spec.partition.clone(),
    })
}

/// What Slurm says of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobState {
    /// Pending, running, suspended, completing…: `state`, and the node list once it has one.
    Active {
        state: String,
        nodelist: Option<String>,
    },
    /// Over: how it ended.
    Ended {
        state: String,
        exit: ExitInfo,
        nodelist: Option<String>,
    },
    /// Slurm no longer knows the job (it left the controller's memory, and there is no
    /// accounting to ask).
    Forgotten,
}

/// A job being watched: where to ask and what was last seen.
#[derive(Debug, Clone)]
pub struct Tracker {
    pub job: SlurmJob,
    env: BTreeMap<String, String>,
    cwd: PathBuf,
    last_query: Option<Instant>,
    /// `squeue --json` failed as unsupported: use the text format from then on.
    no_json: bool,
    nodelist: Option<String>,
}

impl Tracker {
    pub fn new(job: SlurmJob, plan: &LaunchPlan) -> Tracker {
        let cwd = if plan.cwd.is_dir() {
            plan.cwd.clone()
        } else {
            PathBuf::from("/")
        };
        Tracker {
            job,
            env: plan.env.clone(),
            cwd,
            last_query: None,
            no_json: false,
            nodelist: None,
        }
    }

    /// Ask Slurm now (unless asked less than [`POLL_EVERY`] ago and not `force`d). Updates the
    /// job's state and nodes; returns the state when asked, None when it was too soon. An error
    /// means Slurm could not be asked (the controller is down, say): nothing is known.
    pub fn query(&mut self, force: bool) -> io::Result<Option<JobState>> {
        if !force && self.last_query.is_some_and(|t| t.elapsed() < POLL_EVERY) {
            return Ok(None);
        }
        self.last_query = Some(Instant::now());
        let state = self.ask()?;
        let (name, nodelist) = match &state {
            JobState::Active { state, nodelist }
            | JobState::Ended {
                state, nodelist, ..
            } => (Some(state.clone()), nodelist.clone()),
            JobState::Forgotten => (self.job.state.clone(), None),
        };
        self.job.state = name;
        if let Some(list) = nodelist.filter(|l| !l.is_empty() && l != "(null)") {
            if self.nodelist.as_ref() != Some(&list) {
                self.job.nodes = self.hostnames(&list);
                self.nodelist = Some(list);
            }
        }
        Ok(Some(state))
    }

    fn ask(&mut self) -> io::Result<JobState> {
        let id = self.job.job_id.clone();
        if !self.no_json {
            let out = self.run(&["squeue", "--json", "--states=all", "--jobs", &id])?;
            if out.ok {
                if let Some(found) = parse_squeue_json(&out.stdout, &id) {
                    return Ok(match found {
                        JobState::Ended {
                            state,
                            exit,
                            nodelist,
                        } if exit.is_unknown() => JobState::Ended {
                            exit: self.exit_code(&state).unwrap_or(exit),
                            state,
                            nodelist,
                        },
                        other => other,
                    });
                }
                if serde_json::from_str::<serde_json::Value>(&out.stdout).is_ok() {
                    return self.after_queue();
                }
            } else if invalid_job(&out.stderr) {
                return self.after_queue();
            }
            // An squeue without --json (before 21.08, or built without JSON support).
            self.no_json = true;
        }
        let out = self.run(&["squeue", "-h", "--states=all", "--jobs", &id, "-o", "%T|%N"])?;
        if !out.ok {
            if invalid_job(&out.stderr) {
                return self.after_queue();
            }
            return Err(io::Error::other(format!("squeue: {}", out.stderr.trim())));
        }
        let Some(line) = out.stdout.lines().find(|l| !l.trim().is_empty()) else {
            return self.after_queue();
        };
        let (state, nodes) = line.split_once('|').unwrap_or((line, ""));
        let state = state.trim().to_string();
        let nodelist = Some(nodes.trim().to_string()).filter(|n| !n.is_empty());
        if is_final(&state) {
            let exit = self
                .exit_code(&state)
                .unwrap_or_else(|| exit_for(&state, None));
            Ok(JobState::Ended {
                state,
                exit,
                nodelist,
            })
        } else {
            Ok(JobState::Active { state, nodelist })
        }
    }

    /// The job is not in the queue any more: `scontrol show job` while the controller
    /// remembers it, else `sacct`.
    fn after_queue(&self) -> io::Result<JobState> {
        if let Some((state, code)) = self.scontrol_show() {
            return Ok(JobState::Ended {
                exit: exit_for(&state, code),
                state,
                nodelist: None,
            });
        }
        match self.sacct() {
            Some((state, code)) if is_final(&state) => Ok(JobState::Ended {
                exit: exit_for(&state, code),
                state,
                nodelist: None,
            }),
            Some((state, _)) => Ok(JobState::Active {
                state,
                nodelist: None,
            }),
            None => Ok(JobState::Forgotten),
        }
    }

    /// The exit code of an ended job from `scontrol`, or `sacct`.
    fn exit_code(&self, state: &str) -> Option<ExitInfo> {
        let code = self
            .scontrol_show()
            .and_then(|(_, c)| c)
            .or_else(|| self.sacct().and_then(|(_, c)| c))?;
        Some(exit_for(state, Some(code)))
    }

    fn scontrol_show(&self) -> Option<(String, Option<(i32, i32)>)> {
        let out = self
            .run(&["scontrol", "show", "job", &self.job.job_id])
            .ok()?;
        if !out.ok {
            return None;
        }
        let field = |name: &str| {
            out.stdout
                .split_whitespace()
                .find_map(|w| w.strip_prefix(name))
                .map(str::to_string)
        };
        let state = field("JobState=")?;
        if !is_final(&state) {
            return None;
        }
        Some((state, field("ExitCode=").and_then(|c| parse_code(&c))))
    }

    fn sacct(&self) -> Option<(String, Option<(i32, i32)>)> {
        let out = self
            .run(&[
                "sacct",
                "-j",
                &self.job.job_id,
                "-X",
                "-n",
                "-P",
                "-o",
                "State,ExitCode",
            ])
            .ok()?;
        if !out.ok {
            return None;
        }
        let line = out.stdout.lines().find(|l| !l.trim().is_empty())?;
        let (state, code) = line.split_once('|')?;
        // `CANCELLED by 1000`
        let state = state.split_whitespace().next()?.to_string();
        Some((state, parse_code(code.trim())))
    }

    /// `scontrol show hostnames LIST`, or the list split at commas when that fails.
    fn hostnames(&self, list: &str) -> Vec<String> {
        match self.run(&["scontrol", "show", "hostnames", list]) {
            Ok(out) if out.ok => out
                .stdout
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_string)
                .collect(),
            _ => list.split(',').map(str::to_string).collect(),
        }
    }

    /// `scancel`: with a signal (`TERM`), to every step of the job (torchrun under `srun`, which
    /// passes it to its workers; the batch script then ends when `srun` does); without one,
    /// cancel the job.
    pub fn cancel(&self, signal: Option<&str>) -> io::Result<()> {
        let id = self.job.job_id.as_str();
        let pending = self.job.state.as_deref() == Some("PENDING");
        let flag = signal.map(|s| format!("--signal={s}"));
        let args: Vec<&str> = match &flag {
            // A pending job has nothing to signal: cancel it.
            Some(f) if !pending => vec!["scancel", f, id],
            _ => vec!["scancel", id],
        };
        let out = self.run(&args)?;
        if out.ok || already_over(&out.stderr) {
            return Ok(());
        }
        if signal.is_some() && !pending {
            // Signals can fail on a job that is still starting: cancel it instead.
            let out = self.run(&["scancel", id])?;
            if out.ok || already_over(&out.stderr) {
                return Ok(());
            }
            return Err(io::Error::other(format!(
                "scancel {id}: {}",
                out.stderr.trim()
            )));
        }
        Err(io::Error::other(format!(
            "scancel {id}: {}",
            out.stderr.trim()
        )))
    }

    /// `scontrol suspend` / `scontrol resume` (needs a Slurm operator or root).
    pub fn suspend(&self, suspend: bool) -> io::Result<()> {
        let verb = if suspend { "suspend" } else { "resume" };
        let out = self.run(&["scontrol", verb, &self.job.job_id])?;
        if out.ok {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "scontrol {verb} {}: {} (suspending a job needs a Slurm operator or root)",
                self.job.job_id,
                out.stderr.trim()
            )))
        }
    }

    fn run(&self, argv: &[&str]) -> io::Result<Output> {
        run(argv, &self.env, &self.cwd)
    }
}

fn invalid_job(stderr: &str) -> bool {
    stderr.contains("Invalid job id")
}

fn already_over(stderr: &str) -> bool {
    stderr.contains("already completing or completed")
        || stderr.contains("Job/step already completing")
        || invalid_job(stderr)
}

/// Slurm states after which a job does not run again.
pub fn is_final(state: &str) -> bool {
    matches!(
        state,
        "COMPLETED"
            | "FAILED"
            | "CANCELLED"
            | "TIMEOUT"
            | "NODE_FAIL"
            | "PREEMPTED"
            | "OUT_OF_MEMORY"
            | "BOOT_FAIL"
            | "DEADLINE"
            | "SPECIAL_EXIT"
            | "REVOKED"
    )
}

/// `3:0` (exit code 3) or `0:15` (signal 15).
fn parse_code(text: &str) -> Option<(i32, i32)> {
    let (code, sig) = text.split_once(':')?;
    Some((code.trim().parse().ok()?, sig.trim().parse().ok()?))
}

/// How a job that ended in `state` with `code` (`EXIT:SIGNAL`) counts as a run's exit. A job
/// that Slurm ended (cancelled, out of time, a node failed) never counts as a success, even
/// when its exit code reads 0.
pub fn exit_for(state: &str, code: Option<(i32, i32)>) -> ExitInfo {
    let from_code = match code {
        Some((_, sig)) if sig > 0 => ExitInfo {
            code: None,
            signal: Some(sig),
        },
        Some((c, _)) => ExitInfo::code(c),
        None => ExitInfo::unknown(),
    };
    match state {
        "COMPLETED" => from_code,
        _ if !from_code.is_success() && !from_code.is_unknown() => from_code,
        "CANCELLED" | "TIMEOUT" | "PREEMPTED" | "DEADLINE" => ExitInfo {
            code: None,
            signal: Some(15), // SIGTERM
        },
        _ => ExitInfo {
            code: None,
            signal: Some(9), // SIGKILL
        },
    }
}

/// The job `id` in `squeue --json` output (22.05: `job_state` a string and `exit_code` a wait
/// status; 23.02 and later: lists and objects). None when the output is not JSON or does not
/// list the job.
fn parse_squeue_json(text: &str, id: &str) -> Option<JobState> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let job = v.get("jobs")?.as_array()?.iter().find(|j| {
        let jid = j.get("job_id");
        jid.and_then(|x| x.as_u64())
            .map(|n| n.to_string())
            .as_deref()
            == Some(id)
            || jid.and_then(|x| x.as_str()) == Some(id)
    })?;
    let state = match job.get("job_state")? {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(a) => a.first()?.as_str()?.to_string(),
        _ => return None,
    };
    let nodelist = job
        .get("nodes")
        .and_then(|n| n.as_str())
        .map(str::to_string)
        .filter(|n| !n.is_empty());
    if !is_final(&state) {
        return Some(JobState::Active { state, nodelist });
    }
    let code = match job.get("exit_code") {
        Some(serde_json::Value::Number(n)) => n.as_i64().map(|status| {
            let status = status as i32;
            if status & 0x7f != 0 {
                (0, status & 0x7f)
            } else {
                ((status >> 8) & 0xff, 0)
            }
        }),
        Some(obj @ serde_json::Value::Object(_)) => {
            let number = |path: &[&str]| {
                let mut v = obj;
                for p in path {
                    v = v.get(p)?;
                }
                v.as_i64().map(|n| n as i32)
            };
            let sig = number(&["signal", "id", "number"]).unwrap_or(0);
            number(&["return_code", "number"]).map(|c| (c, sig))
        }
        _ => None,
    };
    Some(JobState::Ended {
        exit: code.map_or_else(ExitInfo::unknown, |c| exit_for(&state, Some(c))),
        state,
        nodelist,
    })
}

/// A finished Slurm command.
#[derive(Debug)]
struct Output {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// Run `argv` with `env` (PATH finds the program) in `cwd`, for at most [`COMMAND_TIMEOUT`].
fn run(argv: &[&str], env: &BTreeMap<String, String>, cwd: &Path) -> io::Result<Output> {
    let mut child = Command::new(argv[0])
        .args(&argv[1..])
        .env_clear()
        .envs(env)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "{}: {e} (Slurm's commands must be on the PATH of whoever started the run)",
                    argv[0]
                ),
            )
        })?;
    let pid = child.id();
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        let _ = tx.send(s);
    });
    let out = match rx.recv_timeout(COMMAND_TIMEOUT) {
        Ok(s) => s,
        Err(_) => {
            let _ = signal::to_process(pid, signal::Sig::Kill);
            let _ = child.wait();
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("`{}` took more than {COMMAND_TIMEOUT:?}", argv.join(" ")),
            ));
        }
    };
    let status = child.wait()?;
    Ok(Output {
        ok: status.success(),
        stdout: out,
        stderr: err_reader.join().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SlurmSpec {
        SlurmSpec {
            nodes: 2,
            gpus_per_node: 8,
            nproc_per_node: 8,
            partition: Some("gpu".into()),
            time_limit: Some("01:00:00".into()),
            account: Some("ml".into()),
            sbatch_args: vec!["--exclusive".into()],
            rdzv_port: 29500,
            program: vec!["torchrun".into()],
            args: vec![],
        }
    }

    fn s(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn srun_line_and_script() {
        let argv = srun_argv(&spec(), &s(&["train.py", "--lr", "0.1 x"]));
        assert_eq!(
            argv,
            s(&[
                "srun",
                "torchrun",
                "--nnodes",
                "$SLURM_NNODES",
                "--nproc_per_node",
                "8",
                "--rdzv_backend",
                "c10d",
                "--rdzv_endpoint",
                "${GPUPILOT_RDZV_HOST}:29500",
                "--rdzv_id",
                "$SLURM_JOB_ID",
                "train.py",
                "--lr",
                "0.1 x"
            ])
        );
        let tmp = tempfile::tempdir().unwrap();
        let dir = RunDir::create(tmp.path(), "t", std::time::SystemTime::now()).unwrap();
        let script = job_script(&spec(), &argv, Path::new("/work"), dir.id(), &dir);
        let out = dir.stdout_path().display().to_string();
        for line in [
            "#SBATCH --nodes=2",
            "#SBATCH --ntasks-per-node=1",
            "#SBATCH --gpus-per-node=8",
            "#SBATCH --partition=gpu",
            "#SBATCH --time=01:00:00",
            "#SBATCH --account=ml",
            "#SBATCH --chdir=/work",
            &format!("#SBATCH --output={out}"),
            "#SBATCH --open-mode=append",
            "#SBATCH --exclusive",
            "GPUPILOT_RDZV_HOST=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1)",
            "exec srun /bin/sh -c \"$GPUPILOT_NODE_SETUP\" gpupilot-node torchrun --nnodes \
             \"$SLURM_NNODES\" --nproc_per_node 8 --rdzv_backend c10d \
             --rdzv_endpoint \"${GPUPILOT_RDZV_HOST}:29500\" --rdzv_id \"$SLURM_JOB_ID\" \
             train.py --lr '0.1 x'",
        ] {
            assert!(
                script.lines().any(|l| l == line),
                "{line:?} not in\n{script}"
            );
        }
    }

    /// The job script run on one node with stand-ins for `srun` (runs its command),
    /// `scontrol`, `gpupilot` (says how it was called) and torchrun (prints the socket its
    /// ranks would use): what the node's task did, given its environment.
    fn node_task(env: &[(&str, &str)]) -> (String, String) {
        let tmp = tempfile::tempdir().unwrap();
        let bin = tmp.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let called = tmp.path().join("gpupilot.called");
        for (name, body) in [
            ("srun", "exec \"$@\"".to_string()),
            ("scontrol", "echo gpu07".to_string()),
            (
                "gpupilot",
                format!("echo \"$GPUPILOT_HOME $*\" >> {}", called.display()),
            ),
            (
                "torchrun",
                "echo \"socket=$GPUPILOT_NODE_SOCKET args=$*\"".to_string(),
            ),
        ] {
            let path = bin.join(name);
            std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let dir = RunDir::create(tmp.path(), "t", std::time::SystemTime::now()).unwrap();
        let argv = srun_argv(&spec(), &s(&["train.py"]));
        let script = job_script(&spec(), &argv, tmp.path(), dir.id(), &dir);
        let out = Command::new("bash")
            .arg("-c")
            .arg(&script)
            .env_clear()
            .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
            .envs(env.iter().copied())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        (
            String::from_utf8(out.stdout).unwrap(),
            std::fs::read_to_string(&called).unwrap_or_default(),
        )
    }

    #[test]
    fn a_node_other_than_the_runs_starts_a_daemon_of_its_own_for_the_ranks() {
        let uid = rustix::process::getuid().as_raw();
        let home = format!("/tmp/gpupilot-node-{uid}");
        let other = [
            ("GPUPILOT_RUN_NODE", "login1"),
            ("GPUPILOT_NODE_NAME", "gpu07"),
        ];
        let (out, called) = node_task(&other);
        assert_eq!(called, format!("{home} daemon --detach\n"));
        assert!(
            out.starts_with(&format!("socket={home}/run/daemon.sock args=--nnodes ")),
            "{out}"
        );
        assert!(out.trim_end().ends_with("--rdzv_id  train.py"), "{out}");
        // On the run's own node, without a run node, or with a socket the job names: nothing.
        for env in [
            &[
                ("GPUPILOT_RUN_NODE", "gpu07"),
                ("GPUPILOT_NODE_NAME", "gpu07"),
            ][..],
            &[("GPUPILOT_NODE_NAME", "gpu07")][..],
            &[
                ("GPUPILOT_RUN_NODE", "login1"),
                ("GPUPILOT_NODE_NAME", "gpu07"),
                ("GPUPILOT_NODE_SOCKET", "/mine.sock"),
            ][..],
        ] {
            let (out, called) = node_task(env);
            assert_eq!(called, "", "{env:?}");
            let socket = env
                .iter()
                .find(|(k, _)| *k == "GPUPILOT_NODE_SOCKET")
                .map_or("", |(_, v)| v);
            assert!(out.starts_with(&format!("socket={socket} args=")), "{out}");
        }
    }

    #[test]
    fn squeue_json_of_two_versions() {
        let old = r#"{"jobs":[{"job_id":7,"job_state":"RUNNING","nodes":"n[1-2]","exit_code":0},
                              {"job_id":8,"job_state":"FAILED","nodes":"n1","exit_code":768}]}"#;
        assert_eq!(
            parse_squeue_json(old, "7"),
            Some(JobState::Active {
                state: "RUNNING".into(),
                nodelist: Some("n[1-2]".into())
            })
        );
        assert_eq!(
            parse_squeue_json(old, "8"),
            Some(JobState::Ended {
                state: "FAILED".into(),
                exit: ExitInfo::code(3),
                nodelist: Some("n1".into())
            })
        );
        assert_eq!(parse_squeue_json(old, "9"), None);
        let new = r#"{"jobs":[{"job_id":9,"job_state":["CANCELLED"],"nodes":"n1",
            "exit_code":{"status":["SIGNALED"],"return_code":{"set":true,"number":0},
                         "signal":{"id":{"set":true,"number":15},"name":"TERM"}}}]}"#;
        let Some(JobState::Ended { exit, .. }) = parse_squeue_json(new, "9") else {
            panic!("not ended");
        };
        assert_eq!(exit.signal, Some(15));
        assert_eq!(parse_squeue_json("squeue: unrecognized option", "9"), None);
    }

    #[test]
    fn exits_from_states() {
        assert!(exit_for("COMPLETED", Some((0, 0))).is_success());
        assert_eq!(exit_for("FAILED", Some((3, 0))), ExitInfo::code(3));
        assert_eq!(exit_for("CANCELLED", Some((0, 0))).signal, Some(15));
        assert_eq!(exit_for("NODE_FAIL", None).signal, Some(9));
        assert_eq!(exit_for("TIMEOUT", Some((0, 9))).signal, Some(9));
        assert_eq!(parse_code("0:15"), Some((0, 15)));
        assert_eq!(parse_code("x"), None);
    }
}
