//! From a profile to a running process.
//!
//! [`plan`] is pure: it turns a [`Profile`] and the [`Caller`] (the working directory and
//! environment of whoever typed `gpupilot run`) into the exact argv, cwd and environment. A run
//! of N local ranks (`launcher = "ranks"`) is `gpupilot ranks … -- COMMAND…`, this very binary
//! (see [`super::ranks`]).
//! [`spawn`] starts that plan in its own session and process group, its stdout and stderr
//! opened straight onto the run directory's log files, so the run's output never passes
//! through the supervisor and nothing is lost when the supervisor dies.
//!
//! The crate forbids `unsafe`, so there is no `pre_exec(setsid)`: the child is started as
//! `/usr/bin/setsid -- CMD…`. Spawned without `process_group`, that child is not a group
//! leader, so util-linux `setsid` calls setsid(2) and execs CMD in the same pid: the run's pid
//! is its session id and process group id. Without a `setsid` program, `process_group(0)`
//! still gives it its own group (but the caller's session).

use std::collections::BTreeMap;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::procfs;
use super::rundir::RunDir;
use crate::profile::{
    CommandSpec, GpuSelection, Knob, Launcher, Profile, RanksSpec, SlurmSpec, TorchrunSpec,
};

/// The working directory and environment a run inherits: the caller's, as for any command the
/// user types (an activated venv, PYTHONPATH, CUDA variables).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Caller {
    pub cwd: PathBuf,
    pub env: BTreeMap<String, String>,
}

impl Caller {
    /// This process's directory and environment. Variables whose name or value is not UTF-8
    /// are left out (they cannot travel in the protocol's JSON either).
    pub fn current() -> io::Result<Caller> {
        Ok(Caller {
            cwd: std::env::current_dir()?,
            env: std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
                .collect(),
        })
    }
}

/// Values for the `{batch_size}` / `{prefetch}` placeholders; absent means the knob's initial.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KnobValues {
    pub batch_size: Option<i64>,
    pub prefetch: Option<i64>,
}

/// What the run is given besides its profile.
#[derive(Debug, Clone, Default)]
pub struct LaunchOptions {
    /// `GPUPILOT_SOCKET`: the trainer channel, when a daemon serves one.
    pub socket: Option<PathBuf>,
    /// `GPUPILOT_RUN_NODE`: the name of the node whose daemon serves that socket, so that ranks
    /// on other nodes (a Slurm job's) attach through their own node's daemon instead.
    pub node: Option<String>,
    pub knobs: KnobValues,
    /// Start each attempt under this monitor program (this binary; see
    /// `supervisor::monitor`); None: start it directly.
    pub monitor: Option<PathBuf>,
}

/// Exactly what is started: kept in the run directory (`launch.json`) so that a supervisor that
/// adopts the run can restart it the same way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchPlan {
    pub argv: Vec<String>,
    pub cwd: PathBuf,
    pub env: BTreeMap<String, String>,
    /// The command before its knob placeholders were filled in, so that a knob change or an
    /// out-of-memory restart can start it again with other values. Absent in plans written by
    /// older versions (they restart with the same argv).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<PlanTemplate>,
    /// `launcher = "slurm"`: each attempt is a batch job running `argv` (see
    /// `supervisor::slurm`), not a local process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<SlurmSpec>,
    /// The program that starts each attempt under a monitor (`gpupilot run-monitor`, see
    /// `supervisor::monitor`), so that its exit status outlives the supervisor. Absent: the
    /// supervisor starts the command itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monitor: Option<PathBuf>,
}

/// What [`LaunchPlan::with_knobs`] needs to fill the command in again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanTemplate {
    /// The argv with `{batch_size}` / `{prefetch}` still in it (`{run_id}` and `{run_dir}` are
    /// filled in).
    pub argv: Vec<String>,
    /// Added on every restart (the profile's `resume_args`), filled in the same way.
    #[serde(default)]
    pub resume_args: Vec<String>,
    /// The knob values the argv and environment carry now.
    pub knobs: KnobValues,
}

impl LaunchPlan {
    /// The knob values this plan starts the run with.
    pub fn knobs(&self) -> KnobValues {
        self.template.as_ref().map(|t| t.knobs).unwrap_or_default()
    }

