//! What the package ships comes from the binary and stays true to it: `--version` names the
//! commit and the profile; the completion scripts name every subcommand, and bash's completes
//! subcommands, runs (from the daemon, else the run directories), profiles and themes when
//! sourced; the man pages have a page per subcommand holding each of its options; the Python
//! SDK is the binary's version and says clearly when its daemon speaks another protocol.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::home::Home;
use crate::support::peers::missing;
use crate::support::wait::finish;
use clap::CommandFactory as _;
use gpupilot::cli::Cli;

const BIN: &str = env!("CARGO_BIN_EXE_gpupilot");

fn stdout_of(args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "gpupilot {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Every visible subcommand path below the top: `["power", "cap"]`, with its command.
fn subcommands() -> Vec<(Vec<String>, clap::Command)> {
    fn walk(cmd: &clap::Command, path: &[String], out: &mut Vec<(Vec<String>, clap::Command)>) {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            if sub.get_name() == "help" {
                continue;
            }
            let mut p = path.to_vec();
            p.push(sub.get_name().to_string());
            out.push((p.clone(), sub.clone()));
            walk(sub, &p, out);
        }
    }
    let mut cmd = Cli::command();
    cmd.build();
    let mut out = Vec::new();
    walk(&cmd, &[], &mut out);
    out
}

#[test]
fn version_names_the_commit_and_the_profile() {
    let line = stdout_of(&["--version"]);
    let version = env!("CARGO_PKG_VERSION");
    let rest = line
        .trim()
        .strip_prefix(&format!("gpupilot {version} ("))
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or_else(|| panic!("{line}"));
    // The profile is the name of the directory the binary was built into.
    let profile = Path::new(BIN)
        .parent()
        .and_then(Path::file_name)
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let (commit, built) = match rest.rsplit_once(", ") {
        Some((commit, built)) => (Some(commit), built),
        None => (None, rest),
    };
    assert_eq!(built, profile, "{line}");
    let top = env!("CARGO_MANIFEST_DIR");
    let in_git = Command::new("git")
        .args(["-C", top, "rev-parse", "--show-toplevel"])
        .output()
        .is_ok_and(|o| o.status.success());
    if in_git {
        // `abc1234 2026-12-01`: a commit of this repository and its date.
        let commit = commit.unwrap_or_else(|| panic!("no commit in {line}"));
        let (hash, date) = commit.split_once(' ').unwrap();
        assert!(
            hash.len() >= 7 && hash.bytes().all(|b| b.is_ascii_hexdigit()),
            "{line}"
        );
        assert!(date.len() == 10 && date.as_bytes()[4] == b'-', "{line}");
        let known = Command::new("git")
            .args(["-C", top, "cat-file", "-e", &format!("{hash}^{{commit}}")])
            .status()
            .unwrap();
        assert!(known.success(), "{hash} is not a commit here: {line}");
    }
    // Subcommands say the same.
    assert_eq!(
        stdout_of(&["status", "--version"]),
        line.replace("gpupilot ", "gpupilot-status ")
    );
}

#[test]
fn completions_for_each_shell_name_every_subcommand() {
    let top: Vec<String> = subcommands()
        .into_iter()
        .filter(|(p, _)| p.len() == 1)
        .map(|(p, _)| p[0].clone())
        .collect();
    assert!(top.len() > 20 && top.contains(&"completions".to_string()));
    for shell in ["bash", "zsh", "fish"] {
        let script = stdout_of(&["completions", shell]);
        for name in &top {
            assert!(script.contains(name.as_str()), "{shell}: no {name}");
        }
        assert!(script.contains("complete-values"), "{shell}");
    }
    let bash = stdout_of(&["completions", "bash"]);
    for key in [
        " logs#0=runs ",
        " tune/energy#0=runs ",
        " run#0=profiles ",
        " --theme=themes ",
    ] {
        assert!(bash.contains(key), "bash: no {key}");
    }
    let zsh = stdout_of(&["completions", "zsh"]);
    assert!(zsh.starts_with("#compdef gpupilot"));
    assert!(zsh.contains(
        ":run -- An id, a unique id prefix, a run name (or name\\:NAME), or `last`:_gpupilot_values_runs'"
    ));
    let fish = stdout_of(&["completions", "fish"]);
    assert!(fish.contains(
        "complete -c gpupilot -n \"__fish_seen_subcommand_from tune; and __fish_seen_subcommand_from energy\" -f -a \"(__gpupilot_values runs)\""
    ));
    assert!(fish.contains("-l theme") && fish.contains("(__gpupilot_values themes)"));
    assert!(
        Command::new(BIN)
            .args(["completions", "tcsh"])
            .output()
            .is_ok_and(|o| !o.status.success())
    );
}

