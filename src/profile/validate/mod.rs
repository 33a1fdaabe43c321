//! From the merged raw file to a [`Profile`]: defaults filled in, every value checked, every
//! problem reported (in file order) with the place it was written. `[run]` here; the other
//! sections in `sections`.

mod ranks;
mod sections;
mod slurm;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::error::{Diagnostic, ProfileError};
use super::load::SourceFile;
use super::raw::{At, CommandValue, GpusValue, LauncherKind, RawProfile};
use super::{CommandSpec, GpuSelection, Launcher, Profile, RunSpec, TorchrunSpec, is_name_char};
use sections::{alerts, energy, knobs, metrics, placeholders, power, restart, thermal};

/// Environment variables gpupilot sets for every run; a profile may not set them.
const RESERVED_ENV: [&str; 3] = ["GPUPILOT_RUN_ID", "GPUPILOT_SOCKET", "GPUPILOT_RUN_DIR"];

/// Words that mean something only to a shell: in a one-string command they are a sign the
/// author expected one.
const SHELL_WORDS: [&str; 10] = ["|", "||", "&&", ";", "&", ">", ">>", "<", "2>&1", "2>"];

struct Ctx<'a> {
    files: &'a [SourceFile],
    problems: Vec<(usize, usize, Diagnostic)>,
}

impl Ctx<'_> {
    fn err<T>(&mut self, at: &At<T>, message: impl Into<String>) {
        match self.files.get(at.file) {
            Some(f) => {
                let d = f.diag(Some(at.span.clone()), message.into());
                self.problems.push((at.file, at.span.start, d));
            }
            None => self.err_root(message),
        }
    }

    /// A problem with no single place (something missing): reported against the loaded file.
    fn err_root(&mut self, message: impl Into<String>) {
        let d = self.files[0].diag(None, message.into());
        self.problems.push((0, 0, d));
    }
}

pub(crate) fn resolve(
    raw: RawProfile,
    files: &[SourceFile],
    path: Option<&Path>,
) -> Result<Profile, ProfileError> {
    let mut cx = Ctx {
        files,
        problems: Vec::new(),
    };
    let name = match &raw.name {
        Some(at) if super::check_name(&at.value).is_err() => {
            let why = super::check_name(&at.value).err().unwrap_or_default();
            let shown: String = at.value.chars().take(super::MAX_NAME_LEN).collect();
            let more = if shown.len() < at.value.len() {
                "…"
            } else {
                ""
            };
            cx.err(at, format!("name = {shown:?}{more}: {why}"));
            at.value.clone()
        }
        Some(at) => at.value.clone(),
        None => clean_name(&files[0].stem),
    };
    let run = run_spec(&mut cx, raw.run.unwrap_or_default());
    let raw_knobs = raw.knobs.unwrap_or_default();
    let knobs = knobs(&mut cx, &raw_knobs);
    if let Some((command, at)) = &run {
        placeholders(&mut cx, &command.command, at, &raw_knobs);
    }
    let power = power(&mut cx, raw.power.unwrap_or_default());
    let thermal = thermal(&mut cx, raw.thermal.unwrap_or_default());
    let alerts = alerts(&mut cx, raw.alerts.unwrap_or_default());
    let metrics = metrics(&mut cx, raw.metrics.unwrap_or_default());
    let energy = energy(&mut cx, raw.energy.unwrap_or_default());

    if !cx.problems.is_empty() || run.is_none() {
        let mut problems = cx.problems;
        problems.sort_by_key(|(file, start, _)| (*file, *start));
        return Err(ProfileError::Invalid(
            problems.into_iter().map(|(_, _, d)| d).collect(),
        ));
    }
    let (run, _) = run.expect("checked above");
    Ok(Profile {
        name,
        source: path.map(Path::to_path_buf),
        description: raw.description,
        run,
        knobs,
        power,
        thermal,
        alerts,
        metrics,
        energy,
    })
}

fn clean_name(stem: &str) -> String {
    let s: String = stem
        .chars()
        .take(super::MAX_NAME_LEN)
        .map(|c| if is_name_char(c) { c } else { '-' })
        .collect();
    if s.is_empty() { "profile".into() } else { s }
}

