//! Distributed runs end to end: a real daemon, ranks that are real processes running the
//! Python SDK (standard library only), and one rank played by hand over a raw connection so
//! that the test decides when it votes, refuses, leaves or lies. Every knob change to the run
//! must land on every rank at one step, or on none.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::support::home::{Home, Raw};
use crate::support::ranks::{RANK_SCRIPT, printed, sdk_dir};
use crate::support::wait::wait_for;
use gpupilot::client::Client;
use rustix::process::Signal;
use serde_json::{Value, json};

/// A run of a world of 4 whose ranks `sdk_ranks` run the script (the others are left to the
/// test); its id.
fn start_ranks(home: &Home, sdk_ranks: &[u32]) -> String {
    let script = home.dir.path().join("rank.py");
    std::fs::write(&script, RANK_SCRIPT).unwrap();
    let starts: Vec<String> = sdk_ranks
        .iter()
        .map(|r| {
            format!(
                "RANK={r} LOCAL_RANK={r} WORLD_SIZE=4 python3 {} &",
                script.display()
            )
        })
        .collect();
    let profile = home.dir.path().join("ddp.toml");
    let body = format!(
        "name = \"ddp\"\n[run]\ncommand = [\"sh\", \"-c\", \"{} wait\"]\nenv = {{ SDK_DIR = \"{}\" }}\n\
         [knobs.batch_size]\ninitial = 32\nmin = 1\nmax = 1024\n",
        starts.join(" "),
        sdk_dir().display()
    );
    std::fs::write(&profile, body).unwrap();
    home.ok(&["run", "--detach", &profile.display().to_string()])
        .trim()
        .to_string()
}

/// Wait until `n` ranks are attached and each has reported a step.
fn wait_ranks(c: &Client, run: &str, n: usize) {
    wait_for(
        "the ranks to attach and report",
        Duration::from_secs(30),
        || {
            c.run_metrics(run, 0).is_ok_and(|m| {
                m.trainer
                    .ranks
                    .iter()
                    .filter(|r| {
                        r.attached && r.last.as_ref().is_some_and(|p| p.report.step.is_some())
                    })
                    .count()
                    >= n
            })
        },
    );
}

/// Every line the ranks printed in the run's output: rank → (step → batch size).
fn printed_by(home: &Home, run: &str) -> BTreeMap<u64, BTreeMap<u64, i64>> {
    let text = std::fs::read_to_string(home.run_dir(run).path().join("stdout.log")).unwrap();
    printed([text.as_str()])
}

/// The newest step any rank reported.
fn newest_step(c: &Client, run: &str) -> u64 {
    c.run_metrics(run, 0)
        .unwrap()
        .trainer
        .ranks
        .iter()
        .filter_map(|r| r.last.as_ref()?.report.step)
        .max()
        .unwrap_or(0)
}

/// One rank played by hand.
struct HandRank {
    raw: Raw,
    next_id: u64,
    /// Pushes read while waiting for an answer.
    pushes: std::collections::VecDeque<Value>,
}

impl HandRank {
    /// Attach as `rank` of a world of `world`; the daemon's answer.
    fn attach(home: &Home, run: &str, rank: u32, world: u32) -> (HandRank, Value) {
        let mut raw = Raw::connect(&home.socket());
        raw.hello();
        let mut me = HandRank {
            raw,
            next_id: 1,
            pushes: Default::default(),
        };
        let answer = me.ask(json!({
            "type": "trainer_attach", "run": run, "pid": 4_000_000 + rank,
            "rank": rank, "world_size": world, "local_rank": rank, "gpu": rank,
            "knobs": {"batch_size": 32},
        }));
        (me, answer)
    }

    fn send(&mut self, mut frame: Value) -> u64 {
        self.next_id += 1;
        frame["id"] = json!(self.next_id);
        let mut line = frame.to_string();
        line.push('\n');
        self.raw.send(line.as_bytes()).unwrap();
        self.next_id
    }

    /// Send and wait for the answer (pushes met on the way are kept for `push`).
    fn ask(&mut self, frame: Value) -> Value {
        let id = self.send(frame);
        loop {
            let f = self.raw.recv().expect("an answer");
            if f["id"] == id {
                return f;
            }
            if f.get("id").is_none() {
                self.pushes.push_back(f);
            }
        }
    }

    /// The next push of type `kind` (others are skipped).
    fn push(&mut self, kind: &str) -> Value {
        while let Some(f) = self.pushes.pop_front() {
            if f["type"] == kind {
                return f;
            }
        }
        loop {
            let f = self.raw.recv().expect("a push");
            if f.get("id").is_none() && f["type"] == kind {
                return f;
            }
        }
    }

