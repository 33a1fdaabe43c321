//! `launcher = "slurm"` and `[run.slurm]`.

use super::{Ctx, argv_value, is_python};
use crate::profile::raw::{At, LauncherKind, RawRun, RawSlurm};
use crate::profile::{CommandSpec, Launcher, SlurmSpec};

/// sbatch options gpupilot writes itself, and the key that says them instead.
const OWN_OPTIONS: [(&str, &str); 14] = [
    ("--output", "the output goes to the run's stdout.log"),
    ("-o", "the output goes to the run's stdout.log"),
    ("--error", "errors go to the run's stderr.log"),
    ("-e", "errors go to the run's stderr.log"),
    ("--open-mode", "the logs are appended to"),
    ("--parsable", "gpupilot reads the job id with it"),
    ("--nodes", "use nodes = N"),
    ("-N", "use nodes = N"),
    ("--partition", "use partition = \"NAME\""),
    ("-p", "use partition = \"NAME\""),
    ("--time", "use time_limit = \"HH:MM:SS\""),
    ("-t", "use time_limit = \"HH:MM:SS\""),
    ("--account", "use account = \"NAME\""),
    ("--gpus-per-node", "use gpus_per_node = N"),
];

/// `[run.slurm]` where the launcher is not Slurm.
pub(super) fn misplaced(cx: &mut Ctx, run: &RawRun, kind: LauncherKind) {
    if kind == LauncherKind::Slurm {
        return;
    }
    if let Some(s) = &run.slurm {
        cx.err(
            s,
            "[run.slurm] is set but launcher is not \"slurm\": add launcher = \"slurm\" under [run], or remove [run.slurm]",
        );
    }
}

pub(super) fn launcher(
    cx: &mut Ctx,
    run: &RawRun,
    shell: bool,
    command: Option<&(CommandSpec, At<()>)>,
) -> Option<Launcher> {
    let launcher_at = run.launcher.as_ref().expect("slurm was named");
    if shell {
        cx.err(launcher_at, "launcher = \"slurm\" cannot run a shell command (shell = true): the job runs `srun torchrun SCRIPT`; make command the script and its arguments");
    }
    if let Some(t) = &run.torchrun {
        cx.err(t, "[run.torchrun] does not apply to launcher = \"slurm\": put nproc_per_node, program and args under [run.slurm]");
    }
    if let Some(g) = &run.gpus {
        cx.err(g, "gpus chooses GPUs on this machine, but with launcher = \"slurm\" Slurm gives the job its GPUs: remove gpus and set gpus_per_node under [run.slurm]");
    }
    let Some(s_at) = &run.slurm else {
        cx.err(launcher_at, "launcher = \"slurm\" needs [run.slurm] with gpus_per_node = N (0 on a partition without GPUs)");
        return None;
    };
    if let Some((CommandSpec::Argv(argv), at)) = command {
        if is_python(&argv[0]) {
            cx.err(at, format!(
                "with launcher = \"slurm\", command is the script and its arguments (torchrun runs Python itself): drop {:?}",
                argv[0]
            ));
        }
    }
    spec(cx, s_at).map(Launcher::Slurm)
}

fn count(cx: &mut Ctx, at: &At<i64>, what: &str, min: i64) -> Option<u32> {
    if at.value < min || at.value > i64::from(u32::MAX) {
        cx.err(at, format!("{what} = {}: must be {min} or more", at.value));
        return None;
    }
    Some(at.value as u32)
}

fn word(cx: &mut Ctx, at: &Option<At<String>>, what: &str) -> Option<String> {
    let at = at.as_ref()?;
    if at.value.is_empty()
        || at
            .value
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
    {
        cx.err(
            at,
            format!(
                "{what} = {:?}: expected one word (a Slurm name), or leave it out",
                at.value
            ),
        );
        return None;
    }
    Some(at.value.clone())
}

/// Slurm's `--time` forms: `M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S`, or no limit.
pub(crate) fn is_time_limit(t: &str) -> bool {
    if matches!(t, "UNLIMITED" | "INFINITE" | "unlimited" | "infinite") {
        return true;
    }
    let digits = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
    let (days, rest) = match t.split_once('-') {
        Some((d, rest)) => (Some(d), rest),
        None => (None, t),
    };
    if days.is_some_and(|d| !digits(d)) {
        return false;
    }
    let parts: Vec<&str> = rest.split(':').collect();
    parts.iter().all(|p| digits(p)) && parts.len() <= 3
}