    /// Whether the command line carries `knob` (so a restart can change it).
    pub fn command_uses(&self, knob: &str) -> bool {
        let needle = format!("{{{knob}}}");
        self.template
            .as_ref()
            .is_some_and(|t| t.argv.iter().any(|w| w.contains(&needle)))
    }

    /// This plan with other knob values: the argv filled in again and `GPUPILOT_BATCH_SIZE` /
    /// `GPUPILOT_PREFETCH` set to match.
    pub fn with_knobs(&self, knobs: KnobValues) -> LaunchPlan {
        let Some(t) = &self.template else {
            return self.clone();
        };
        let fill = |w: &String| fill_knobs(w, knobs);
        let mut env = self.env.clone();
        set_knob_env(&mut env, knobs);
        LaunchPlan {
            argv: t.argv.iter().map(fill).collect(),
            cwd: self.cwd.clone(),
            env,
            template: Some(PlanTemplate {
                argv: t.argv.clone(),
                resume_args: t.resume_args.clone(),
                knobs,
            }),
            slurm: self.slurm.clone(),
            monitor: self.monitor.clone(),
        }
    }

    /// The argv of a restart: the command and then the resume arguments, if any.
    pub fn restart_argv(&self) -> Vec<String> {
        let mut argv = self.argv.clone();
        if let Some(t) = &self.template {
            argv.extend(t.resume_args.iter().map(|w| fill_knobs(w, t.knobs)));
        }
        argv
    }
}

fn fill_knobs(word: &str, knobs: KnobValues) -> String {
    let mut out = word.to_string();
    if let Some(b) = knobs.batch_size {
        out = out.replace("{batch_size}", &b.to_string());
    }
    if let Some(p) = knobs.prefetch {
        out = out.replace("{prefetch}", &p.to_string());
    }
    out
}

fn set_knob_env(env: &mut BTreeMap<String, String>, knobs: KnobValues) {
    for (name, value) in [
        ("GPUPILOT_BATCH_SIZE", knobs.batch_size),
        ("GPUPILOT_PREFETCH", knobs.prefetch),
    ] {
        match value {
            Some(v) => env.insert(name.into(), v.to_string()),
            None => env.remove(name),
        };
    }
}

/// Why a profile cannot be started by this caller.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error(
        "command not found: `{program}` (looked in PATH={path}); check the spelling, or activate the environment that has it"
    )]
    ProgramNotFound { program: String, path: String },
    /// A command given with a `/` is not searched for: it is there or not.
    #[error("command not found: {} does not exist; check the path", .0.display())]
    NoSuchProgram(PathBuf),
    #[error("`{}` is not executable: chmod +x it, or run it through its interpreter", .0.display())]
    NotExecutable(PathBuf),
    #[error("working directory {} does not exist", .0.display())]
    NoCwd(PathBuf),
    #[error("{knob} = {value} is outside the allowed range {range}")]
    KnobOutOfRange {
        knob: &'static str,
        value: i64,
        range: String,
    },
    #[error("a value for {0} was given, but the profile has no [knobs.{0}]")]
    NoSuchKnob(&'static str),
    #[error(
        "launcher = \"ranks\" starts the ranks through gpupilot itself, whose binary is not found: {0}"
    )]
    NoGpupilot(String),
}