    fn report(&mut self, step: u64) {
        self.ask(json!({"type": "metrics", "step": step, "batch_size": 32}));
    }
}

/// `gpupilot set` as a user types it, on a thread (it waits for the outcome); its output.
fn set_in_background(
    home: &Home,
    run: &str,
    value: &str,
) -> std::thread::JoinHandle<std::process::Output> {
    let mut cmd = home.gpupilot(&["set", run, "batch-size", value, "--timeout", "20"]);
    std::thread::spawn(move || cmd.output().unwrap())
}

#[test]
fn a_batch_size_change_lands_on_every_rank_at_one_step() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let run = start_ranks(&home, &[0, 1, 2, 3]);
    let c = home.client();
    wait_ranks(&c, &run, 4);
    let m = c.run_metrics(&run, 0).unwrap();
    assert_eq!(m.trainer.world_size, Some(4));
    let hosts: Vec<_> = m
        .trainer
        .ranks
        .iter()
        .map(|r| (r.spec.rank, r.spec.gpu))
        .collect();
    assert_eq!(
        hosts,
        [(0, Some(0)), (1, Some(1)), (2, Some(2)), (3, Some(3))]
    );
    let job = m.trainer.job.expect("job figures");
    assert_eq!(job.reporting, 4);
    let summed = job.samples_per_s.unwrap();
    assert!(
        (summed - 4.0 * 32.0 / 0.02).abs() < 1e-6,
        "samples/s summed: {summed}"
    );

    let out = home.run(&["set", &run, "batch-size", "64"], Duration::from_secs(30));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let applied = home.events_named("knob_applied");
    assert_eq!(applied.len(), 1, "{applied:?}");
    assert_eq!(applied[0]["ranks"], 4);
    let at = applied[0]["step"].as_u64().unwrap();
    assert!(
        text.contains("4/4 ranks") && text.contains(&format!("step {at}")),
        "{text}"
    );
    let staged = home.events_named("knob_staged");
    assert_eq!(staged[0]["apply_step"], at);

    // Every rank printed 32 up to the step before, and 64 from it on.
    wait_for("every rank past the step", Duration::from_secs(10), || {
        printed_by(&home, &run)
            .values()
            .all(|steps| steps.keys().max().is_some_and(|&s| s > at + 3))
    });
    let by_rank = printed_by(&home, &run);
    assert_eq!(by_rank.len(), 4);
    for (rank, steps) in &by_rank {
        let first_new = steps.iter().find(|(_, bs)| **bs == 64).map(|(s, _)| *s);
        assert_eq!(
            first_new,
            Some(at),
            "rank {rank} switched at {first_new:?}, not {at}"
        );
        assert!(
            steps
                .iter()
                .all(|(s, bs)| (*s < at && *bs == 32) || (*s >= at && *bs == 64)),
            "rank {rank}: {steps:?}"
        );
    }
    // The job's value is kept for restarts, and the run's events say what happened.
    let m = c.run_metrics(&run, 0).unwrap();
    let bs = m
        .trainer
        .knobs
        .iter()
        .find(|k| k.knob.as_str() == "batch_size")
        .unwrap();
    assert_eq!(bs.value, Some(64));
    assert!(m.trainer.staged.is_none());
    // Reports carry their rank.
    let metrics = std::fs::read_to_string(home.run_dir(&run).path().join("metrics.jsonl")).unwrap();
    let ranks: std::collections::BTreeSet<u64> = metrics
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok()?["rank"].as_u64())
        .collect();
    assert_eq!(ranks, [0, 1, 2, 3].into());
}

