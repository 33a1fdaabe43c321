//! `launcher = "ranks"`: the real `gpupilot ranks` starting N ranks of `sh -c` with torchrun's
//! environment, in the run's process group; a failed rank stops the others and gives its exit
//! code; a SIGTERM to the ranks process reaches every rank. Then the same through a daemon
//! (`gpupilot run PROFILE`) and `gpupilot profile check`.

use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::home::Home;
use crate::support::proc::send;
use crate::support::wait::wait_for;
use gpupilot::supervisor::procfs;
use rustix::process::Signal;

const BIN: &str = env!("CARGO_BIN_EXE_gpupilot");

/// `gpupilot ranks ARGS…` in a process group of its own (as a run is), output captured, with
/// `OUT` naming `out`.
fn ranks(args: &[&str], out: &Path) -> Child {
    Command::new(BIN)
        .arg("ranks")
        .args(args)
        .env("OUT", out)
        .env("GPUPILOT_RUN_ID", "20260101-000000-ddp")
        .env_remove("OMP_NUM_THREADS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap()
}

/// Wait at most `timeout` for `child`; its output. Whatever is left of its group is killed.
fn finish(mut child: Child, timeout: Duration) -> (Output, Duration) {
    let start = Instant::now();
    let pgid = child.id();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > timeout {
            let _ = gpupilot::supervisor::signal::to_group(
                pgid,
                gpupilot::supervisor::signal::Sig::Kill,
            );
            let out = child.wait_with_output().unwrap();
            panic!(
                "gpupilot ranks did not end within {timeout:?}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let took = start.elapsed();
    let left = procfs::running_in_group(pgid);
    let _ = gpupilot::supervisor::signal::to_group(pgid, gpupilot::supervisor::signal::Sig::Kill);
    assert!(
        left.is_empty(),
        "processes left in the run's group: {left:?}"
    );
    (child.wait_with_output().unwrap(), took)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn every_rank_gets_torchruns_environment_in_the_runs_group() {
    let tmp = tempfile::tempdir().unwrap();
    let script = r#"
        pgid=$(cut -d' ' -f5 /proc/$$/stat)
        echo "$RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK $ROLE_RANK $ROLE_WORLD_SIZE $MASTER_ADDR $TORCHELASTIC_RUN_ID $OMP_NUM_THREADS $pgid" > "$OUT/rank$RANK"
        echo "$MASTER_PORT" > "$OUT/port$RANK"
        echo "rank $RANK on stdout"
    "#;
    let child = ranks(&["--nproc", "3", "--", "sh", "-c", script], tmp.path());
    let pid = child.id();
    let (out, _) = finish(child, Duration::from_secs(10));
    assert!(
        out.status.success(),
        "{}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    for r in 0..3 {
        assert_eq!(
            read(&tmp.path().join(format!("rank{r}"))),
            format!("{r} {r} 3 3 0 {r} 3 127.0.0.1 20260101-000000-ddp 1 {pid}\n"),
            "rank {r}"
        );
    }
    let ports: Vec<String> = (0..3)
        .map(|r| read(&tmp.path().join(format!("port{r}"))))
        .collect();
    let port: u16 = ports[0].trim().parse().unwrap();
    assert!(
        port > 0 && ports.iter().all(|p| *p == ports[0]),
        "{ports:?}"
    );
    // The ranks' lines reach the run's stdout, each with its rank.
    let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            "[rank0]: rank 0 on stdout",
            "[rank1]: rank 1 on stdout",
            "[rank2]: rank 2 on stdout"
        ]
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A port asked for is the port every rank gets.
    let child = ranks(
        &[
            "--nproc",
            "2",
            "--master-port",
            "29555",
            "--master-addr",
            "localhost",
            "--",
            "sh",
            "-c",
            "echo $MASTER_ADDR:$MASTER_PORT > $OUT/m$RANK",
        ],
        tmp.path(),
    );
    assert!(finish(child, Duration::from_secs(10)).0.status.success());
    assert_eq!(read(&tmp.path().join("m1")), "localhost:29555\n");
}

#[test]
fn a_failed_rank_stops_the_others_and_gives_its_exit_code() {
    let tmp = tempfile::tempdir().unwrap();
    // Rank 1 fails; rank 0 dies of the SIGTERM; rank 2 ignores it and needs the SIGKILL.
    let script = r#"
        case $RANK in
          1) while [ ! -e "$OUT/up2" ]; do sleep 0.01; done; exit 7;;
          2) trap '' TERM; echo up > "$OUT/up2"; exec sleep 30;;
          *) exec sleep 30;;
        esac
    "#;
    let child = ranks(
        &["--nproc", "3", "--grace", "0.5", "--", "sh", "-c", script],
        tmp.path(),
    );
    let (out, took) = finish(child, Duration::from_secs(10));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(7), "{err}");
    assert!(tmp.path().join("up2").exists());
    assert_eq!(
        err.lines().collect::<Vec<_>>(),
        [
            "gpupilot ranks: rank 1 exited with code 7; stopping the other 2 ranks (SIGTERM, SIGKILL after 0.5 s)",
            "gpupilot ranks: 1 rank still running 0.5 s after SIGTERM: SIGKILL",
        ]
    );
    assert!(took < Duration::from_secs(3), "took {took:?}");

    // Death by a signal: 128 + the signal, as a shell says it.
    let script = r#"if [ "$RANK" = 1 ]; then kill -KILL $$; fi; exec sleep 30"#;
    let child = ranks(&["--nproc", "2", "--", "sh", "-c", script], tmp.path());
    let (out, took) = finish(child, Duration::from_secs(10));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(137), "{err}");
    assert_eq!(
        err.trim_end(),
        "gpupilot ranks: rank 1 was killed by SIGKILL; stopping the other 1 rank (SIGTERM, SIGKILL after 10 s)"
    );
    assert!(took < Duration::from_secs(3), "took {took:?}");

    // A command that does not exist: 127, and nothing left running.
    let child = ranks(&["--nproc", "2", "--", "/nonexistent/trainer"], tmp.path());
    let (out, _) = finish(child, Duration::from_secs(10));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(127), "{err}");
    assert!(
        err.starts_with("gpupilot ranks: rank 0 could not start (/nonexistent/trainer: "),
        "{err}"
    );
}