/// The plan for `profile` started by `caller` as run `run_id` in `run_dir`. Pure but for
/// checking that the working directory and program exist.
pub fn plan(
    profile: &Profile,
    caller: &Caller,
    run_id: &str,
    run_dir: &Path,
    opts: &LaunchOptions,
) -> Result<LaunchPlan, LaunchError> {
    let run = &profile.run;
    let cwd = match &run.cwd {
        Some(c) => caller.cwd.join(c),
        None => caller.cwd.clone(),
    };
    if !cwd.is_dir() {
        return Err(LaunchError::NoCwd(cwd));
    }

    let mut env = caller.env.clone();
    env.extend(run.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    match &run.gpus {
        GpuSelection::Inherit => {}
        GpuSelection::All => {
            env.remove("CUDA_VISIBLE_DEVICES");
        }
        GpuSelection::List(list) => {
            let ids: Vec<String> = list.iter().map(u32::to_string).collect();
            env.insert("CUDA_VISIBLE_DEVICES".into(), ids.join(","));
        }
    }
    env.insert("GPUPILOT_RUN_ID".into(), run_id.into());
    env.insert("GPUPILOT_RUN_DIR".into(), run_dir.display().to_string());
    // Never pass on a socket the caller inherited from some other run.
    env.remove("GPUPILOT_SOCKET");
    env.remove("GPUPILOT_RUN_NODE");
    if let Some(s) = &opts.socket {
        env.insert("GPUPILOT_SOCKET".into(), s.display().to_string());
        // Ranks on other nodes attach through their own node's daemon, relayed to this one.
        if let Some(node) = &opts.node {
            env.insert("GPUPILOT_RUN_NODE".into(), node.clone());
        }
    }

    let knobs = KnobValues {
        batch_size: knob_value(
            "batch_size",
            profile.knobs.batch_size,
            opts.knobs.batch_size,
        )?,
        prefetch: knob_value("prefetch", profile.knobs.prefetch, opts.knobs.prefetch)?,
    };
    // Run id and directory now; knob values through the template, so they can change later.
    let values = Substitutions {
        batch_size: None,
        prefetch: None,
        run_id,
        run_dir,
    };
    let command: Vec<String> = match &run.command {
        CommandSpec::Argv(words) => words.iter().map(|w| values.apply(w)).collect(),
        CommandSpec::Shell(script) => vec!["/bin/sh".into(), "-c".into(), values.apply(script)],
    };
    let template: Vec<String> = match (&run.command, &run.launcher) {
        // Every rank runs the command, a shell command too.
        (_, Launcher::Ranks(spec)) => ranks_argv(&gpupilot_program()?, spec, &command),
        (CommandSpec::Argv(_), Launcher::Torchrun(spec)) => torchrun_argv(spec, &command),
        (CommandSpec::Argv(_), Launcher::Slurm(spec)) => super::slurm::srun_argv(spec, &command),
        // The profile check refuses a shell command with torchrun; run it locally regardless.
        _ => command.clone(),
    };
    let resume_args = run.resume_args.iter().map(|w| values.apply(w)).collect();
    let slurm = match &run.launcher {
        Launcher::Slurm(spec) => Some(spec.clone()),
        _ => None,
    };
    let program = match &run.launcher {
        // A Slurm run starts `sbatch` here; its command runs on the job's nodes.
        Launcher::Slurm(_) => "sbatch",
        // `gpupilot ranks` is found already; what it starts must be found too.
        Launcher::Ranks(_) => &command[0],
        _ => &template[0],
    };
    check_program(program, env.get("PATH").map(String::as_str), &cwd)?;
    let shell = LaunchPlan {
        argv: Vec::new(),
        cwd,
        env,
        template: Some(PlanTemplate {
            argv: template,
            resume_args,
            knobs,
        }),
        slurm,
        // A Slurm run's attempts are jobs: nothing local to monitor.
        monitor: if matches!(run.launcher, Launcher::Slurm(_)) {
            None
        } else {
            opts.monitor.clone()
        },
    };
    Ok(shell.with_knobs(knobs))
}

fn knob_value(
    name: &'static str,
    knob: Option<Knob>,
    given: Option<i64>,
) -> Result<Option<i64>, LaunchError> {
    match (knob, given) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err(LaunchError::NoSuchKnob(name)),
        (Some(k), None) => Ok(Some(k.initial)),
        (Some(k), Some(v)) if k.allows(v) => Ok(Some(v)),
        (Some(k), Some(v)) => Err(LaunchError::KnobOutOfRange {
            knob: name,
            value: v,
            range: match k.max {
                Some(max) => format!("{}..={max}", k.min),
                None => format!("{} or more", k.min),
            },
        }),
    }
}

/// The placeholders a command may use: `{batch_size}`, `{prefetch}`, `{run_id}`, `{run_dir}`.
/// Any other text in braces (JSON, Python format strings) is left as written.
struct Substitutions<'a> {
    batch_size: Option<i64>,
    prefetch: Option<i64>,
    run_id: &'a str,
    run_dir: &'a Path,
}

impl Substitutions<'_> {
    fn apply(&self, word: &str) -> String {
        let mut out = word.replace("{run_id}", self.run_id);
        out = out.replace("{run_dir}", &self.run_dir.display().to_string());
        if let Some(b) = self.batch_size {
            out = out.replace("{batch_size}", &b.to_string());
        }
        if let Some(p) = self.prefetch {
            out = out.replace("{prefetch}", &p.to_string());
        }
        out
    }
}