#[test]
fn refusals_departures_and_lies_change_no_rank() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let run = start_ranks(&home, &[0, 1, 2]);
    let c = home.client();
    wait_ranks(&c, &run, 3);

    // Ranks outside the world, and a second process claiming a rank, are refused.
    let (_, answer) = HandRank::attach(&home, &run, 7, 4);
    assert_eq!(answer["code"], "bad_request", "{answer}");
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .contains("outside a world of 4")
    );
    let (_, answer) = HandRank::attach(&home, &run, 1, 4);
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .contains("rank 1 is already attached"),
        "{answer}"
    );
    let (_, answer) = HandRank::attach(&home, &run, 3, 8);
    assert!(
        answer["message"].as_str().unwrap().contains("say 4"),
        "{answer}"
    );
    assert_eq!(home.events_named("rank_refused").len(), 3);

    // Without rank 3 a change cannot reach the job.
    let out = home.run(&["set", &run, "batch-size", "64"], Duration::from_secs(30));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("rank 3 of run") && err.contains("nothing changed"),
        "{err}"
    );

    // Rank 3 attaches, reports where the others are, and then refuses the change.
    let (mut r3, answer) = HandRank::attach(&home, &run, 3, 4);
    assert_eq!(answer["type"], "trainer_attached", "{answer}");
    r3.report(newest_step(&c, &run));
    // An acknowledgement for a change never sent is recorded, and changes nothing.
    r3.ask(json!({"type": "knob_ack", "seq": 999, "applied": true, "step": 5}));
    wait_for("the stray ack's event", Duration::from_secs(5), || {
        !home.events_named("knob_stray").is_empty()
    });

    let set = set_in_background(&home, &run, "64");
    let proposal = r3.push("knob");
    let apply_step = proposal["apply_step"].as_u64().expect("an apply step");
    assert_eq!(proposal["value"], 64);
    r3.ask(
        json!({"type": "knob_vote", "seq": proposal["seq"], "ready": false,
                  "reason": "batch 64 does not fit"}),
    );
    let decision = r3.push("knob_decision");
    assert_eq!(decision["commit"], false);
    let out = set.join().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("rank 3") && err.contains("batch 64 does not fit"),
        "{err}"
    );
    let rejected = home.events_named("knob_rejected");
    assert_eq!(rejected.last().unwrap()["rank"], 3);

    // Rank 3 goes away in the middle of the next one: called off as well.
    let set = set_in_background(&home, &run, "64");
    let proposal = r3.push("knob");
    assert!(proposal["apply_step"].as_u64().is_some());
    drop(r3);
    let out = set.join().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("rank 3 left"), "{err}");

    // No rank ever used 64.
    wait_for(
        "the ranks past both apply steps",
        Duration::from_secs(10),
        || newest_step(&c, &run) > apply_step + 20,
    );
    for (rank, steps) in printed_by(&home, &run) {
        assert!(
            steps.values().all(|bs| *bs == 32),
            "rank {rank} changed: {steps:?}"
        );
    }
    assert_eq!(home.events_named("knob_applied").len(), 0);
}

#[test]
fn a_late_rank_takes_the_job_value_and_a_killed_daemon_changes_nothing() {
    let home = Home::new();
    let mut daemon = home.daemon(&[]);
    let run = start_ranks(&home, &[0, 1, 2]);
    let c = home.client();
    wait_ranks(&c, &run, 3);

    // Rank 3 by hand agrees; every rank applies the change at its step.
    let (mut r3, _) = HandRank::attach(&home, &run, 3, 4);
    r3.report(newest_step(&c, &run));
    let set = set_in_background(&home, &run, "48");
    let proposal = r3.push("knob");
    let apply_step = proposal["apply_step"].as_u64().unwrap();
    r3.ask(json!({"type": "knob_vote", "seq": proposal["seq"], "ready": true}));
    assert_eq!(r3.push("knob_decision")["commit"], true);
    r3.ask(
        json!({"type": "knob_ack", "seq": proposal["seq"], "applied": true, "step": apply_step}),
    );
    let out = set.join().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(r3);

    // A rank that attaches later, before its first step, is told the job's value.
    let (mut late, answer) = HandRank::attach(&home, &run, 3, 4);
    assert_eq!(answer["knobs"]["batch_size"], 48, "{answer}");
    late.report(newest_step(&c, &run));

    // The daemon is killed between the proposal and the apply step: no decision reaches the
    // ranks, so none changes.
    let set = set_in_background(&home, &run, "96");
    let proposal = late.push("knob");
    let apply_step = proposal["apply_step"].as_u64().unwrap();
    daemon.signal_and_wait(Signal::KILL);
    let _ = set.join();
    drop(late);
    let _daemon = home.daemon(&[]);
    let c = home.client();
    wait_ranks(&c, &run, 3);
    wait_for(
        "the ranks past the apply step",
        Duration::from_secs(15),
        || newest_step(&c, &run) > apply_step + 10,
    );
    for (rank, steps) in printed_by(&home, &run) {
        assert!(
            steps.values().all(|bs| *bs == 32 || *bs == 48),
            "rank {rank} used 96: {steps:?}"
        );
        assert_eq!(steps.values().last(), Some(&48), "rank {rank}");
    }
    // The ranks told the new daemon they kept their value.
    wait_for(
        "the ranks' word on the undecided change",
        Duration::from_secs(10),
        || {
            home.events_named("knob_stray")
                .iter()
                .any(|e| e["what"].as_str().unwrap_or("").contains("did not decide"))
        },
    );
    let _ = Instant::now();
}