fn spec(cx: &mut Ctx, s_at: &At<RawSlurm>) -> Option<SlurmSpec> {
    let s = &s_at.value;
    let nodes = match &s.nodes {
        Some(n) => count(cx, n, "nodes", 1),
        None => Some(1),
    };
    let gpus_per_node = match &s.gpus_per_node {
        Some(g) => count(cx, g, "gpus_per_node", 0),
        None => {
            cx.err(s_at, "[run.slurm] needs gpus_per_node = N (GPUs on each node; 0 on a partition without GPUs)");
            None
        }
    };
    let nproc_per_node = match &s.nproc_per_node {
        Some(n) => count(cx, n, "nproc_per_node", 1),
        None => gpus_per_node.map(|g| g.max(1)),
    };
    let partition = word(cx, &s.partition, "partition");
    let account = word(cx, &s.account, "account");
    let time_limit = s.time_limit.as_ref().and_then(|t| {
        if is_time_limit(&t.value) {
            Some(t.value.clone())
        } else {
            cx.err(t, format!(
                "time_limit = {:?}: write it as Slurm does, like \"01:00:00\" (hours:minutes:seconds), \"2-00:00:00\" (days-hours:…) or \"90\" (minutes)",
                t.value
            ));
            None
        }
    });
    let mut sbatch_args = Vec::new();
    for arg in s
        .sbatch_args
        .iter()
        .flat_map(|a| a.value.iter().map(move |v| (a, v)))
    {
        let (at, value) = arg;
        let name = value.split_once('=').map_or(value.as_str(), |(n, _)| n);
        if !value.starts_with('-') || value.contains(['\n', '\r', '\0']) {
            cx.err(
                at,
                format!(
                    "sbatch_args: {value:?} is not an sbatch option: write each as \"--name=value\""
                ),
            );
        } else if let Some((_, instead)) = OWN_OPTIONS.iter().find(|(o, _)| *o == name) {
            cx.err(
                at,
                format!("sbatch_args: {name} is set by gpupilot ({instead})"),
            );
        } else {
            sbatch_args.push(value.clone());
        }
    }
    let rdzv_port = match &s.rdzv_port {
        Some(p) => match u16::try_from(p.value) {
            Ok(port) if port > 0 => Some(port),
            _ => {
                cx.err(
                    p,
                    format!("rdzv_port = {}: expected a TCP port, 1 to 65535", p.value),
                );
                None
            }
        },
        None => Some(29500),
    };
    let program = match &s.program {
        Some(p) => argv_value(cx, p, "slurm program")?,
        None => vec!["torchrun".into()],
    };
    Some(SlurmSpec {
        nodes: nodes?,
        gpus_per_node: gpus_per_node?,
        nproc_per_node: nproc_per_node?,
        partition,
        time_limit,
        account,
        sbatch_args,
        rdzv_port: rdzv_port?,
        program,
        args: s.args.clone().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::is_time_limit;
    use crate::profile::{self, Launcher, SlurmSpec};

    const FULL: &str = r#"
[run]
launcher = "slurm"
command = ["train.py", "--epochs", "3"]
[run.slurm]
nodes = 2
gpus_per_node = 8
partition = "gpu"
time_limit = "01:00:00"
account = "ml"
sbatch_args = ["--exclusive", "--constraint=h100"]
"#;

    #[test]
    fn a_slurm_profile_loads_and_round_trips() {
        let p = profile::parse_str("s.toml", FULL).unwrap();
        let Launcher::Slurm(s) = &p.run.launcher else {
            panic!("{:?}", p.run.launcher);
        };
        assert_eq!(
            *s,
            SlurmSpec {
                nodes: 2,
                gpus_per_node: 8,
                nproc_per_node: 8,
                partition: Some("gpu".into()),
                time_limit: Some("01:00:00".into()),
                account: Some("ml".into()),
                sbatch_args: vec!["--exclusive".into(), "--constraint=h100".into()],
                rdzv_port: 29500,
                program: vec!["torchrun".into()],
                args: vec![],
            }
        );
        let text = p.to_toml();
        let again = profile::parse_str("run.toml", &text).unwrap();
        assert_eq!(again.run, p.run, "{text}");
        let cpu = profile::parse_str(
            "c.toml",
            "[run]\nlauncher = \"slurm\"\ncommand = \"w.sh\"\n[run.slurm]\ngpus_per_node = 0\n",
        )
        .unwrap();
        let Launcher::Slurm(s) = &cpu.run.launcher else {
            panic!()
        };
        assert_eq!(
            (s.nodes, s.nproc_per_node, s.partition.as_ref()),
            (1, 1, None)
        );
    }

    fn errors(text: &str) -> String {
        profile::parse_str("p.toml", text).unwrap_err().to_string()
    }

    #[test]
    fn bad_slurm_settings_are_reported_where_written() {
        let e = errors(
            "[run]\nlauncher = \"slurm\"\ncommand = [\"python3\", \"t.py\"]\ngpus = [0]\n\
             [run.slurm]\nnodes = 0\ngpus_per_node = 4\ntime_limit = \"1h\"\n\
             sbatch_args = [\"--output=x.log\", \"exclusive\"]\nrdzv_port = 70000\n",
        );
        for want in [
            "p.toml:3:11: with launcher = \"slurm\", command is the script",
            "p.toml:4:8: gpus chooses GPUs on this machine",
            "p.toml:6:9: nodes = 0: must be 1 or more",
            "p.toml:8:14: time_limit = \"1h\": write it as Slurm does",
            "p.toml:9:15: sbatch_args: --output is set by gpupilot",
            "p.toml:9:15: sbatch_args: \"exclusive\" is not an sbatch option",
            "p.toml:10:13: rdzv_port = 70000: expected a TCP port",
        ] {
            assert!(e.contains(want), "{want:?} not in\n{e}");
        }
        let e = errors("[run]\nlauncher = \"slurm\"\ncommand = \"t.py\"\n");
        assert!(
            e.contains("p.toml:2:12: launcher = \"slurm\" needs [run.slurm]"),
            "{e}"
        );
        let e = errors("[run]\ncommand = \"t.py\"\n[run.slurm]\ngpus_per_node = 1\n");
        assert!(
            e.contains("[run.slurm] is set but launcher is not \"slurm\""),
            "{e}"
        );
        let e = errors("[run]\nlauncher = \"slurm\"\ncommand = \"t.py\"\n[run.slurm]\nnodes = 2\n");
        assert!(e.contains("[run.slurm] needs gpus_per_node"), "{e}");
    }

    #[test]
    fn time_limits() {
        for ok in [
            "01:00:00",
            "90",
            "30:00",
            "2-00:00:00",
            "1-12",
            "1-12:30",
            "UNLIMITED",
        ] {
            assert!(is_time_limit(ok), "{ok}");
        }
        for bad in ["", "1h", "1:2:3:4", "-1", "a-01:00", "01:00:"] {
            assert!(!is_time_limit(bad), "{bad}");
        }
    }
}