/// `torchrun --nnodes N --nproc_per_node M [--standalone | --rdzv_…] [flags…] SCRIPT ARGS…`.
///
/// The flags are spelled with underscores: torchrun 1.x (Debian's python3-torch 1.13) knows only
/// those, and torchrun 2.x accepts both spellings.
pub fn torchrun_argv(spec: &TorchrunSpec, script_and_args: &[String]) -> Vec<String> {
    let mut argv = spec.program.clone();
    argv.extend([
        "--nnodes".into(),
        spec.nnodes.to_string(),
        "--nproc_per_node".into(),
        spec.nproc_per_node.to_string(),
    ]);
    if spec.standalone {
        argv.push("--standalone".into());
    }
    let flags = [
        ("--rdzv_backend", &spec.rdzv_backend),
        ("--rdzv_endpoint", &spec.rdzv_endpoint),
        ("--rdzv_id", &spec.rdzv_id),
    ];
    for (flag, value) in flags {
        if let Some(v) = value {
            argv.extend([flag.to_string(), v.clone()]);
        }
    }
    if let Some(m) = spec.max_restarts {
        argv.extend(["--max_restarts".into(), m.to_string()]);
    }
    argv.extend(spec.args.iter().cloned());
    if spec.module {
        argv.push("-m".into());
    }
    if spec.no_python {
        argv.push("--no_python".into());
    }
    argv.extend(script_and_args.iter().cloned());
    argv
}

/// `GPUPILOT ranks --nproc N --master-addr A [--master-port P] --grace S -- COMMAND…`: the run's
/// process starts N ranks of the command (see `gpupilot ranks`, [`super::ranks`]).
pub fn ranks_argv(gpupilot: &Path, spec: &RanksSpec, command: &[String]) -> Vec<String> {
    let mut argv = vec![
        gpupilot.display().to_string(),
        "ranks".into(),
        "--nproc".into(),
        spec.nproc.to_string(),
        "--master-addr".into(),
        spec.master_addr.clone(),
    ];
    if let Some(port) = spec.master_port {
        argv.extend(["--master-port".into(), port.to_string()]);
    }
    argv.extend(["--grace".into(), spec.grace_s.to_string(), "--".into()]);
    argv.extend(command.iter().cloned());
    argv
}

/// The number of ranks of a run whose argv [`ranks_argv`] made; None for any other argv.
pub fn ranks_nproc(argv: &[String]) -> Option<u32> {
    let ours = argv.get(1).is_some_and(|a| a == "ranks");
    let options = argv.iter().take_while(|a| *a != "--");
    let mut after = options.skip_while(|a| *a != "--nproc").skip(1);
    after.next().filter(|_| ours)?.parse().ok()
}

/// This gpupilot's binary, which starts the ranks of a `launcher = "ranks"` run.
fn gpupilot_program() -> Result<PathBuf, LaunchError> {
    let exe = std::env::current_exe().map_err(|e| LaunchError::NoGpupilot(e.to_string()))?;
    if exe.is_file() {
        return Ok(exe);
    }
    // A daemon that outlived an upgrade of its binary: Linux names the old one
    // `PATH (deleted)`, and the new one is at PATH.
    let text = exe.to_string_lossy();
    match text.strip_suffix(" (deleted)").map(PathBuf::from) {
        Some(p) if p.is_file() => Ok(p),
        _ => Err(LaunchError::NoGpupilot(format!(
            "{} is gone (reinstalled?); restart the daemon",
            exe.display()
        ))),
    }
}

/// Find `program` as exec would: a path with a `/` is taken from `cwd`, a bare name is
/// searched in `path`.
pub fn resolve_program(program: &str, path: Option<&str>, cwd: &Path) -> Option<PathBuf> {
    if program.contains('/') {
        let p = cwd.join(program);
        return p.is_file().then_some(p);
    }
    path.unwrap_or("/usr/local/bin:/usr/bin:/bin")
        .split(':')
        .map(|dir| {
            if dir.is_empty() {
                cwd.to_path_buf()
            } else {
                cwd.join(dir)
            }
        })
        .map(|dir| dir.join(program))
        .find(|p| p.is_file() && is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.permissions().mode() & 0o111 != 0)
}