#[test]
fn a_rank_that_missed_the_step_is_brought_to_the_job_value() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let run = start_ranks(&home, &[0, 1, 2]);
    let c = home.client();
    wait_ranks(&c, &run, 3);
    let (mut r3, _) = HandRank::attach(&home, &run, 3, 4);
    r3.report(newest_step(&c, &run));

    // Rank 3 agrees, but says the decision came after it had reached the step: the other
    // ranks switch, it does not.
    let set = set_in_background(&home, &run, "64");
    let proposal = r3.push("knob");
    let at = proposal["apply_step"].as_u64().unwrap();
    r3.ask(json!({"type": "knob_vote", "seq": proposal["seq"], "ready": true}));
    assert_eq!(r3.push("knob_decision")["commit"], true);
    r3.ask(
        json!({"type": "knob_ack", "seq": proposal["seq"], "applied": false, "step": at,
                  "reason": "no decision had come by step"}),
    );
    let out = set.join().unwrap();
    assert!(
        !out.status.success(),
        "a change not applied everywhere is not a success"
    );
    let rejected = home.events_named("knob_rejected");
    let reason = rejected.last().unwrap()["reason"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        reason.contains(&format!("applied at step {at} by 3 of 4 ranks")),
        "{reason}"
    );

    // Its next report shows the old value past the step: the daemon proposes the job's value
    // to every rank at a new step, and every rank ends on it.
    wait_for("the ranks past the step", Duration::from_secs(10), || {
        newest_step(&c, &run) > at
    });
    // (three reports: one alone could be the short last batch of an epoch)
    let newest = newest_step(&c, &run);
    for step in newest..newest + 3 {
        r3.report(step);
    }
    let repair = r3.push("knob");
    assert_eq!(repair["value"], 64);
    let again = repair["apply_step"].as_u64().unwrap();
    assert!(again > at);
    r3.ask(json!({"type": "knob_vote", "seq": repair["seq"], "ready": true}));
    assert_eq!(r3.push("knob_decision")["commit"], true);
    r3.ask(json!({"type": "knob_ack", "seq": repair["seq"], "applied": true, "step": again}));
    wait_for(
        "the repair applied on every rank",
        Duration::from_secs(10),
        || {
            home.events_named("knob_applied")
                .iter()
                .any(|e| e["change"] == repair["seq"] && e["ranks"] == 4)
        },
    );
    assert!(
        home.events_named("knob_stray")
            .iter()
            .any(|e| e["rank"] == 3 && e["what"].as_str().unwrap().contains("rank 3 uses 32")),
        "{:?}",
        home.events_named("knob_stray")
    );
    // The SDK ranks kept 64 throughout: the repair changed nothing on them.
    for (rank, steps) in printed_by(&home, &run) {
        assert!(
            steps
                .iter()
                .all(|(s, bs)| (*s < at && *bs == 32) || (*s >= at && *bs == 64)),
            "rank {rank}: {steps:?}"
        );
    }
}

/// Two SDK ranks whose first attempt fails after five steps (FAIL: "oom", out of memory at
/// its batch; "crash", another error); each prints what it trains with, tagged by attempt.
const TWO_ATTEMPTS: &str = r#"
import json, os, sys, time
sys.path.insert(0, os.environ["SDK_DIR"])
import gpupilot
rank = int(os.environ["RANK"])
seen = os.path.join(os.environ["MARK_DIR"], "rank%d" % rank)
attempt = 1 if os.path.exists(seen) else 0
gp = gpupilot.connect(knobs={"batch_size": 100})
deadline = time.monotonic() + 20
while not gp.connected and time.monotonic() < deadline:
    time.sleep(0.01)
for step in range(5 if attempt == 0 else 15):
    bs = gp.knob("batch_size")
    # One write a line: two ranks' lines are not run together.
    sys.stdout.write(json.dumps({"attempt": attempt, "rank": rank, "step": step, "bs": bs}) + "\n")
    sys.stdout.flush()
    time.sleep(0.02)
    gp.report(step=step, samples_per_s=bs / 0.02, step_time_s=0.02)
if attempt == 0:
    open(seen, "w").close()
    oom = os.environ["FAIL"] == "oom"
    if oom and rank == 0:
        gp.error("oom", "CUDA out of memory at batch %d" % bs)
    gp.close()
    if oom:
        sys.stderr.write("torch.OutOfMemoryError: CUDA out of memory (rank %d)\n" % rank)
    sys.exit(1)