/// `[run]`; None when the command is missing (already reported). The span of the command comes
/// back too, for the placeholder check.
fn run_spec(cx: &mut Ctx, run: super::raw::RawRun) -> Option<(RunSpec, At<()>)> {
    let shell = run.shell.as_ref().is_some_and(|s| s.value);
    let command = match &run.command {
        None => {
            cx.err_root(
                "[run] command is missing: add command = [\"python3\", \"train.py\"] under [run] \
                 (here or in the profile this one extends)",
            );
            None
        }
        Some(at) => command(cx, at, shell),
    };
    let cwd = run.cwd.as_ref().and_then(|at| {
        let v = &at.value;
        if v.is_empty() {
            cx.err(at, "cwd is empty: leave it out to use the caller's directory");
            None
        } else if v.starts_with('~') {
            cx.err(at, format!(
                "cwd = {v:?}: `~` is not expanded; write the full path, or one relative to this file"
            ));
            None
        } else {
            let p = PathBuf::from(v);
            match (p.is_relative(), cx.files.get(at.file).and_then(|f| f.dir.as_ref())) {
                (true, Some(dir)) => Some(dir.join(p)),
                _ => Some(p),
            }
        }
    });
    let gpus = gpus(cx, run.gpus.as_ref());
    let mut env = BTreeMap::new();
    for (key, value) in run.env.iter().flatten() {
        if key.is_empty() || key.contains(['=', '\0']) {
            cx.err(
                value,
                format!("env key {key:?} is not a valid variable name"),
            );
        } else if RESERVED_ENV.contains(&key.as_str()) {
            cx.err(
                value,
                format!("env.{key} is set by gpupilot for each run; remove it"),
            );
        } else if key == "CUDA_VISIBLE_DEVICES" && gpus != GpuSelection::Inherit {
            cx.err(
                value,
                "env.CUDA_VISIBLE_DEVICES and gpus both choose GPUs: keep only gpus",
            );
        } else if value.value.contains('\0') {
            cx.err(value, format!("env.{key} contains a NUL character"));
        }
        env.insert(key.clone(), value.value.clone());
    }
    let launcher = launcher(cx, &run, shell, &gpus, command.as_ref());
    let restart = restart(cx, run.restart.unwrap_or_default());
    let resume_args = run.resume_args.unwrap_or_default();
    let (command, at) = command?;
    Some((
        RunSpec {
            command,
            cwd,
            env,
            gpus,
            launcher: launcher?,
            restart,
            resume_args,
        },
        at,
    ))
}

fn command(cx: &mut Ctx, at: &At<CommandValue>, shell: bool) -> Option<(CommandSpec, At<()>)> {
    let place = At {
        value: (),
        span: at.span.clone(),
        file: at.file,
    };
    let spec = match (&at.value, shell) {
        (CommandValue::Line(script), true) => {
            if script.trim().is_empty() {
                cx.err(at, "command is empty");
                return None;
            }
            CommandSpec::Shell(script.clone())
        }
        (CommandValue::Argv(_), true) => {
            cx.err(
                at,
                "with shell = true, command is one string for `sh -c`, not an array",
            );
            return None;
        }
        (CommandValue::Argv(argv), false) => {
            if argv.is_empty() {
                cx.err(at, "command is empty: write the program and its arguments, like [\"python3\", \"train.py\"]");
                return None;
            }
            if argv[0].is_empty() {
                cx.err(at, "command's first word (the program) is empty");
                return None;
            }
            CommandSpec::Argv(argv.clone())
        }
        (CommandValue::Line(line), false) => {
            let argv = argv_from_line(cx, at, line, "command")?;
            if let Some(w) = argv.iter().find(|w| SHELL_WORDS.contains(&w.as_str())) {
                cx.err(at, format!(
                    "command contains `{w}`, which only a shell understands: set shell = true to run it with sh -c, or remove it"
                ));
                return None;
            }
            CommandSpec::Argv(argv)
        }
    };
    Some((spec, place))
}

/// Split a one-string command with shell quoting rules (it is never run by a shell).
fn argv_from_line(
    cx: &mut Ctx,
    at: &At<CommandValue>,
    line: &str,
    what: &str,
) -> Option<Vec<String>> {
    match shell_words::split(line) {
        Ok(argv) if argv.is_empty() => {
            cx.err(at, format!("{what} is empty"));
            None
        }
        Ok(argv) => Some(argv),
        Err(e) => {
            cx.err(
                at,
                format!("{what}: {e} (the string is split into words with shell quoting rules)"),
            );
            None
        }
    }
}

fn argv_value(cx: &mut Ctx, at: &At<CommandValue>, what: &str) -> Option<Vec<String>> {
    match &at.value {
        CommandValue::Argv(v) if v.is_empty() || v[0].is_empty() => {
            cx.err(at, format!("{what} is empty"));
            None
        }
        CommandValue::Argv(v) => Some(v.clone()),
        CommandValue::Line(line) => argv_from_line(cx, at, line, what),
    }
}

fn gpus(cx: &mut Ctx, at: Option<&At<GpusValue>>) -> GpuSelection {
    let Some(at) = at else {
        return GpuSelection::Inherit;
    };
    match &at.value {
        GpusValue::All => GpuSelection::All,
        GpusValue::List(list) => {
            let mut seen = BTreeSet::new();
            let mut out = Vec::new();
            for &i in list {
                match u32::try_from(i) {
                    Err(_) => cx.err(at, format!("gpus: {i} is not a GPU index (0, 1, …)")),
                    Ok(i) if !seen.insert(i) => cx.err(at, format!("gpus lists GPU {i} twice")),
                    Ok(i) => out.push(i),
                }
            }
            GpuSelection::List(out)
        }
    }
}