fn check_program(program: &str, path: Option<&str>, cwd: &Path) -> Result<(), LaunchError> {
    match resolve_program(program, path, cwd) {
        None if program.contains('/') => Err(LaunchError::NoSuchProgram(cwd.join(program))),
        None => Err(LaunchError::ProgramNotFound {
            program: program.into(),
            path: path.unwrap_or("").into(),
        }),
        Some(p) if !is_executable(&p) => Err(LaunchError::NotExecutable(p)),
        Some(_) => Ok(()),
    }
}

/// A process just started for a run.
#[derive(Debug)]
pub struct Spawned {
    /// Ours to wait for; None when a monitor started it (see [`super::monitor`]).
    pub child: Option<Child>,
    pub pid: u32,
    /// `/proc/PID/stat` field 22.
    pub start_time: u64,
    /// Its own session and process group (pid == sid == pgid). False only without `setsid`
    /// (own group, caller's session) or when the process exited before it could be seen.
    pub own_session: bool,
    /// Its own process group: signals go to the group.
    pub own_group: bool,
    /// The monitor that waits for it and writes its exit status.
    pub monitor: Option<super::rundir::PidRecord>,
}

/// A command started in its own session, not yet handed to anyone.
#[derive(Debug)]
pub struct InSession {
    pub child: Child,
    pub pid: u32,
    pub start_time: u64,
    pub own_session: bool,
    pub own_group: bool,
}

/// The `setsid` program, when the system has one.
fn setsid_program() -> Option<&'static str> {
    ["/usr/bin/setsid", "/bin/setsid"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
}

/// How long `spawn` waits for `setsid` to take effect (it normally takes a millisecond).
const SESSION_WAIT: Duration = Duration::from_secs(2);

/// Start `plan` with its output appended to the run directory's log files. Returns once the
/// process has its own session (so a signal to its group reaches it), or has already exited.
/// With a monitor program (`plan.monitor`, this binary), the process is its monitor's child,
/// and its exit status is written to the run directory whoever watches (see
/// [`super::monitor`]); without one, or when it is gone, it is ours.
pub fn spawn(plan: &LaunchPlan, dir: &RunDir) -> io::Result<Spawned> {
    if let Some(program) = plan.monitor.as_deref().and_then(usable_program) {
        let s = super::monitor::start(&program, plan, dir)?;
        return Ok(Spawned {
            child: None,
            pid: s.pid,
            start_time: s.start_time,
            own_session: s.own_session,
            own_group: s.own_group,
            monitor: Some(s.monitor),
        });
    }
    let s = spawn_in_session(&plan.argv, dir, |cmd| {
        cmd.current_dir(&plan.cwd).env_clear().envs(&plan.env);
    })?;
    Ok(Spawned {
        child: Some(s.child),
        pid: s.pid,
        start_time: s.start_time,
        own_session: s.own_session,
        own_group: s.own_group,
        monitor: None,
    })
}

