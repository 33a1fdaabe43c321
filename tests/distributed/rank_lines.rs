//! A job's ranks printing at once keep their lines whole: four unbuffered Python ranks of a
//! `launcher = "ranks"` run (each line written as its text and its newline, two `write()`s)
//! leave a stdout.log of whole lines, each with its rank, and `logs --rank N` shows rank N's.
//! (Four such ranks appending to one file themselves glue about a quarter of their lines.)

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use crate::support::home::Home;
use crate::support::wait::wait_for;

const RANKS: u64 = 4;
const LINES: u64 = 1000;

const SCRIPT: &str = r#"
import json, os, sys, time
rank = int(os.environ["RANK"])
# Every rank prints at the same time: wait until all have started.
run_dir = os.environ["GPUPILOT_RUN_DIR"]
open(os.path.join(run_dir, "up%d" % rank), "w").close()
while sum(os.path.exists(os.path.join(run_dir, "up%d" % r)) for r in range(RANKS)) < RANKS:
    time.sleep(0.001)
for step in range(LINES):
    print(json.dumps({"rank": rank, "step": step, "bs": 64}))
    print("rank %d warns at %d" % (rank, step), file=sys.stderr)
"#;

/// Lines of a log as (rank of the prefix, the text after it); panics on a line without one.
fn by_prefix(log: &str) -> Vec<(u64, &str)> {
    log.lines()
        .map(|l| {
            let rest = l
                .strip_prefix("[rank")
                .unwrap_or_else(|| panic!("a line without its rank: {l:?}"));
            let (rank, text) = rest.split_once("]: ").unwrap();
            (rank.parse().unwrap(), text)
        })
        .collect()
}

#[test]
fn unbuffered_ranks_leave_whole_lines_and_logs_picks_one_rank() {
    let home = Home::new();
    let _d = home.daemon(&[]);
    let script = home.dir.path().join("lines.py");
    std::fs::write(
        &script,
        SCRIPT
            .replace("LINES", &LINES.to_string())
            .replace("RANKS", &RANKS.to_string()),
    )
    .unwrap();
    let profile = home.dir.path().join("lines.toml");
    std::fs::write(
        &profile,
        format!(
            "[run]\nlauncher = \"ranks\"\ncommand = [\"python3\", \"-u\", \"{}\"]\n[run.ranks]\nnproc = {RANKS}\n",
            script.display()
        ),
    )
    .unwrap();
    home.ok(&["run", "--detach", profile.to_str().unwrap()]);
    let c = home.client();
    wait_for("the job to end", Duration::from_secs(60), || {
        c.run("last").is_ok_and(|r| r.is_final())
    });
    let info = c.run("last").unwrap();
    let id = info.id;
    assert_eq!(info.exit_code, Some(0), "{:?}", info.description);
    let dir = home.run_dir(&id);
    let stdout = std::fs::read_to_string(dir.stdout_path()).unwrap();
    // Every line is one JSON object of the rank its prefix names: none glued to another.
    let mut steps: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for (rank, text) in by_prefix(&stdout) {
        let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        assert_eq!(v["rank"].as_u64(), Some(rank), "{text}");
        steps
            .entry(rank)
            .or_default()
            .push(v["step"].as_u64().unwrap());
    }
    assert_eq!(steps.len() as u64, RANKS, "{stdout}");
    for (rank, s) in &steps {
        assert_eq!(*s, (0..LINES).collect::<Vec<_>>(), "rank {rank}'s steps");
    }
    let stderr = std::fs::read_to_string(dir.stderr_path()).unwrap();
    let errs = by_prefix(&stderr);
    assert_eq!(errs.len() as u64, RANKS * LINES);
    for (rank, text) in &errs {
        assert!(
            text.starts_with(&format!("rank {rank} warns at ")),
            "{text}"
        );
    }

    // `logs --rank 2` is rank 2's lines of the file, in order, and nothing else.
    let want: String = stdout
        .lines()
        .filter(|l| l.starts_with("[rank2]: "))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(want.lines().count() as u64, LINES);
    assert_eq!(home.ok(&["logs", &id, "--rank", "2"]), want);
    assert_eq!(home.ok(&["logs", &id, "--rank", "2", "-f"]), want);
    let rank1_err = home.ok(&["logs", &id, "--stderr", "--rank", "1"]);
    assert_eq!(rank1_err.lines().count() as u64, LINES);
    assert!(
        rank1_err
            .lines()
            .all(|l| l.starts_with("[rank1]: rank 1 warns at "))
    );

    // A rank the job does not have, or not a number: a clear error.
    let out = home.run(&["logs", &id, "--rank", "4"], Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("run {id} has 4 ranks, 0 to 3: there is no rank 4")),
        "{err}"
    );
    assert!(out.stdout.is_empty());
    let out = home.run(&["logs", &id, "--rank", "two"], Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("invalid value 'two' for '--rank <N>'"),
        "{err}"
    );

    // A run whose lines carry no rank.
    home.run(
        &["run", "--", "sh", "-c", "echo plain"],
        Duration::from_secs(30),
    );
    let out = home.run(&["logs", "last", "--rank", "0"], Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("was not started with `launcher = \"ranks\"`"),
        "{err}"
    );
    assert_eq!(home.ok(&["logs", "last"]), "plain\n");
}