gp.close()
"#;

/// A run of two ranks of [`TWO_ATTEMPTS`] failing as `fail` says, restarted by `restart` (the
/// profile's `[run.restart]` lines), starting at batch 64; its id.
fn start_two_attempts(home: &Home, fail: &str, restart: &str) -> String {
    let script = home.dir.path().join("two.py");
    std::fs::write(&script, TWO_ATTEMPTS).unwrap();
    let marks = home.dir.path().join("marks");
    std::fs::create_dir(&marks).unwrap();
    let rank = |r: u32| {
        format!(
            "RANK={r} LOCAL_RANK={r} WORLD_SIZE=2 python3 {}",
            script.display()
        )
    };
    // Either rank failing fails the job, as a launcher's would.
    let command = format!(
        "{} & a=$!; {}; b=$?; wait $a; exit $(( $? | b ))",
        rank(0),
        rank(1)
    );
    let profile = home.dir.path().join("two.toml");
    std::fs::write(
        &profile,
        format!(
            "name = \"two\"\n[run]\ncommand = [\"sh\", \"-c\", {command:?}]\n\
             env = {{ SDK_DIR = \"{}\", MARK_DIR = \"{}\", FAIL = \"{fail}\" }}\n\
             [run.restart]\n{restart}\n\
             [knobs.batch_size]\ninitial = 64\nmin = 1\nmax = 1024\n",
            sdk_dir().display(),
            marks.display()
        ),
    )
    .unwrap();
    home.ok(&["run", "--detach", &profile.display().to_string()])
        .trim()
        .to_string()
}

/// Wait for `run` to succeed after one restart, and check what both its ranks trained with:
/// 64 for the first attempt's 5 steps, `second` for the second's 15.
fn assert_two_attempts(home: &Home, c: &Client, run: &str, second: i64) {
    wait_for("the second attempt to end", Duration::from_secs(60), || {
        c.run(run).is_ok_and(|r| r.status.as_str() == "succeeded")
    });
    assert_eq!(c.run(run).unwrap().restarts, 1);
    let text = std::fs::read_to_string(home.run_dir(run).path().join("stdout.log")).unwrap();
    // (attempt, rank) → batch size by step.
    let mut used: BTreeMap<(u64, u64), Vec<i64>> = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with('{')) {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        used.entry((v["attempt"].as_u64().unwrap(), v["rank"].as_u64().unwrap()))
            .or_default()
            .push(v["bs"].as_i64().unwrap());
    }
    for rank in 0..2 {
        assert_eq!(used[&(0, rank)], [64; 5], "attempt 0, rank {rank}");
        assert_eq!(used[&(1, rank)], [second; 15], "attempt 1, rank {rank}");
    }
}

#[test]
fn after_running_out_of_memory_every_rank_starts_again_with_the_halved_batch() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let run = start_two_attempts(
        &home,
        "oom",
        "on_oom = \"halve_batch\"\nmax_restarts = 2\nbackoff_s = 0",
    );
    // Not the 64 the last attempt's ranks agreed on: that ran out of memory.
    assert_two_attempts(&home, &home.client(), &run, 32);
    let events = std::fs::read_to_string(home.run_dir(&run).path().join("events.jsonl")).unwrap();
    assert!(events.contains(r#""old":"64","new":"32""#), "{events}");
    // What the first attempt's ranks reported is not taken for a disagreement in the second.
    let stray = home.events_named("knob_stray");
    assert!(stray.is_empty(), "{stray:?}");
}

#[test]
fn a_change_between_attempts_of_a_distributed_run_starts_the_next_one() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let run = start_two_attempts(
        &home,
        "crash",
        "policy = \"on-failure\"\nmax_restarts = 2\nbackoff_s = 4",
    );
    let c = home.client();
    wait_for("the first attempt to fail", Duration::from_secs(30), || {
        c.run(&run).is_ok_and(|r| r.status.as_str() == "backoff")
    });
    // No rank is there to vote: the value is the next attempt's, for every rank.
    let out = home.ok(&["set", &run, "batch-size", "48"]);
    assert!(
        out.contains("batch_size 64 → 48: restarting the run with the new value"),
        "{out}"
    );
    assert_two_attempts(&home, &c, &run, 48);
    let changed = home.events_named("knob_changed");
    assert_eq!(changed.len(), 1, "{changed:?}");
    assert_eq!(
        (&changed[0]["old"], &changed[0]["via"]),
        (&json!(64), &json!("restart"))
    );
}
