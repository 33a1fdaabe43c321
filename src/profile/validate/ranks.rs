//! `launcher = "ranks"` and `[run.ranks]`: N local ranks that gpupilot starts itself with
//! torchrun's environment.

use super::Ctx;
use crate::profile::raw::{At, LauncherKind, RawRanks, RawRun};
use crate::profile::{GpuSelection, Launcher, RanksSpec};

/// `[run.ranks]` where the launcher is not `"ranks"`.
pub(super) fn misplaced(cx: &mut Ctx, run: &RawRun, kind: LauncherKind) {
    if kind == LauncherKind::Ranks {
        return;
    }
    if let Some(r) = &run.ranks {
        cx.err(
            r,
            "[run.ranks] is set but launcher is not \"ranks\": add launcher = \"ranks\" under [run], or remove [run.ranks]",
        );
    }
}

pub(super) fn launcher(cx: &mut Ctx, run: &RawRun, gpus: &GpuSelection) -> Option<Launcher> {
    let launcher_at = run.launcher.as_ref().expect("ranks was named");
    if let Some(t) = &run.torchrun {
        cx.err(t, "[run.torchrun] does not apply to launcher = \"ranks\": gpupilot starts the ranks itself; say how many with nproc = N under [run.ranks]");
    }
    let Some(r_at) = &run.ranks else {
        cx.err(launcher_at, "launcher = \"ranks\" needs the number of ranks (usually one per GPU): add [run.ranks] with nproc = N");
        return None;
    };
    spec(cx, r_at, gpus).map(Launcher::Ranks)
}

fn spec(cx: &mut Ctx, r_at: &At<RawRanks>, gpus: &GpuSelection) -> Option<RanksSpec> {
    let r = &r_at.value;
    let max = RanksSpec::MAX_NPROC;
    let nproc =
        match &r.nproc {
            None => {
                cx.err(
                r_at,
                "[run.ranks] needs nproc = N (ranks to start on this node, usually one per GPU)",
            );
                None
            }
            Some(n) if n.value < 1 || n.value > i64::from(max) => {
                cx.err(
                    n,
                    format!("nproc = {}: must be between 1 and {max}", n.value),
                );
                None
            }
            Some(n) => {
                // As for torchrun: one rank per listed GPU. `gpus = []` (no GPU: ranks on the CPU,
                // gloo) is the exception.
                let listed = match gpus {
                    GpuSelection::List(list) if !list.is_empty() => Some(list.len()),
                    _ => None,
                };
                if let Some(len) = listed.filter(|&len| n.value as usize > len) {
                    cx.err(n, format!(
                    "nproc = {} but gpus lists {} GPU{}: one rank per GPU needs as many GPUs",
                    n.value,
                    len,
                    if len == 1 { "" } else { "s" }
                ));
                }
                Some(n.value as u32)
            }
        };
    let master_addr = match &r.master_addr {
        None => Some(RanksSpec::DEFAULT_MASTER_ADDR.to_string()),
        Some(a)
            if a.value.is_empty()
                || a.value
                    .chars()
                    .any(|c| c.is_whitespace() || c.is_control() || c == '/') =>
        {
            cx.err(a, format!(
                "master_addr = {:?}: expected a host name or an IP address, like \"127.0.0.1\", or leave it out",
                a.value
            ));
            None
        }
        Some(a) => Some(a.value.clone()),
    };
    let master_port = match &r.master_port {
        None => Some(None),
        Some(p) if p.value == 0 => Some(None),
        Some(p) => match u16::try_from(p.value) {
            Ok(port) => Some(Some(port)),
            Err(_) => {
                cx.err(p, format!(
                    "master_port = {}: expected a TCP port, 1 to 65535 (or 0 for a free port at each start)",
                    p.value
                ));
                None
            }
        },
    };
    let grace_s = match &r.grace_s {
        None => Some(RanksSpec::DEFAULT_GRACE_S),
        Some(g) if !g.value.is_finite() || g.value <= 0.0 || g.value > 3600.0 => {
            cx.err(
                g,
                format!(
                    "grace_s = {}: must be more than 0 seconds (and at most 3600)",
                    g.value
                ),
            );
            None
        }
        Some(g) => Some(g.value),
    };
    Some(RanksSpec {
        nproc: nproc?,
        master_addr: master_addr?,
        master_port: master_port?,
        grace_s: grace_s?,
    })
}

#[cfg(test)]
mod tests {
    use crate::profile::{self, CommandSpec, Launcher, ProfileError, RanksSpec};

    fn ranks(text: &str) -> RanksSpec {
        let p = profile::parse_str("r.toml", text).unwrap_or_else(|e| panic!("{e}"));
        match p.run.launcher {
            Launcher::Ranks(r) => r,
            other => panic!("not ranks: {other:?}"),
        }
    }

    /// `LINE:COL: message` of each problem.
    fn problems(text: &str) -> Vec<String> {
        match profile::parse_str("p.toml", text) {
            Ok(p) => panic!("accepted: {p:?}"),
            Err(ProfileError::Invalid(ds)) => ds
                .iter()
                .map(|d| format!("{}: {}", d.location(), d.message))
                .collect(),
            Err(e) => panic!("not a validation error: {e}"),
        }
    }

