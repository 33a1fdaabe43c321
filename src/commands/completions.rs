//! `gpupilot completions SHELL`: completion scripts for bash, zsh and fish, and `gpupilot
//! complete-values KIND` (hidden), the values they complete beyond the command line's own words.
//!
//! The subcommands and options come from clap_complete over [`Cli`]'s definitions, so they
//! cannot drift from `--help`. What clap cannot know is added here: the arguments that name a
//! run, a profile file or a theme ([`dynamic_args`]) complete with the values `complete-values`
//! prints, which the scripts ask the binary being completed for at TAB time. A run is asked of
//! the daemon, bounded by [`DAEMON_BUDGET`] and never starting one; without an answer, the run
//! directories are read instead. Nothing here may block a shell for long or print to stderr.
//!
//! How each shell gets them: zsh and fish from clap_complete's own script, where a dynamic
//! argument is given a single placeholder value ([`placeholder`]) that is then replaced by a
//! call to `complete-values`; bash from a function wrapped around clap_complete's, which finds
//! the argument under the cursor (clap's bash script does not track positions) and otherwise
//! hands over.

use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use clap::CommandFactory as _;

use crate::cli::{Cli, CompleteKind, CompletionShell};
use crate::config::Paths;

/// The longest a completion waits for the daemon's run list before reading the run directories.
pub const DAEMON_BUDGET: Duration = Duration::from_millis(500);

/// `gpupilot completions SHELL`: print the script.
pub fn completions(shell: CompletionShell) -> anyhow::Result<ExitCode> {
    super::out(&script(shell))?;
    Ok(ExitCode::SUCCESS)
}

/// `gpupilot complete-values KIND`: one value a line; nothing (and status 0) when there is
/// nothing to offer, since a completion has no one to tell.
pub fn values(kind: CompleteKind) -> anyhow::Result<ExitCode> {
    let paths = Paths::from_env();
    let values = match kind {
        CompleteKind::Runs => run_values(&paths),
        CompleteKind::Profiles => profile_values(&paths),
        CompleteKind::Themes => theme_values(&paths),
    };
    let mut text = String::new();
    for v in values {
        // A value with a newline would be two values to the shell.
        if !v.contains(['\n', '\r']) {
            text.push_str(&v);
            text.push('\n');
        }
    }
    super::out(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// One argument whose values come from `complete-values`: the subcommand path it belongs to
/// (`["tune", "energy"]`), and either the index of the positional or the option's long name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DynamicArg {
    pub path: Vec<String>,
    pub at: Position,
    pub kind: CompleteKind,
}

/// Where a dynamic value goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Position {
    /// The n-th positional argument of the subcommand (0 first).
    Positional(usize),
    /// The value of `--NAME` (global options are listed once, at the top).
    Option(String),
}

/// What a completion offers for an argument, by what the argument holds: a run (`RUN`), a
/// profile file (`run PROFILE.toml`, `profile check FILE`), a theme (`--theme`). Anything
/// else is left to clap_complete.
fn kind_of(path: &[String], arg: &clap::Arg) -> Option<CompleteKind> {
    if arg.get_long() == Some("theme") {
        return Some(CompleteKind::Themes);
    }
    let value_name = arg.get_value_names()?.first()?.as_str();
    match value_name {
        "RUN" => Some(CompleteKind::Runs),
        "PROFILE.toml" => Some(CompleteKind::Profiles),
        "FILE" if path == ["profile", "check"] => Some(CompleteKind::Profiles),
        _ => None,
    }
}

/// Every dynamic argument of the command line, found by walking its definitions.
pub fn dynamic_args() -> Vec<DynamicArg> {
    fn walk(cmd: &clap::Command, path: &mut Vec<String>, out: &mut Vec<DynamicArg>) {
        for (i, arg) in cmd.get_positionals().enumerate() {
            if let Some(kind) = kind_of(path, arg) {
                out.push(DynamicArg {
                    path: path.clone(),
                    at: Position::Positional(i),
                    kind,
                });
            }
        }
        for arg in cmd.get_opts() {
            // A global option is declared on the top command only (not yet propagated).
            if let (Some(kind), Some(long)) = (kind_of(path, arg), arg.get_long()) {
                out.push(DynamicArg {
                    path: path.clone(),
                    at: Position::Option(long.to_string()),
                    kind,
                });
            }
        }
        for sub in cmd.get_subcommands() {
            path.push(sub.get_name().to_string());
            walk(sub, path, out);
            path.pop();
        }
    }
    let mut out = Vec::new();
    walk(&Cli::command(), &mut Vec::new(), &mut out);
    out
}

