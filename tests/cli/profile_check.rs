//! The profile format end to end: shipped profiles, `extends`, and the messages for bad files.

use std::fs;
use std::path::{Path, PathBuf};

use gpupilot::profile::{
    self, CommandSpec, GpuSelection, Launcher, Loader, ProfileError, RestartMode, SHIPPED,
    ThermalTarget,
};

fn profiles_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles")
}

/// Write `files` (name, text) into a fresh directory.
fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for (name, text) in files {
        let p = d.path().join(name);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    }
    d
}

/// The error's text with the temp directory replaced by `DIR`.
fn message(err: ProfileError, dir: &Path) -> String {
    err.to_string().replace(&dir.display().to_string(), "DIR")
}

fn check_err(files: &[(&str, &str)], root: &str) -> String {
    let d = dir_with(files);
    let err = profile::check(d.path().join(root)).unwrap_err();
    message(err, d.path())
}

#[test]
fn every_shipped_profile_checks_and_round_trips() {
    let mut on_disk: Vec<String> = fs::read_dir(profiles_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    let mut embedded: Vec<String> = SHIPPED.iter().map(|(n, _)| n.to_string()).collect();
    embedded.sort();
    assert_eq!(
        on_disk, embedded,
        "profile::SHIPPED must list every profiles/*.toml"
    );
    assert!(on_disk.len() >= 4);

    for name in &on_disk {
        let path = profiles_dir().join(format!("{name}.toml"));
        let p = profile::check(&path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(&p.name, name);
        assert_eq!(p.source.as_deref(), Some(path.as_path()));
        let shipped = Loader::new().load_shipped(name).unwrap().unwrap();
        assert_eq!(shipped.run, p.run, "{name}: embedded and on-disk differ");
        // run.toml is itself a profile that loads back to the same thing.
        let again = profile::parse_str("run.toml", &p.to_toml())
            .unwrap_or_else(|e| panic!("{name}: its run.toml does not load: {e}\n{}", p.to_toml()));
        assert_eq!(again.source, None);
        assert_eq!(
            profile::Profile {
                source: p.source.clone(),
                ..again
            },
            p
        );
    }
}

#[test]
fn shipped_examples_say_what_the_docs_say() {
    let p = profile::check(profiles_dir().join("train-simple.toml")).unwrap();
    assert_eq!(
        p.run.command,
        CommandSpec::Argv(vec!["python3".into(), "examples/train_simple.py".into()])
    );
    assert_eq!(p.run.gpus, GpuSelection::List(vec![0]));

    let t = profile::check(profiles_dir().join("torchrun-8gpu.toml")).unwrap();
    let Launcher::Torchrun(spec) = &t.run.launcher else {
        panic!("torchrun-8gpu is not torchrun: {:?}", t.run.launcher)
    };
    assert_eq!(
        (spec.nproc_per_node, spec.nnodes, spec.standalone),
        (8, 1, true)
    );
    assert_eq!(t.run.gpus, GpuSelection::List((0..8).collect()));

    let r = profile::check(profiles_dir().join("ranks-4.toml")).unwrap();
    let Launcher::Ranks(spec) = &r.run.launcher else {
        panic!("ranks-4 is not ranks: {:?}", r.run.launcher)
    };
    assert_eq!(
        (spec.nproc, spec.master_addr.as_str(), spec.master_port),
        (4, "127.0.0.1", None)
    );
    assert_eq!(r.run.gpus, GpuSelection::List((0..4).collect()));
    assert_eq!(
        r.run.command,
        CommandSpec::Argv(vec!["python3".into(), "examples/train_ddp.py".into()])
    );

    let s = profile::check(profiles_dir().join("shell-pipeline.toml")).unwrap();
    assert!(
        matches!(&s.run.command, CommandSpec::Shell(script) if script.contains("exec python3"))
    );
}

#[test]
fn extends_overrides_field_by_field_and_merges_env() {
    let p = profile::check(profiles_dir().join("train-resilient.toml")).unwrap();
    // From base:
    assert_eq!(
        p.run.command,
        CommandSpec::Argv(vec!["python3".into(), "examples/train_simple.py".into()])
    );
    assert_eq!(p.run.env["PYTHONUNBUFFERED"], "1");
    assert_eq!(p.run.restart.backoff_s, 10.0);
    let bs = p.knobs.batch_size.unwrap();
    assert_eq!((bs.initial, bs.min, bs.max), (128, 8, Some(1024)));
    assert_eq!(p.alerts.temp_c, Some(85.0));
    // Overridden:
    assert_eq!(p.run.env["NCCL_DEBUG"], "INFO");
    assert_eq!(p.run.restart.mode, RestartMode::Always);
    assert_eq!(p.run.restart.max_restarts, 10);
    assert_eq!(p.run.gpus, GpuSelection::List(vec![0, 1]));
    assert_eq!(p.thermal.target, Some(ThermalTarget::BelowSlowdown(5.0)));
    assert_eq!(p.power.cap_w, Some(300.0));
    assert_eq!(p.name, "train-resilient", "a name is not inherited");
}

#[test]
fn extends_chain_local_before_shipped_and_relative_cwd() {
    let d = dir_with(&[
        ("a.toml", "extends = \"b\"\n[run]\nenv = { A = \"a\" }\n"),
        (
            "b.toml",
            "extends = \"sub/c.toml\"\n[run]\nenv = { B = \"b\", A = \"from-b\" }\n",
        ),
        (
            "sub/c.toml",
            "[run]\ncommand = \"python3 train.py --lr 0.1\"\ncwd = \"data\"\n[thermal]\ntarget_c = 80\n",
        ),
        // A local base.toml wins over the shipped one, and may extend the shipped one itself.
        (
            "base.toml",
            "extends = \"base\"\n[run]\nenv = { LOCAL = \"1\" }\n",
        ),
        ("d.toml", "extends = \"base\"\n[thermal]\nmargin_c = 3\n"),
    ]);
    let p = profile::check(d.path().join("a.toml")).unwrap();
    assert_eq!(
        p.run.command,
        CommandSpec::Argv(vec![
            "python3".into(),
            "train.py".into(),
            "--lr".into(),
            "0.1".into()
        ])
    );
    assert_eq!(p.run.env["A"], "a");
    assert_eq!(p.run.env["B"], "b");
    // Relative to the file that said it, not to the caller.
    assert_eq!(p.run.cwd, Some(d.path().join("sub").join("data")));
    assert_eq!(p.thermal.target, Some(ThermalTarget::Celsius(80.0)));

    let p = profile::check(d.path().join("d.toml")).unwrap();
    assert_eq!(p.run.env["LOCAL"], "1");
    assert_eq!(
        p.run.env["PYTHONUNBUFFERED"], "1",
        "the shipped base is under the local one"
    );
    // margin_c in the child replaces the parent's thermal choice instead of clashing with it.
    assert_eq!(p.thermal.target, Some(ThermalTarget::BelowSlowdown(3.0)));

    // A search directory (the user's profiles) is looked in after the file's own directory.
    let user = dir_with(&[("team.toml", "[run]\ncommand = [\"true\"]\n")]);
    let child = dir_with(&[("x.toml", "extends = \"team\"\n")]);
    assert!(profile::check(child.path().join("x.toml")).is_err());
    let p = Loader::new()
        .with_search_dir(user.path())
        .load(&child.path().join("x.toml"))
        .unwrap();
    assert_eq!(p.run.command, CommandSpec::Argv(vec!["true".into()]));
}

#[test]
fn extends_cycles_are_refused() {
    let msg = check_err(
        &[
            ("a.toml", "extends = \"b\"\n[run]\ncommand = [\"x\"]\n"),
            ("b.toml", "# b\nextends = \"c\"\n"),
            ("c.toml", "extends = \"a\"\n"),
        ],
        "a.toml",
    );
    assert!(
        msg.starts_with(
            "DIR/c.toml:1:11: extends cycle: DIR/a.toml → DIR/b.toml → DIR/c.toml → DIR/a.toml; a profile cannot extend itself, even indirectly"
        ),
        "{msg}"
    );
    // A file never finds itself, so extending your own name with no other such file is "not found".
    let msg = check_err(&[("solo.toml", "extends = \"solo\"\n")], "solo.toml");
    assert!(
        msg.starts_with("DIR/solo.toml:1:11: extends = \"solo\": no solo.toml in DIR, the shipped profiles (base, "),
        "{msg}"
    );
}

#[test]
fn parse_errors_name_file_line_and_column() {
    let msg = check_err(
        &[("p.toml", "[run]\ncommand = [\"x\"]\ncomand = \"y\"\n")],
        "p.toml",
    );
    assert!(
        msg.starts_with("DIR/p.toml:3:1: unknown field `comand`, expected one of"),
        "{msg}"
    );
    assert!(msg.contains("\n3 | comand = \"y\"\n  | ^^^^^^"), "{msg}");

    let msg = check_err(
        &[("p.toml", "[run]\ncommand = [\"x\"]\ngpus = \"some\"\n")],
        "p.toml",
    );
    assert!(msg.starts_with("DIR/p.toml:3:8: invalid value: string \"some\", expected GPU indices like [0, 1], or \"all\""), "{msg}");

    let msg = check_err(&[("p.toml", "[run]\ncommand = 5\n")], "p.toml");
    assert!(
        msg.starts_with("DIR/p.toml:2:11: invalid type: integer `5`, expected a command"),
        "{msg}"
    );

    let msg = check_err(&[("p.toml", "[run]\ncommand = [\"x\"\n")], "p.toml");
    assert!(msg.starts_with("DIR/p.toml:2:"), "{msg}");

    let msg = check_err(&[("p.toml", "[powr]\ncap_w = 1\n")], "p.toml");
    assert!(
        msg.starts_with("DIR/p.toml:1:2: unknown field `powr`"),
        "{msg}"
    );

    let msg = check_err(&[("p.toml", "[run]\nlauncher = \"mpirun\"\n")], "p.toml");
    assert!(
        msg.starts_with(
            "DIR/p.toml:2:12: unknown variant `mpirun`, expected one of `local`, `torchrun`, `slurm`, `ranks`"
        ),
        "{msg}"
    );

    // An error in the file extended points at that file.
    let msg = check_err(
        &[
            ("c.toml", "extends = \"p\"\n"),
            ("p.toml", "[alerts]\ntemp = 80\n"),
        ],
        "c.toml",
    );
    assert!(
        msg.starts_with("DIR/p.toml:2:1: unknown field `temp`"),
        "{msg}"
    );

    let d = tempfile::tempdir().unwrap();
    let err = profile::check(d.path().join("missing.toml")).unwrap_err();
    assert!(matches!(err, ProfileError::Read { .. }));
    assert!(message(err, d.path()).starts_with("DIR/missing.toml: cannot read the profile: "));
}

/// The first line of each problem, file name and all.
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
fn validation_messages_are_precise() {
    assert_eq!(
        problems(
            "[run]\ncommand = [\"t\"]\n[knobs.batch_size]\ninitial = 512\nmin = 8\nmax = 256\n"
        ),
        ["p.toml:4:11: knobs.batch_size: initial = 512 is outside the allowed range 8..=256"]
    );
    assert_eq!(
        problems(
            "[run]\ncommand = [\"t\"]\n[run.restart]\npolicy = \"on-failure\"\nmax_restarts = -1\n"
        ),
        ["p.toml:5:16: max_restarts = -1 is negative: use 0 for no restarts, or a count like 3"]
    );
    assert_eq!(
        problems("[run]\ncommand = [\"train.py\"]\nlauncher = \"torchrun\"\n"),
        [
            "p.toml:3:12: launcher = \"torchrun\" needs nproc_per_node (processes per node, usually one per GPU): add [run.torchrun] with nproc_per_node = N"
        ]
    );
    assert_eq!(
        problems(
            "[run]\ncommand = [\"python3\", \"t.py\"]\nlauncher = \"torchrun\"\ngpus = [0, 1]\n[run.torchrun]\nnproc_per_node = 4\n"
        ),
        [
            "p.toml:2:11: with launcher = \"torchrun\", command is the script and its arguments (torchrun runs Python itself): drop \"python3\"",
            "p.toml:6:18: nproc_per_node = 4 but gpus lists 2 GPUs: one process per GPU needs as many GPUs",
        ]
    );
    assert_eq!(
        problems("[run]\ncommand = [\"t\"]\n[run.torchrun]\nnproc_per_node = 2\n"),
        [
            "p.toml:3:1: [run.torchrun] is set but launcher is \"local\": add launcher = \"torchrun\" under [run], or remove [run.torchrun]"
        ]
    );
    assert_eq!(
        problems(
            "[run]\ncommand = [\"a\"]\nlauncher = \"torchrun\"\n[run.torchrun]\nnproc_per_node = 1\nnnodes = 2\n"
        ),
        [
            "p.toml:6:10: nnodes = 2 needs rdzv_endpoint = \"HOST:PORT\" (the rendezvous every node joins)"
        ]
    );
    assert_eq!(
        problems("description = \"no run\"\n"),
        [
            "p.toml: [run] command is missing: add command = [\"python3\", \"train.py\"] under [run] (here or in the profile this one extends)"
        ]
    );
    assert_eq!(
        problems("[run]\nshell = true\ncommand = [\"a\", \"b\"]\n"),
        ["p.toml:3:11: with shell = true, command is one string for `sh -c`, not an array"]
    );
    assert_eq!(
        problems("[run]\ncommand = \"python3 train.py | tee log\"\n"),
        [
            "p.toml:2:11: command contains `|`, which only a shell understands: set shell = true to run it with sh -c, or remove it"
        ]
    );
    assert_eq!(
        problems("[run]\ncommand = \"python3 'train.py\"\n"),
        [
            "p.toml:2:11: command: missing closing quote (the string is split into words with shell quoting rules)"
        ]
    );
    assert_eq!(
        problems("[run]\ncommand = []\n"),
        [
            "p.toml:2:11: command is empty: write the program and its arguments, like [\"python3\", \"train.py\"]"
        ]
    );
    assert_eq!(
        problems(
            "[run]\ncommand = [\"t\"]\ngpus = [0, 0, -1]\nenv = { GPUPILOT_RUN_ID = \"x\", CUDA_VISIBLE_DEVICES = \"1\" }\n"
        ),
        [
            "p.toml:3:8: gpus lists GPU 0 twice",
            "p.toml:3:8: gpus: -1 is not a GPU index (0, 1, …)",
            "p.toml:4:27: env.GPUPILOT_RUN_ID is set by gpupilot for each run; remove it",
            "p.toml:4:55: env.CUDA_VISIBLE_DEVICES and gpus both choose GPUs: keep only gpus",
        ]
    );
    assert_eq!(
        problems("[run]\ncommand = [\"t\", \"--bs\", \"{batch_size}\"]\n"),
        [
            "p.toml:2:11: command uses {batch_size} but [knobs.batch_size] is not set: add it with an initial value"
        ]
    );
    // Written but invalid: only its own error, not a second one saying it is not set.
    assert_eq!(
        problems(
            "[run]\ncommand = [\"t\", \"--bs\", \"{batch_size}\", \"--pf\", \"{prefetch}\"]\n[knobs.batch_size]\ninitial = 2048\nmax = 1024\n[knobs.prefetch]\nmax = 4\n"
        ),
        [
            "p.toml:4:11: knobs.batch_size: initial = 2048 is outside the allowed range 1..=1024",
            "p.toml:6:1: knobs.prefetch needs initial = N (the value the run starts with)",
        ]
    );
    assert_eq!(
        problems(
            "[run]\ncommand = [\"t\"]\n[thermal]\ntarget_c = 80\nmargin_c = 5\n[power]\ncap_w = 0\n[alerts]\nhook = \"\"\n"
        ),
        [
            "p.toml:5:12: thermal: set target_c (degrees) or margin_c (degrees below slowdown), not both",
            "p.toml:7:9: power.cap_w = 0: must be more than 0 watts",
            "p.toml:9:8: alerts.hook is empty",
        ]
    );
    assert_eq!(
        problems(
            "name = \"has space\"\n[run]\ncommand = [\"t\"]\n[run.restart]\nbackoff_s = 10\nbackoff_max_s = 5\nbackoff_factor = 0.5\n"
        ),
        [
            "p.toml:1:8: name = \"has space\": use letters, digits, '.', '_' and '-' only (it becomes part of run ids)",
            "p.toml:6:17: backoff_max_s = 5 is below backoff_s = 10",
            "p.toml:7:18: backoff_factor = 0.5: must be 1 (the same wait every time) or more",
        ]
    );
    assert_eq!(
        problems("[run]\ncommand = [\"t\"]\ncwd = \"~/x\"\n[knobs.prefetch]\nmin = 2\nmax = 1\n"),
        [
            "p.toml:3:7: cwd = \"~/x\": `~` is not expanded; write the full path, or one relative to this file",
            "p.toml:4:1: knobs.prefetch needs initial = N (the value the run starts with)",
            "p.toml:6:7: knobs.prefetch: max = 1 is below min = 2",
        ]
    );
    assert_eq!(
        problems(
            "[run]\ncommand = [\"t\"]\n[energy]\ncurrency = \"EUR\"\npue = 0.9\ngrid_co2_g_per_kwh = 1e9\n"
        ),
        [
            "p.toml:4:12: energy.currency is set but energy.price_per_kwh is not",
            "p.toml:5:7: energy.pue = 0.9: expected the facility's energy over its IT energy, from 1 to 5 (1.1–1.6 is typical)",
            "p.toml:6:22: energy.grid_co2_g_per_kwh = 1000000000: expected grams of CO2 per kWh, from 0 to 2000 (a grid mix is typically 20–900)",
        ]
    );
    let p = profile::parse_str(
        "p.toml",
        "[run]\ncommand = [\"t\"]\n[energy]\nprice_per_kwh = 0.3\npue = 1.2\n",
    )
    .unwrap();
    assert_eq!(p.energy.price_per_kwh, Some(0.3));
    assert_eq!(
        (p.energy.pue, p.energy.grid_co2_g_per_kwh),
        (Some(1.2), None)
    );
}

#[test]
fn defaults_of_a_minimal_profile() {
    let p = profile::parse_str("m.toml", "[run]\ncommand = \"sleep 1\"\n").unwrap();
    assert_eq!(p.name, "m");
    assert_eq!(
        p.run.command,
        CommandSpec::Argv(vec!["sleep".into(), "1".into()])
    );
    assert_eq!(p.run.gpus, GpuSelection::Inherit);
    assert_eq!(p.run.launcher, Launcher::Local);
    assert_eq!(p.run.restart, profile::RestartPolicy::default());
    assert_eq!(p.run.restart.mode, RestartMode::Never);
    assert!(p.power.restore_on_exit);
    assert_eq!(p.thermal.target, None);
    assert_eq!(p.knobs, profile::Knobs::default());

    // The default ceiling (300 s) rises to meet a longer first wait instead of refusing it.
    let p = profile::parse_str(
        "b.toml",
        "[run]\ncommand = [\"t\"]\n[run.restart]\nbackoff_s = 3600\n",
    )
    .unwrap();
    assert_eq!(
        (p.run.restart.backoff_s, p.run.restart.backoff_max_s),
        (3600.0, 3600.0)
    );
}