/// What bash's completion offers for `words` (the last one being completed), the script
/// sourced in a non-interactive `bash` with GPUPILOT_HOME set to `home`.
fn bash_complete(script: &Path, home: &Path, cwd: &Path, cases: &[&[&str]]) -> Vec<Vec<String>> {
    let mut program = format!("source {}\n", shell_quote(&script.display().to_string()));
    for words in cases {
        let quoted: Vec<String> = std::iter::once(BIN)
            .chain(words.iter().copied())
            .map(shell_quote)
            .collect();
        program.push_str(&format!(
            "COMP_WORDS=({})\nCOMP_CWORD=$((${{#COMP_WORDS[@]}} - 1))\nCOMPREPLY=()\n\
             _gpupilot_with_values \"${{COMP_WORDS[0]}}\" \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"\n\
             printf '%s\\n' \"${{COMPREPLY[@]}}\"\necho '--end--'\n",
            quoted.join(" ")
        ));
    }
    let out = captured(
        Command::new("bash")
            .args(["--norc", "--noprofile", "-c", &program])
            .env("GPUPILOT_HOME", home)
            .env_remove("GPUPILOT_SYSTEM")
            .current_dir(cwd),
        "bash completing",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let replies: Vec<Vec<String>> = text
        .split("--end--\n")
        .map(|block| {
            let mut words: Vec<String> = block
                .lines()
                .filter(|l| !l.is_empty())
                .map(String::from)
                .collect();
            words.sort();
            words
        })
        .take(cases.len())
        .collect();
    assert_eq!(replies.len(), cases.len(), "{text}");
    replies
}

/// Run `cmd` to the end (at most 30 s) with no stdin and its output captured.
fn captured(cmd: &mut Command, what: &str) -> std::process::Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    finish(child, what, Duration::from_secs(30))
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn sorted(words: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = words.iter().map(|w| w.to_string()).collect();
    v.sort();
    v
}

#[test]
fn bash_completes_subcommands_runs_profiles_and_themes() {
    let home = Home::new();
    let script = home.dir.path().join("gpupilot.bash");
    std::fs::write(&script, stdout_of(&["completions", "bash"])).unwrap();
    let cwd = home.dir.path().join("work");
    std::fs::create_dir_all(&cwd).unwrap();
    std::fs::write(cwd.join("local.toml"), "").unwrap();
    std::fs::write(cwd.join("notes.txt"), "").unwrap();
    let profiles = home.paths.config.join("profiles");
    std::fs::create_dir_all(&profiles).unwrap();
    std::fs::write(profiles.join("mine.toml"), "").unwrap();
    std::fs::create_dir_all(home.paths.config.join("themes")).unwrap();
    std::fs::write(home.paths.config.join("themes/solar.toml"), "").unwrap();
    let mine = profiles.join("mine.toml").display().to_string();

    // No daemon: runs come from the run directories.
    let runs = home.paths.state.join("runs");
    std::fs::create_dir_all(runs.join("20261130-041500-train")).unwrap();
    std::fs::create_dir_all(runs.join("20261201-090000-eval")).unwrap();
    // As the daemon makes them, which it checks.
    for dir in [&home.paths.state, &runs] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    let got = bash_complete(
        &script,
        &home.root(),
        &cwd,
        &[
            &["st"],
            &["power", "c"],
            &["logs", ""],
            &["--source", "sim", "stop", "20261130"],
            &["--source=sim", "tune", "energy", "ev"],
            &["--theme", ""],
            &["--theme", "=", "so"],
            &["status", "--theme", "l"],
            &["run", ""],
            &["profile", "check", "lo"],
            &["logs", "--f"],
            &["run", "--", "bas"],
            &["run", "--", "bash", "loc"],
        ],
    );
    assert_eq!(got[0], sorted(&["status", "stop"]));
    assert_eq!(got[1], sorted(&["cap"]));
    assert_eq!(
        got[2],
        sorted(&[
            "20261130-041500-train",
            "20261201-090000-eval",
            "train",
            "eval",
            "last"
        ])
    );
    assert_eq!(got[3], sorted(&["20261130-041500-train"]));
    assert_eq!(got[4], sorted(&["eval"]));
    assert_eq!(
        got[5],
        sorted(&["dark", "light", "high-contrast", "mono", "solar"])
    );
    assert_eq!(got[6], sorted(&["solar"]));
    assert_eq!(got[7], sorted(&["light"]));
    assert_eq!(got[8], sorted(&[mine.as_str(), "local.toml"]));
    assert_eq!(got[9], sorted(&["local.toml"]));
    assert_eq!(got[10], sorted(&["--follow"]));
    // After `--`: a command, then what bash offers by default (files).
    assert!(got[11].contains(&"bash".to_string()), "{:?}", got[11]);
    assert_eq!(got[12], Vec::<String>::new());

    // With a daemon, runs are the daemon's: a directory it does not know is not offered.
    let _daemon = home.daemon(&[]);
    let id = home
        .ok(&["run", "--detach", "--name", "quick", "--", "true"])
        .trim()
        .to_string();
    std::fs::create_dir_all(runs.join("20200101-000000-ghost")).unwrap();
    let got = bash_complete(&script, &home.root(), &cwd, &[&["attach", ""]]);
    assert!(
        got[0].contains(&id) && got[0].contains(&"quick".to_string()),
        "{got:?}"
    );
    assert!(!got[0].iter().any(|w| w.contains("ghost")), "{got:?}");
}

/// Whether `shell` is installed; when it is not, the test says so, and fails where CI has
/// installed it (GPUPILOT_REQUIRE_PEERS=1, `.ci/run`).
fn have_shell(shell: &str) -> bool {
    let found = Command::new(shell)
        .args(["-c", "exit 0"])
        .stdin(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        missing(&format!("{shell} is not installed"));
    }
    found
}

#[test]
fn zsh_reads_its_script_and_fish_completes_runs_and_themes() {
    let home = Home::new();
    if have_shell("zsh") {
        let script = home.dir.path().join("_gpupilot");
        std::fs::write(&script, stdout_of(&["completions", "zsh"])).unwrap();
        let out = Command::new("zsh").arg("-n").arg(&script).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    if !have_shell("fish") {
        return;
    }
    let script = home.dir.path().join("gpupilot.fish");
    std::fs::write(&script, stdout_of(&["completions", "fish"])).unwrap();
    std::fs::create_dir_all(home.paths.state.join("runs/20261130-041500-train")).unwrap();
    let program = format!(
        "source {script}; complete -C '{BIN} logs '; echo --end--; complete -C '{BIN} --theme '; \
         echo --end--; complete -C '{BIN} tune energy t'",
        script = shell_quote(&script.display().to_string())
    );
    let out = captured(
        Command::new("fish")
            .args(["--no-config", "-c", &program])
            .env("GPUPILOT_HOME", home.root())
            .env_remove("GPUPILOT_SYSTEM"),
        "fish completing",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let blocks: Vec<Vec<&str>> = text
        .split("--end--\n")
        .map(|b| {
            b.lines()
                .map(|l| l.split('\t').next().unwrap_or(l))
                .collect()
        })
        .collect();
    assert_eq!(
        blocks.len(),
        3,
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        blocks[0],
        ["20261130-041500-train", "last", "train"],
        "{text}"
    );
    assert_eq!(
        blocks[1],
        ["dark", "high-contrast", "light", "mono"],
        "{text}"
    );
    assert_eq!(blocks[2], ["train"], "{text}");
}

#[test]
fn man_pages_have_a_page_per_subcommand_with_each_option() {
    let dir = tempfile::tempdir().unwrap();
    let listed = stdout_of(&["man", &dir.path().display().to_string()]);
    let top = std::fs::read_to_string(dir.path().join("gpupilot.1")).unwrap();
    assert!(top.contains(".TH gpupilot 1"), "{top}");
    assert!(top.contains(env!("CARGO_PKG_VERSION")));
    let mut expected = vec!["gpupilot.1".to_string()];
    for (path, cmd) in subcommands() {
        let name = format!("gpupilot-{}.1", path.join("-"));
        let page = std::fs::read_to_string(dir.path().join(&name))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
            // roff escapes every hyphen: `\-\-nvml\-lib`.
            let shown = match (arg.get_long(), arg.get_value_names()) {
                (Some(long), _) => format!("\\-\\-{}", long.replace('-', "\\-")),
                (None, Some(names)) => names[0].replace('-', "\\-"),
                (None, None) => continue,
            };
            assert!(page.contains(&shown), "{name} lacks {shown}");
        }
        expected.push(name);
    }
    let mut written: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    written.sort();
    expected.sort();
    assert_eq!(
        written, expected,
        "one page per visible subcommand, no more"
    );
    assert_eq!(listed.lines().count(), expected.len());
    assert!(!written.iter().any(|w| w.contains("complete-values")));
    // Without DIR: the top page on stdout.
    assert_eq!(stdout_of(&["man"]), top);
}

#[test]
fn the_python_sdk_is_the_binary_version() {
    let init = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("python/gpupilot/__init__.py"),
    )
    .unwrap();
    let version = init
        .lines()
        .find_map(|l| l.strip_prefix("__version__ = \""))
        .and_then(|rest| rest.strip_suffix('"'))
        .expect("__version__ = \"…\" in python/gpupilot/__init__.py");
    assert_eq!(
        version,
        env!("CARGO_PKG_VERSION"),
        "the Python SDK's __version__ must be the workspace version of Cargo.toml"
    );
}

#[test]
fn an_sdk_of_another_protocol_version_and_the_daemon_both_say_so() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    // This SDK, made to speak protocol version 2 to a daemon of version 1.
    let script = "
import logging, sys, time
logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format='%(message)s')
from gpupilot import _channel
_channel.PROTOCOL_VERSION = 2
import gpupilot
gp = gpupilot.connect(knobs={'batch_size': 8})
gp.report(step=1)
# Long enough for a few retries (0.2 s, 0.4 s, 0.8 s apart): the warning is said once.
time.sleep(1.5)
gp.close(0.2)
";
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let out = captured(
        Command::new(python)
            .args(["-c", script])
            .env(
                "PYTHONPATH",
                Path::new(env!("CARGO_MANIFEST_DIR")).join("python"),
            )
            .env("GPUPILOT_SOCKET", home.socket())
            .env("GPUPILOT_RUN_ID", "20261130-041500-train"),
        "the SDK",
    );
    let said = String::from_utf8_lossy(&out.stderr);
    let release = env!("CARGO_PKG_VERSION");
    // The SDK: what it speaks, what the daemon said, and what to do.
    assert!(
        said.contains(&format!(
            "this SDK (gpupilot-python {release}) speaks protocol version 2"
        )),
        "{said}"
    );
    assert!(
        said.contains(&format!("this daemon (gpupilot {release}, pid")),
        "{said}"
    );
    assert!(said.contains("speaks version 1"), "{said}");
    assert!(
        said.contains("Install the SDK of the daemon's gpupilot release"),
        "{said}"
    );
    assert_eq!(
        said.matches("speaks protocol version 2").count(),
        1,
        "said once: {said}"
    );
    // The daemon's log names the client and its version.
    let log = std::fs::read_to_string(home.paths.state.join("daemon.log")).unwrap();
    assert!(
        log.contains("protocol version mismatch")
            && log.contains(&format!("the client (gpupilot-python {release}) 2")),
        "{log}"
    );
}