fn is_python(word: &str) -> bool {
    let file = Path::new(word)
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    file.strip_prefix("python")
        .is_some_and(|rest| rest.chars().all(|c| c.is_ascii_digit() || c == '.'))
}

fn launcher(
    cx: &mut Ctx,
    run: &super::raw::RawRun,
    shell: bool,
    gpus: &GpuSelection,
    command: Option<&(CommandSpec, At<()>)>,
) -> Option<Launcher> {
    let kind = run
        .launcher
        .as_ref()
        .map_or(LauncherKind::Local, |l| l.value);
    slurm::misplaced(cx, run, kind);
    ranks::misplaced(cx, run, kind);
    if kind == LauncherKind::Slurm {
        return slurm::launcher(cx, run, shell, command);
    }
    if kind == LauncherKind::Ranks {
        return ranks::launcher(cx, run, gpus);
    }
    if kind == LauncherKind::Local {
        if let Some(t) = &run.torchrun {
            cx.err(t, "[run.torchrun] is set but launcher is \"local\": add launcher = \"torchrun\" under [run], or remove [run.torchrun]");
        }
        return Some(Launcher::Local);
    }
    let launcher_at = run.launcher.as_ref().expect("torchrun was named");
    if shell {
        cx.err(launcher_at, "launcher = \"torchrun\" cannot run a shell command (shell = true): torchrun starts the script itself; make command the script and its arguments");
    }
    let Some(t_at) = &run.torchrun else {
        cx.err(launcher_at, "launcher = \"torchrun\" needs nproc_per_node (processes per node, usually one per GPU): add [run.torchrun] with nproc_per_node = N");
        return None;
    };
    let t = &t_at.value;
    let nproc = match &t.nproc_per_node {
        None => {
            cx.err(
                t_at,
                "[run.torchrun] needs nproc_per_node (processes per node, usually one per GPU)",
            );
            None
        }
        Some(n) if n.value < 1 || n.value > i64::from(u32::MAX) => {
            cx.err(
                n,
                format!("nproc_per_node = {}: must be 1 or more", n.value),
            );
            None
        }
        Some(n) => {
            let listed = match gpus {
                GpuSelection::List(list) => Some(list.len()),
                _ => None,
            };
            if let Some(len) = listed.filter(|&len| n.value as usize > len) {
                cx.err(n, format!(
                    "nproc_per_node = {} but gpus lists {} GPU{}: one process per GPU needs as many GPUs",
                    n.value,
                    len,
                    if len == 1 { "" } else { "s" }
                ));
            }
            Some(n.value as u32)
        }
    };
    let nnodes = match &t.nnodes {
        Some(n) if n.value < 1 || n.value > i64::from(u32::MAX) => {
            cx.err(n, format!("nnodes = {}: must be 1 or more", n.value));
            1
        }
        Some(n) => n.value as u32,
        None => 1,
    };
    let standalone = match &t.standalone {
        Some(s) if s.value && (nnodes > 1 || t.rdzv_endpoint.is_some()) => {
            cx.err(s, "standalone = true is a single-node rendezvous: it cannot go with nnodes > 1 or rdzv_endpoint");
            true
        }
        Some(s) => s.value,
        None => nnodes == 1 && t.rdzv_endpoint.is_none(),
    };
    if nnodes > 1 && t.rdzv_endpoint.is_none() {
        let at = t.nnodes.as_ref().expect("nnodes > 1 was written");
        cx.err(at, format!(
            "nnodes = {nnodes} needs rdzv_endpoint = \"HOST:PORT\" (the rendezvous every node joins)"
        ));
    }
    let max_restarts = match &t.max_restarts {
        Some(m) if m.value < 0 || m.value > i64::from(u32::MAX) => {
            cx.err(
                m,
                format!("torchrun max_restarts = {}: must be 0 or more", m.value),
            );
            None
        }
        Some(m) => Some(m.value as u32),
        None => None,
    };
    let program = match &t.program {
        Some(p) => argv_value(cx, p, "torchrun program")?,
        None => vec!["torchrun".into()],
    };
    let module = t.module.unwrap_or(false);
    let no_python = t.no_python.unwrap_or(false);
    if module && no_python {
        cx.err(t_at, "module and no_python cannot both be true");
    }
    let python_first = match command {
        Some((CommandSpec::Argv(argv), at)) if !module && !no_python && is_python(&argv[0]) => {
            Some((argv[0].clone(), at))
        }
        _ => None,
    };
    if let Some((program, at)) = python_first {
        cx.err(at, format!(
            "with launcher = \"torchrun\", command is the script and its arguments (torchrun runs Python itself): drop {program:?}"
        ));
    }
    Some(Launcher::Torchrun(TorchrunSpec {
        nproc_per_node: nproc?,
        nnodes,
        standalone,
        rdzv_backend: t.rdzv_backend.clone(),
        rdzv_endpoint: t.rdzv_endpoint.clone(),
        rdzv_id: t.rdzv_id.clone(),
        max_restarts,
        module,
        no_python,
        program,
        args: t.args.clone().unwrap_or_default(),
    }))
}