    #[test]
    fn defaults_and_every_key() {
        let r = ranks(
            "[run]\nlauncher = \"ranks\"\ncommand = [\"python3\", \"t.py\"]\n[run.ranks]\nnproc = 4\n",
        );
        assert_eq!(
            r,
            RanksSpec {
                nproc: 4,
                master_addr: "127.0.0.1".into(),
                master_port: None,
                grace_s: 10.0,
            }
        );
        let r = ranks(
            "[run]\nlauncher = \"ranks\"\ncommand = \"t\"\ngpus = [0, 1]\n[run.ranks]\nnproc = 2\n\
             master_addr = \"localhost\"\nmaster_port = 29501\ngrace_s = 2.5\n",
        );
        assert_eq!(
            (r.nproc, r.master_addr.as_str(), r.master_port, r.grace_s),
            (2, "localhost", Some(29501), 2.5)
        );
        assert_eq!(
            ranks("[run]\nlauncher = \"ranks\"\ncommand = \"t\"\n[run.ranks]\nnproc = 1\nmaster_port = 0\n")
                .master_port,
            None,
            "0 picks a port at each start"
        );
        // Ranks on the CPU: no GPU listed is no limit.
        assert_eq!(
            ranks(
                "[run]\nlauncher = \"ranks\"\ncommand = \"t\"\ngpus = []\n[run.ranks]\nnproc = 3\n"
            )
            .nproc,
            3
        );
    }

    #[test]
    fn a_shell_command_is_run_by_every_rank() {
        let p = profile::parse_str(
            "s.toml",
            "[run]\nlauncher = \"ranks\"\nshell = true\ncommand = \"echo $RANK\"\n[run.ranks]\nnproc = 2\n",
        )
        .unwrap();
        assert_eq!(p.run.command, CommandSpec::Shell("echo $RANK".into()));
    }

    #[test]
    fn a_ranks_profile_round_trips() {
        for text in [
            "[run]\nlauncher = \"ranks\"\ncommand = [\"python3\", \"t.py\"]\n[run.ranks]\nnproc = 8\n",
            "[run]\nlauncher = \"ranks\"\ncommand = [\"t\"]\n[run.ranks]\nnproc = 2\nmaster_addr = \"::1\"\nmaster_port = 1234\ngrace_s = 0.5\n",
        ] {
            let p = profile::parse_str("r.toml", text).unwrap();
            let written = p.to_toml();
            assert!(written.contains("[run.ranks]"), "{written}");
            let again = profile::parse_str("run.toml", &written)
                .unwrap_or_else(|e| panic!("{e}\n{written}"));
            assert_eq!(again.run, p.run, "{written}");
        }
    }

    #[test]
    fn bad_ranks_settings_are_reported_where_written() {
        assert_eq!(
            problems("[run]\nlauncher = \"ranks\"\ncommand = [\"t\"]\n"),
            [
                "p.toml:2:12: launcher = \"ranks\" needs the number of ranks (usually one per GPU): add [run.ranks] with nproc = N"
            ]
        );
        assert_eq!(
            problems(
                "[run]\nlauncher = \"ranks\"\ncommand = [\"t\"]\n[run.ranks]\nmaster_port = 29500\n"
            ),
            [
                "p.toml:4:1: [run.ranks] needs nproc = N (ranks to start on this node, usually one per GPU)"
            ]
        );
        assert_eq!(
            problems(
                "[run]\nlauncher = \"ranks\"\ncommand = [\"t\"]\ngpus = [0, 1]\n[run.ranks]\nnproc = 4\n\
                 master_addr = \"a b\"\nmaster_port = 70000\ngrace_s = 0\n"
            ),
            [
                "p.toml:6:9: nproc = 4 but gpus lists 2 GPUs: one rank per GPU needs as many GPUs",
                "p.toml:7:15: master_addr = \"a b\": expected a host name or an IP address, like \"127.0.0.1\", or leave it out",
                "p.toml:8:15: master_port = 70000: expected a TCP port, 1 to 65535 (or 0 for a free port at each start)",
                "p.toml:9:11: grace_s = 0: must be more than 0 seconds (and at most 3600)",
            ]
        );
        assert_eq!(
            problems("[run]\nlauncher = \"ranks\"\ncommand = [\"t\"]\n[run.ranks]\nnproc = 0\n"),
            ["p.toml:5:9: nproc = 0: must be between 1 and 256"]
        );
        assert_eq!(
            problems("[run]\nlauncher = \"ranks\"\ncommand = [\"t\"]\n[run.ranks]\nnproc = 257\n"),
            ["p.toml:5:9: nproc = 257: must be between 1 and 256"]
        );
        assert_eq!(
            problems("[run]\ncommand = [\"t\"]\n[run.ranks]\nnproc = 2\n"),
            [
                "p.toml:3:1: [run.ranks] is set but launcher is not \"ranks\": add launcher = \"ranks\" under [run], or remove [run.ranks]"
            ]
        );
        assert_eq!(
            problems(
                "[run]\ncommand = [\"t\"]\nlauncher = \"torchrun\"\n[run.torchrun]\nnproc_per_node = 2\n[run.ranks]\nnproc = 2\n"
            ),
            [
                "p.toml:6:1: [run.ranks] is set but launcher is not \"ranks\": add launcher = \"ranks\" under [run], or remove [run.ranks]"
            ]
        );
        assert_eq!(
            problems(
                "[run]\ncommand = [\"t\"]\nlauncher = \"ranks\"\n[run.torchrun]\nnproc_per_node = 2\n[run.ranks]\nnproc = 2\n"
            ),
            [
                "p.toml:4:1: [run.torchrun] does not apply to launcher = \"ranks\": gpupilot starts the ranks itself; say how many with nproc = N under [run.ranks]"
            ]
        );
    }
}