/// The script for `shell`.
pub fn script(shell: CompletionShell) -> String {
    let dynamic = dynamic_args();
    match shell {
        CompletionShell::Bash => bash(&generate(clap_complete::Shell::Bash, &[]), &dynamic),
        CompletionShell::Zsh => zsh(&generate(clap_complete::Shell::Zsh, &dynamic)),
        CompletionShell::Fish => fish(&generate(clap_complete::Shell::Fish, &dynamic), &dynamic),
    }
}

/// The single possible value a dynamic argument gets while clap_complete writes a script: a
/// word no real value is, replaced afterwards by the shell's call to `complete-values`.
fn placeholder(kind: CompleteKind) -> &'static str {
    match kind {
        CompleteKind::Runs => "gpupilot__dynamic__runs",
        CompleteKind::Profiles => "gpupilot__dynamic__profiles",
        CompleteKind::Themes => "gpupilot__dynamic__themes",
    }
}

const KINDS: [(CompleteKind, &str); 3] = [
    (CompleteKind::Runs, "runs"),
    (CompleteKind::Profiles, "profiles"),
    (CompleteKind::Themes, "themes"),
];

/// clap_complete's script for `shell`, with `marked` arguments given their placeholder value.
fn generate(shell: clap_complete::Shell, marked: &[DynamicArg]) -> String {
    let mut cmd = Cli::command();
    for d in marked {
        cmd = mark(cmd, &d.path, &d.at, placeholder(d.kind));
    }
    let mut buf = Vec::new();
    clap_complete::generate(shell, &mut cmd, "gpupilot", &mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

fn mark(cmd: clap::Command, path: &[String], at: &Position, value: &'static str) -> clap::Command {
    if let Some((first, rest)) = path.split_first() {
        return cmd.mut_subcommand(first.as_str(), |sub| mark(sub, rest, at, value));
    }
    let id = match at {
        Position::Positional(i) => cmd.get_positionals().nth(*i).map(|a| a.get_id().clone()),
        Position::Option(long) => cmd
            .get_opts()
            .find(|a| a.get_long() == Some(long.as_str()))
            .map(|a| a.get_id().clone()),
    };
    match id {
        Some(id) => cmd.mut_arg(id, |a| {
            a.value_parser(clap::builder::PossibleValuesParser::new([value]))
        }),
        None => cmd,
    }
}

/// The shell word for `complete-values KIND` run by the binary being completed.
fn kind_word(kind: CompleteKind) -> &'static str {
    KINDS
        .iter()
        .find(|(k, _)| *k == kind)
        .map_or("runs", |(_, w)| w)
}

/// zsh: each placeholder becomes a function that offers `complete-values`' lines.
fn zsh(base: &str) -> String {
    let mut text = base.to_string();
    for (kind, word) in KINDS {
        // clap_complete writes possible values as `(a b c)`, here one placeholder.
        text = text.replace(
            &format!("({})", placeholder(kind)),
            &format!("_gpupilot_values_{word}"),
        );
    }
    let helpers = r#"
# Values beyond the command line's words (run ids and names, profiles, themes), from the
# gpupilot being completed: `gpupilot complete-values KIND`, bounded and never starting a daemon.
_gpupilot_values() {
    # The command line as typed: under a subcommand, $words starts at the subcommand.
    local -a line
    line=(${(z)BUFFER})
    local exe=${line[1]} system=
    (( ${line[(I)--system]} )) && system=--system
    local -a vals
    vals=(${(f)"$(${~exe} $system complete-values $1 2>/dev/null)"})
    # _describe reads `value:description`: a colon in a value is not a separator.
    vals=(${vals//:/\\:})
    _describe -t $1 $1 vals
}
_gpupilot_values_runs() { _gpupilot_values runs }
_gpupilot_values_themes() { _gpupilot_values themes }
_gpupilot_values_profiles() {
    _alternative 'profiles:your profiles:_gpupilot_values profiles' 'files:profile file:_files -g "*.toml(-.)"'
}
"#;
    // Defined before the script's last lines, which call `_gpupilot` when zsh loads the file.
    match text.rfind("\nif [ \"$funcstack[1]\" = \"_gpupilot\" ]") {
        Some(at) => {
            text.insert_str(at, helpers);
            text
        }
        None => text + helpers,
    }
}

/// fish: an option's placeholder becomes a call to `complete-values`; positionals, which
/// clap_complete does not write for fish, get a line each.
fn fish(base: &str, dynamic: &[DynamicArg]) -> String {
    let mut text = base.to_string();
    for (kind, word) in KINDS {
        // clap_complete writes a possible value with its (empty) description: `-a "v\t''"`.
        text = text.replace(
            &format!("\"{}\\t''\"", placeholder(kind)),
            &format!("\"(__gpupilot_values {word})\""),
        );
    }
    text.push_str(
        r#"
# Values beyond the command line's words (run ids and names, profiles, themes), from the
# gpupilot being completed: `gpupilot complete-values KIND`, bounded and never starting a daemon.
function __gpupilot_values
    set -l words (commandline -opc)
    set -l system
    contains -- --system $words; and set system --system
    $words[1] $system complete-values $argv[1] 2>/dev/null
end
"#,
    );
    for d in dynamic {
        let word = kind_word(d.kind);
        match &d.at {
            Position::Positional(_) => {
                let seen: Vec<String> = d
                    .path
                    .iter()
                    .map(|p| format!("__fish_seen_subcommand_from {p}"))
                    .collect();
                let files = if d.kind == CompleteKind::Profiles {
                    " -F"
                } else {
                    " -f"
                };
                let _ = writeln!(
                    text,
                    "complete -c gpupilot -n \"{}\"{files} -a \"(__gpupilot_values {word})\"",
                    seen.join("; and ")
                );
            }
            // clap_complete's line for an option before any subcommand holds only once the
            // option has its value (fish's argparse refuses `--theme` alone): one that always
            // holds.
            Position::Option(long) => {
                let _ = writeln!(
                    text,
                    "complete -c gpupilot -l {long} -r -f -a \"(__gpupilot_values {word})\""
                );
            }
        }
    }
    text
}

/// bash: a function around clap_complete's `_gpupilot` that completes a dynamic argument
/// itself and hands everything else over. The words before the cursor are walked with the
/// command line's subcommand paths and its options that take a value, both written into the
/// script from the definitions.
fn bash(base: &str, dynamic: &[DynamicArg]) -> String {
    let mut cmd = Cli::command();
    cmd.build();
    let mut commands = Vec::new();
    let mut value_opts = Vec::new();
    collect_words(&cmd, &mut Vec::new(), &mut commands, &mut value_opts);
    value_opts.sort();
    value_opts.dedup();
    let mut table = String::new();
    for d in dynamic {
        let key = match &d.at {
            Position::Positional(i) => format!("{}#{i}", d.path.join("/")),
            Position::Option(long) => format!("--{long}"),
        };
        let _ = write!(table, " {key}={}", kind_word(d.kind));
    }
    let mut text = base.to_string();
    let _ = write!(
        text,
        r#"
# Values beyond the command line's words (run ids and names, profiles, themes), from the
# gpupilot being completed: `gpupilot complete-values KIND`, bounded and never starting a daemon.
_gpupilot_commands=' {commands} '
_gpupilot_value_options=' {value_opts} '
_gpupilot_dynamic='{table} '

_gpupilot_values() {{
    local exe=${{COMP_WORDS[0]}} system=
    [[ $exe == \~/* ]] && exe=$HOME/${{exe#\~/}}
    [[ " ${{COMP_WORDS[*]}} " == *" --system "* ]] && system=--system
    "$exe" $system complete-values "$1" 2>/dev/null
}}

_gpupilot_with_values() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}} prev=${{COMP_WORDS[COMP_CWORD-1]}}
    local i w path= npos=0 skip=0 key= kind=
    # `--theme=d` is three words to bash: --theme, =, d.
    if [[ $prev == = && $COMP_CWORD -ge 2 ]]; then
        prev=${{COMP_WORDS[COMP_CWORD-2]}}
    fi
    for ((i = 1; i < COMP_CWORD; i++)); do
        w=${{COMP_WORDS[i]}}
        if ((skip)); then
            skip=0
            [[ $w == = ]] && skip=1
            continue
        fi
        case $w in
            --) npos=-$((COMP_CWORD - i)); break ;;
            -*=*) ;;
            -*) [[ $_gpupilot_value_options == *" $w "* ]] && skip=1 ;;
            *)
                if [[ $_gpupilot_commands == *" ${{path:+$path/}}$w "* ]]; then
                    path=${{path:+$path/}}$w
                else
                    ((npos++))
                fi
                ;;
        esac
    done
    # After `--`: the command a run or ranks starts (its name, then files).
    if ((npos == -1)); then
        COMPREPLY=($(compgen -c -- "$cur"))
        return 0
    elif ((npos < 0)); then
        COMPREPLY=()
        return 0
    fi
    if [[ $prev == --* && $_gpupilot_value_options == *" $prev "* ]]; then
        key=$prev
    elif [[ $cur != -* ]]; then
        key=$path#$npos
    fi
    if [[ -n $key && $_gpupilot_dynamic == *" $key="* ]]; then
        kind=${{_gpupilot_dynamic#* $key=}}
        kind=${{kind%% *}}
        local IFS=$'\n'
        COMPREPLY=($(compgen -W "$(_gpupilot_values "$kind")" -- "$cur"))
        if [[ $kind == profiles ]]; then
            COMPREPLY+=($(compgen -f -X '!*.toml' -- "$cur") $(compgen -d -- "$cur"))
            compopt -o filenames 2>/dev/null
        fi
        return 0
    fi
    _gpupilot "$@"
}}

complete -F _gpupilot_with_values -o bashdefault -o default gpupilot
"#,
        commands = commands.join(" "),
        value_opts = value_opts.join(" "),
    );
    text
}

/// Every subcommand path (`tune/energy`) and every option that takes a value (`--gpu`, `-x`).
fn collect_words(
    cmd: &clap::Command,
    path: &mut Vec<String>,
    commands: &mut Vec<String>,
    value_opts: &mut Vec<String>,
) {
    for arg in cmd.get_opts() {
        if let Some(long) = arg.get_long() {
            value_opts.push(format!("--{long}"));
        }
        if let Some(short) = arg.get_short() {
            value_opts.push(format!("-{short}"));
        }
    }
    for sub in cmd.get_subcommands() {
        path.push(sub.get_name().to_string());
        commands.push(path.join("/"));
        collect_words(sub, path, commands, value_opts);
        path.pop();
    }
}

/// Run ids and names, newest first, then `last`: from the daemon within [`DAEMON_BUDGET`], else
/// from the run directories (whose names are the ids).
fn run_values(paths: &Paths) -> Vec<String> {
    let ids = runs_from_daemon(paths).unwrap_or_else(|| runs_from_dirs(&paths.state));
    let mut values: Vec<String> = ids.clone();
    for id in &ids {
        if let Some(name) = name_of(id) {
            if !values.iter().any(|v| v == name) {
                values.push(name.to_string());
            }
        }
    }
    values.push("last".into());
    values
}

/// The daemon's run ids, newest first, or None when no daemon answers within the budget. The
/// client runs on a thread of its own: a daemon that accepts but does not answer costs the
/// budget, not the shell's patience (the process ends, and the thread with it).
fn runs_from_daemon(paths: &Paths) -> Option<Vec<String>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let paths = paths.clone();
    std::thread::Builder::new()
        .name("complete-runs".into())
        .spawn(move || {
            let runs = super::connect(&paths)
                .ok()
                .map(|c| c.with_timeout(DAEMON_BUDGET))
                .and_then(|c| c.runs().ok());
            let _ = tx.send(runs);
        })
        .ok()?;
    let runs = rx.recv_timeout(DAEMON_BUDGET).ok()??;
    // `runs` lists the oldest first.
    Some(runs.into_iter().rev().map(|r| r.id).collect())
}

/// Run ids from `$STATE/runs`, newest first (ids begin with their start time).
fn runs_from_dirs(state: &Path) -> Vec<String> {
    let mut ids: Vec<String> = std::fs::read_dir(state.join("runs"))
        .map(|dir| {
            dir.filter_map(Result::ok)
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|id| name_of(id).is_some())
                .collect()
        })
        .unwrap_or_default();
    ids.sort_unstable_by(|a, b| b.cmp(a));
    ids
}

/// The name part of a run id `YYYYMMDD-HHMMSS-NAME`.
fn name_of(id: &str) -> Option<&str> {
    let (date, rest) = id.split_once('-')?;
    let (time, name) = rest.split_once('-')?;
    let digits = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit());
    (digits(date, 8) && digits(time, 6) && !name.is_empty()).then_some(name)
}

/// The profile files in `$CONFIG/profiles`, as paths `run` takes.
fn profile_values(paths: &Paths) -> Vec<String> {
    let mut files: Vec<String> = toml_files(&paths.config.join("profiles"))
        .into_iter()
        .map(|(_, path)| path)
        .collect();
    files.sort();
    files
}

/// The shipped themes, then those in `$CONFIG/themes` (by name).
fn theme_values(paths: &Paths) -> Vec<String> {
    let mut names: Vec<String> = crate::config::theme::PRESETS
        .iter()
        .map(|(name, _)| name.to_string())
        .collect();
    let mut own: Vec<String> = toml_files(&paths.config.join("themes"))
        .into_iter()
        .map(|(stem, _)| stem)
        .filter(|s| !names.contains(s))
        .collect();
    own.sort();
    names.extend(own);
    names
}

/// `(stem, path)` of the `.toml` files in `dir`; none when it cannot be read.
fn toml_files(dir: &Path) -> Vec<(String, String)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let path = e.path();
            if path.extension()? != "toml" || !path.is_file() {
                return None;
            }
            let stem = path.file_stem()?.to_str()?.to_string();
            Some((stem, path.to_str()?.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_names_come_from_ids() {
        assert_eq!(name_of("20261130-041500-train"), Some("train"));
        assert_eq!(name_of("20261130-041500-loop-12"), Some("loop-12"));
        assert_eq!(name_of("20261130-041500-"), None);
        assert_eq!(name_of("2026113-041500-x"), None);
        assert_eq!(name_of("notes"), None);
    }

    #[test]
    fn every_run_argument_is_dynamic() {
        let d = dynamic_args();
        let runs: Vec<String> = d
            .iter()
            .filter(|a| a.kind == CompleteKind::Runs)
            .map(|a| a.path.join(" "))
            .collect();
        for cmd in ["attach", "logs", "stop", "set", "report", "tune energy"] {
            assert!(runs.contains(&cmd.to_string()), "{cmd}: {runs:?}");
        }
        assert!(d.contains(&DynamicArg {
            path: vec!["events".into()],
            at: Position::Option("run".into()),
            kind: CompleteKind::Runs
        }));
        assert!(d.contains(&DynamicArg {
            path: vec!["run".into()],
            at: Position::Positional(0),
            kind: CompleteKind::Profiles
        }));
        assert!(d.contains(&DynamicArg {
            path: vec!["profile".into(), "check".into()],
            at: Position::Positional(0),
            kind: CompleteKind::Profiles
        }));
        assert!(d.contains(&DynamicArg {
            path: vec![],
            at: Position::Option("theme".into()),
            kind: CompleteKind::Themes
        }));
    }

    #[test]
    fn placeholders_are_all_replaced() {
        for shell in [
            CompletionShell::Bash,
            CompletionShell::Zsh,
            CompletionShell::Fish,
        ] {
            let text = script(shell);
            assert!(!text.contains("gpupilot__dynamic__"), "{shell:?}");
            assert!(text.contains("complete-values"), "{shell:?}");
        }
    }

    #[test]
    fn run_directories_give_ids_newest_first() {
        let tmp = tempfile::tempdir().unwrap();
        for d in ["20261130-041500-train", "20261201-090000-eval", "not-a-run"] {
            std::fs::create_dir_all(tmp.path().join("runs").join(d)).unwrap();
        }
        std::fs::write(tmp.path().join("runs/20261202-000000-file"), "").unwrap();
        assert_eq!(
            runs_from_dirs(tmp.path()),
            ["20261201-090000-eval", "20261130-041500-train"]
        );
    }
}