#[test]
fn sigterm_to_the_ranks_process_reaches_every_rank() {
    let tmp = tempfile::tempdir().unwrap();
    let script = r#"
        trap 'echo term > "$OUT/term$RANK"; exit 0' TERM
        echo up > "$OUT/up$RANK"
        while :; do sleep 0.05; done
    "#;
    let child = ranks(&["--nproc", "3", "--", "sh", "-c", script], tmp.path());
    wait_for("every rank to start", Duration::from_secs(5), || {
        (0..3).all(|r| tmp.path().join(format!("up{r}")).exists())
    });
    // To the ranks process alone, not to its group.
    send(child.id(), Signal::TERM);
    let (out, took) = finish(child, Duration::from_secs(10));
    assert!(
        out.status.success(),
        "{}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    for r in 0..3 {
        assert_eq!(read(&tmp.path().join(format!("term{r}"))), "term\n");
    }
    assert!(took < Duration::from_secs(3), "took {took:?}");
}

#[test]
fn a_ranks_profile_runs_under_the_daemon() {
    let home = Home::new();
    let _d = home.daemon(&[]);
    let profile = home.dir.path().join("ddp.toml");
    std::fs::write(
        &profile,
        "[run]\nlauncher = \"ranks\"\nshell = true\n\
         command = \"echo rank $RANK of $WORLD_SIZE run $TORCHELASTIC_RUN_ID; touch $GPUPILOT_RUN_DIR/done$RANK; \
         [ $RANK != 1 ] || { until [ -e $GPUPILOT_RUN_DIR/done0 ] && [ -e $GPUPILOT_RUN_DIR/done2 ]; do sleep 0.01; done; exit 5; }\"\n\
         [run.ranks]\nnproc = 3\ngrace_s = 1\n",
    )
    .unwrap();
    let out = home.run(&["run", profile.to_str().unwrap()], Duration::from_secs(30));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{stdout}\n{err}");
    let id = err
        .split("started run ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no run id in {err}"))
        .trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    let mut lines: Vec<&str> = stdout.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        (0..3)
            .map(|r| format!("[rank{r}]: rank {r} of 3 run {id}"))
            .collect::<Vec<_>>(),
        "{err}"
    );
    let log = std::fs::read_to_string(home.run_dir(id).stderr_path()).unwrap();
    assert!(
        log.contains("gpupilot ranks: rank 1 exited with code 5"),
        "{log}"
    );

    // `profile check` says what it will run.
    let out = home.ok(&["profile", "check", profile.to_str().unwrap()]);
    assert!(
        out.contains("  launcher     3 local ranks with torchrun's environment, master 127.0.0.1 (a free port at each start)\n"),
        "{out}"
    );
    let bad = home.dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[run]\nlauncher = \"ranks\"\ncommand = [\"t\"]\n[run.ranks]\nnproc = 0\n",
    )
    .unwrap();
    let out = home.run(
        &["profile", "check", bad.to_str().unwrap()],
        Duration::from_secs(20),
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with(&format!(
            "{}:5:9: nproc = 0: must be between 1 and 256",
            bad.display()
        )),
        "{err}"
    );
}