/// Set by the gpupilot binary's `main`: this process is gpupilot, and can be a run's monitor.
static MONITORS_RUNS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Say that this process is the gpupilot binary (its `main` does, first thing), so runs its
/// daemon starts go under a monitor of this binary.
pub fn this_binary_monitors_runs() {
    MONITORS_RUNS.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// The monitor program to use for a run: this binary, as found now, when it is gpupilot. A
/// program that embeds the library (a test binary with a daemon in-process) does not know
/// `run-monitor`, and starts runs directly.
pub fn monitor_program() -> Option<PathBuf> {
    if !MONITORS_RUNS.load(std::sync::atomic::Ordering::Relaxed) {
        return None;
    }
    gpupilot_program().ok()
}

/// `program`, or the binary that replaced it (`PATH (deleted)` after an upgrade), if either is
/// there.
fn usable_program(program: &Path) -> Option<PathBuf> {
    if program.is_file() {
        return Some(program.to_path_buf());
    }
    let text = program.to_string_lossy();
    text.strip_suffix(" (deleted)")
        .map(PathBuf::from)
        .filter(|p| p.is_file())
}

/// Start `argv` in a session and group of its own with stdout and stderr appended to the run
/// directory's logs; `setup` gives it its cwd and environment (else it inherits ours).
pub fn spawn_in_session(
    argv: &[String],
    dir: &RunDir,
    setup: impl FnOnce(&mut Command),
) -> io::Result<InSession> {
    let Some(program) = argv.first() else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no command"));
    };
    let stdout = RunDir::open_log(&dir.stdout_path())?;
    let stderr = RunDir::open_log(&dir.stderr_path())?;
    let setsid = setsid_program();
    let mut cmd = match setsid {
        Some(s) => {
            let mut c = Command::new(s);
            c.arg("--").args(argv);
            c
        }
        None => {
            let mut c = Command::new(program);
            c.args(&argv[1..]).process_group(0);
            c
        }
    };
    setup(&mut cmd);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::from(stderr));
    let child = cmd.spawn()?;
    let pid = child.id();

    let deadline = Instant::now() + SESSION_WAIT;
    let mut st = procfs::stat(pid)?;
    while setsid.is_some() && st.session != pid as i32 && st.is_running() {
        if Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
        st = procfs::stat(pid)?;
    }
    let own_group = st.pgrp == pid as i32;
    Ok(InSession {
        child,
        pid,
        start_time: st.start_time,
        own_session: st.session == pid as i32,
        // Without setsid, process_group(0) took effect before exec.
        own_group: own_group || setsid.is_none(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{self, TorchrunSpec};

    fn spec(nproc: u32) -> TorchrunSpec {
        TorchrunSpec {
            nproc_per_node: nproc,
            nnodes: 1,
            standalone: true,
            rdzv_backend: None,
            rdzv_endpoint: None,
            rdzv_id: None,
            max_restarts: None,
            module: false,
            no_python: false,
            program: vec!["torchrun".into()],
            args: vec![],
        }
    }

    fn s(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn torchrun_single_node() {
        let argv = torchrun_argv(&spec(4), &s(&["train.py", "--lr", "0.1"]));
        assert_eq!(
            argv,
            s(&[
                "torchrun",
                "--nnodes",
                "1",
                "--nproc_per_node",
                "4",
                "--standalone",
                "train.py",
                "--lr",
                "0.1"
            ])
        );
    }

    #[test]
    fn torchrun_multi_node_and_options() {
        let mut t = spec(8);
        t.nnodes = 2;
        t.standalone = false;
        t.rdzv_backend = Some("c10d".into());
        t.rdzv_endpoint = Some("node0:29400".into());
        t.rdzv_id = Some("job7".into());
        t.max_restarts = Some(1);
        t.module = true;
        t.program = s(&["python3", "-m", "torch.distributed.run"]);
        t.args = s(&["--log-dir", "logs"]);
        let argv = torchrun_argv(&t, &s(&["pkg.train", "--x"]));
        assert_eq!(
            argv,
            s(&[
                "python3",
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--nproc_per_node",
                "8",
                "--rdzv_backend",
                "c10d",
                "--rdzv_endpoint",
                "node0:29400",
                "--rdzv_id",
                "job7",
                "--max_restarts",
                "1",
                "--log-dir",
                "logs",
                "-m",
                "pkg.train",
                "--x",
            ])
        );
    }

    fn caller(dir: &Path) -> Caller {
        let mut env = BTreeMap::new();
        env.insert("PATH".to_string(), "/usr/bin:/bin".to_string());
        env.insert("CUDA_VISIBLE_DEVICES".to_string(), "3".to_string());
        env.insert("GPUPILOT_SOCKET".to_string(), "/stale".to_string());
        env.insert("GPUPILOT_RUN_NODE".to_string(), "stale-node".to_string());
        env.insert("KEEP".to_string(), "me".to_string());
        Caller {
            cwd: dir.to_path_buf(),
            env,
        }
    }

    #[test]
    fn plan_env_cwd_gpus_and_placeholders() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("work")).unwrap();
        let p = profile::parse_str(
            "p.toml",
            r#"
            [run]
            command = ["sh", "-c", "true", "{batch_size}", "{prefetch}", "{run_id}", "{x}"]
            cwd = "work"
            gpus = [1, 0]
            env = { KEEP = "over", NEW = "1" }
            [knobs.batch_size]
            initial = 32
            max = 64
            [knobs.prefetch]
            initial = 2
            "#,
        )
        .unwrap();
        let opts = LaunchOptions {
            socket: Some("/run/g.sock".into()),
            node: Some("gpu-node-07".into()),
            knobs: KnobValues {
                batch_size: Some(48),
                prefetch: None,
            },
            monitor: Some("/opt/gp/gpupilot".into()),
        };
        let plan = plan(&p, &caller(tmp.path()), "id1", Path::new("/r/id1"), &opts).unwrap();
        assert_eq!(plan.argv, s(&["sh", "-c", "true", "48", "2", "id1", "{x}"]));
        assert_eq!(plan.cwd, tmp.path().join("work"));
        assert_eq!(plan.env["CUDA_VISIBLE_DEVICES"], "1,0");
        assert_eq!(plan.env["KEEP"], "over");
        assert_eq!(plan.env["NEW"], "1");
        assert_eq!(plan.env["GPUPILOT_RUN_ID"], "id1");
        assert_eq!(plan.env["GPUPILOT_RUN_DIR"], "/r/id1");
        assert_eq!(plan.env["GPUPILOT_SOCKET"], "/run/g.sock");
        assert_eq!(plan.env["GPUPILOT_RUN_NODE"], "gpu-node-07");
        assert_eq!(plan.monitor, Some("/opt/gp/gpupilot".into()));
        let restarted = plan.with_knobs(KnobValues::default());
        assert_eq!(restarted.monitor, plan.monitor, "kept for every attempt");

        let opts = LaunchOptions {
            socket: None,
            node: None,
            knobs: KnobValues {
                batch_size: Some(65),
                prefetch: None,
            },
            monitor: None,
        };
        let err = super::plan(&p, &caller(tmp.path()), "id", Path::new("/r"), &opts).unwrap_err();
        assert_eq!(
            err.to_string(),
            "batch_size = 65 is outside the allowed range 1..=64"
        );
    }

    #[test]
    fn plan_inherit_all_and_missing_program() {
        let tmp = tempfile::tempdir().unwrap();
        let mut p = Profile::from_command(s(&["true"]));
        let opts = LaunchOptions::default();
        let plan1 = plan(&p, &caller(tmp.path()), "i", Path::new("/r"), &opts).unwrap();
        assert_eq!(plan1.env["CUDA_VISIBLE_DEVICES"], "3");
        assert!(!plan1.env.contains_key("GPUPILOT_SOCKET"));
        assert!(!plan1.env.contains_key("GPUPILOT_RUN_NODE"));
        p.run.gpus = GpuSelection::All;
        let plan2 = plan(&p, &caller(tmp.path()), "i", Path::new("/r"), &opts).unwrap();
        assert!(!plan2.env.contains_key("CUDA_VISIBLE_DEVICES"));

        let p = Profile::from_command(s(&["no-such-program-xyz"]));
        let err = plan(&p, &caller(tmp.path()), "i", Path::new("/r"), &opts).unwrap_err();
        assert_eq!(
            err.to_string(),
            "command not found: `no-such-program-xyz` (looked in PATH=/usr/bin:/bin); check the spelling, or activate the environment that has it"
        );
        let mut p = Profile::from_command(s(&["true"]));
        p.run.cwd = Some("missing".into());
        assert!(matches!(
            plan(&p, &caller(tmp.path()), "i", Path::new("/r"), &opts),
            Err(LaunchError::NoCwd(_))
        ));
    }

    #[test]
    fn ranks_argv_starts_gpupilot_ranks() {
        let mut spec = RanksSpec {
            nproc: 3,
            master_addr: "127.0.0.1".into(),
            master_port: None,
            grace_s: 10.0,
        };
        let gp = Path::new("/opt/gp/gpupilot");
        assert_eq!(
            ranks_argv(gp, &spec, &s(&["python3", "t.py", "--lr", "0.1"])),
            s(&[
                "/opt/gp/gpupilot",
                "ranks",
                "--nproc",
                "3",
                "--master-addr",
                "127.0.0.1",
                "--grace",
                "10",
                "--",
                "python3",
                "t.py",
                "--lr",
                "0.1"
            ])
        );
        spec.master_port = Some(29501);
        spec.master_addr = "10.0.0.7".into();
        spec.grace_s = 2.5;
        assert_eq!(
            ranks_argv(gp, &spec, &s(&["t"])),
            s(&[
                "/opt/gp/gpupilot",
                "ranks",
                "--nproc",
                "3",
                "--master-addr",
                "10.0.0.7",
                "--master-port",
                "29501",
                "--grace",
                "2.5",
                "--",
                "t"
            ])
        );
    }

    #[test]
    fn the_ranks_of_an_argv_are_read_back() {
        let spec = RanksSpec {
            nproc: 4,
            master_addr: "127.0.0.1".into(),
            master_port: Some(29500),
            grace_s: 10.0,
        };
        let argv = ranks_argv(
            Path::new("/bin/gpupilot"),
            &spec,
            &s(&["t", "--nproc", "9"]),
        );
        assert_eq!(ranks_nproc(&argv), Some(4));
        assert_eq!(ranks_nproc(&s(&["python3", "--nproc", "2"])), None);
        assert_eq!(
            ranks_nproc(&s(&["gpupilot", "ranks", "--", "--nproc", "2"])),
            None
        );
        assert_eq!(
            ranks_nproc(&s(&["torchrun", "--nproc-per-node", "2", "t.py"])),
            None
        );
    }

    #[test]
    fn plan_of_local_ranks() {
        let tmp = tempfile::tempdir().unwrap();
        let p = profile::parse_str(
            "r.toml",
            "[run]\nlauncher = \"ranks\"\ncommand = [\"sh\", \"-c\", \"true\", \"{batch_size}\", \"{run_id}\"]\n\
             [run.ranks]\nnproc = 2\n[knobs.batch_size]\ninitial = 8\n",
        )
        .unwrap();
        let opts = LaunchOptions::default();
        let plan1 = plan(&p, &caller(tmp.path()), "id9", Path::new("/r"), &opts).unwrap();
        let exe = std::env::current_exe().unwrap();
        assert_eq!(plan1.argv[0], exe.display().to_string());
        assert_eq!(
            plan1.argv[1..],
            s(&[
                "ranks",
                "--nproc",
                "2",
                "--master-addr",
                "127.0.0.1",
                "--grace",
                "10",
                "--",
                "sh",
                "-c",
                "true",
                "8",
                "id9"
            ])
        );
        assert!(plan1.command_uses("batch_size"));
        let again = plan1.with_knobs(KnobValues {
            batch_size: Some(16),
            prefetch: None,
        });
        assert_eq!(again.argv.last().map(String::as_str), Some("id9"));
        assert_eq!(again.argv[again.argv.len() - 2], "16");

        // A shell command: every rank runs `sh -c SCRIPT`.
        let p = profile::parse_str(
            "r.toml",
            "[run]\nlauncher = \"ranks\"\nshell = true\ncommand = \"echo $RANK\"\n[run.ranks]\nnproc = 4\nmaster_port = 29400\n",
        )
        .unwrap();
        let plan2 = plan(&p, &caller(tmp.path()), "i", Path::new("/r"), &opts).unwrap();
        assert_eq!(
            plan2.argv[plan2.argv.len() - 7..],
            s(&[
                "29400",
                "--grace",
                "10",
                "--",
                "/bin/sh",
                "-c",
                "echo $RANK"
            ])[..]
        );

        // A path is not searched for in PATH, and the message does not say it was.
        let err = check_program("/no/such/trainer", Some("/usr/bin"), tmp.path()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "command not found: /no/such/trainer does not exist; check the path"
        );
        // The command the ranks run is looked for, not only gpupilot.
        let p = profile::parse_str(
            "r.toml",
            "[run]\nlauncher = \"ranks\"\ncommand = [\"no-such-trainer-xyz\"]\n[run.ranks]\nnproc = 2\n",
        )
        .unwrap();
        let err = plan(&p, &caller(tmp.path()), "i", Path::new("/r"), &opts).unwrap_err();
        assert!(
            matches!(&err, LaunchError::ProgramNotFound { program, .. } if program == "no-such-trainer-xyz"),
            "{err}"
        );
    }

    #[test]
    fn shell_command_runs_under_sh() {
        let tmp = tempfile::tempdir().unwrap();
        let p = profile::parse_str(
            "s.toml",
            "[run]\nshell = true\ncommand = \"echo $HOME | wc\"\n",
        )
        .unwrap();
        let plan = plan(
            &p,
            &caller(tmp.path()),
            "i",
            Path::new("/r"),
            &LaunchOptions::default(),
        )
        .unwrap();
        assert_eq!(plan.argv, s(&["/bin/sh", "-c", "echo $HOME | wc"]));
    }
}
