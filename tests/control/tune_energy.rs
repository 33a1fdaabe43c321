//! `gpupilot tune energy` on a live run: a real daemon on the simulator, the synthetic trainer
//! reporting over the trainer channel (its steps slow down as the cap lowers the clock), and the
//! command as a user types it. The search is a job of the daemon: a client killed with SIGKILL
//! leaves it running; a daemon killed with SIGKILL mid-search (on the fake NVML library, whose
//! GPUs outlive it) is followed by one that resumes the job or puts the caps back.

use std::process::Stdio;
use std::time::Duration;

use crate::support::home::{Home, power_caps as caps};
use crate::support::nvml_daemon::NvmlDaemon;
use crate::support::proc::send;
use crate::support::wait::wait_for;
use crate::wait_every;
use rustix::process::Signal;

pub(crate) use crate::support::home::QUICK_SEARCH as QUICK;

/// `gpupilot ARGS` within `secs`, which must succeed: its stdout and stderr.
pub(crate) fn succeeded(home: &Home, args: &[&str], secs: u64) -> (String, String) {
    let out = home.run(args, Duration::from_secs(secs));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stdout}\n{stderr}");
    (stdout, stderr)
}

/// `gpupilot ARGS`, started with its output piped.
fn spawned(home: &Home, args: &[&str]) -> std::process::Child {
    home.gpupilot(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `gpupilot ARGS` within `secs`, which must fail: its stderr.
fn failed(home: &Home, args: &[&str], secs: u64) -> String {
    let out = home.run(args, Duration::from_secs(secs));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{stderr}");
    stderr
}

#[test]
fn a_search_on_a_live_run_sets_the_best_cap_and_saves_it() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let run = home.start_synthetic();
    let mut args = vec!["tune", "energy", &run];
    args.extend(QUICK);
    let (stdout, stderr) = succeeded(&home, &args, 120);
    assert!(
        stderr.contains("[2/3] 450 W measuring"),
        "progress: {stderr}"
    );
    assert!(stdout.contains("← best"), "{stdout}");
    assert!(stdout.contains("[power]\ncap_w = "), "{stdout}");

    let saved = home.run_dir(&run).path().join("tune-energy.json");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
    let curve = r["curve"].as_array().unwrap();
    assert_eq!(curve.len(), 3, "{r}");
    let best = r["best"]["cap_w"].as_f64().unwrap();
    // Energy per sample falls from the top cap: the cap that binds saves energy.
    assert!(best < 700.0, "{r}");
    assert!(r["energy_saving_pct"].as_f64().unwrap() > 0.0, "{r}");
    for p in curve {
        assert!(p["samples"].as_f64().unwrap() > 0.0 && p["energy_j"].as_f64().unwrap() > 0.0);
    }
    // The best cap is set on the run's GPUs (all of them: no CUDA_VISIBLE_DEVICES), through
    // the daemon, so the node's events hold each change.
    assert_eq!(caps(&home.client()), [best, best]);
    let changes: Vec<serde_json::Value> = home
        .node_events()
        .into_iter()
        .filter(|e| e.to_string().contains("energy tuner"))
        .collect();
    assert!(changes.len() >= 3, "{changes:?}");
}

#[test]
fn an_interrupted_search_puts_the_starting_caps_back() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let run = home.start_synthetic();
    home.ok(&["power", "cap", "650"]);
    let mut args = vec!["tune", "energy", &run];
    args.extend(QUICK);
    let mut child = spawned(&home, &args);
    // Interrupt once the search has moved to its second cap.
    let c = home.client();
    wait_for("the tuner's second cap", Duration::from_secs(30), || {
        caps(&c) == [450.0, 450.0]
    });
    send(child.id(), Signal::INT);
    wait_for("the tuner to stop", Duration::from_secs(20), || {
        child.try_wait().unwrap().is_some()
    });
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("tuning stopped (interrupted)"), "{stderr}");
    assert!(stderr.contains("back at its starting cap"), "{stderr}");
    assert_eq!(caps(&c), [650.0, 650.0]);
    assert!(!home.run_dir(&run).path().join("tune-energy.json").exists());
}

#[test]
fn the_run_ending_mid_way_puts_the_starting_caps_back() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let run = home.start_synthetic();
    let mut args = vec!["tune", "energy", &run];
    args.extend(QUICK);
    let child = spawned(&home, &args);
    let c = home.client();
    wait_for("the tuner's second cap", Duration::from_secs(30), || {
        caps(&c) == [450.0, 450.0]
    });
    home.ok(&["stop", &run]);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("tuning stopped (the run ended)"),
        "{stderr}"
    );
    assert_eq!(caps(&c), [700.0, 700.0]);
}

/// Under a node budget (or a thermal governor) a cap set from outside is a ceiling: a GPU the
/// budget holds lower stays there, so a search's caps would not be the GPUs'. A search is
/// refused while a budget is set; one turned on mid-search stops it at once, with the reason,
/// and its starting caps are what the budget gives back when it goes.
#[test]
fn a_search_is_refused_under_a_budget_and_stops_when_one_comes() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let run = home.start_synthetic();
    let c = home.client();
    let mut args = vec!["tune", "energy", &run];
    args.extend(QUICK);

    home.ok(&["budget", "900"]);
    let stderr = failed(&home, &args, 60);
    assert!(
        stderr.contains("a node budget of 900 W shares the power caps")
            && stderr.contains("`gpupilot budget off`"),
        "{stderr}"
    );
    assert!(
        !home
            .node_events()
            .iter()
            .any(|e| e.to_string().contains("energy tuner")),
        "a refused search changed a cap"
    );
    home.ok(&["budget", "off"]);
    wait_for(
        "the caps from before the budget",
        Duration::from_secs(20),
        || caps(&c) == [700.0, 700.0],
    );

    // A budget that comes while the search measures 450 W holds the GPUs at 300 W each.
    let child = spawned(&home, &args);
    wait_for("the tuner's second cap", Duration::from_secs(30), || {
        caps(&c) == [450.0, 450.0]
    });
    home.ok(&["budget", "600"]);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("tuning stopped (GPU ")
            && stderr.contains("not the 450 W the search is measuring")
            && stderr.contains("the thermal governor or the node budget holds it lower"),
        "{stderr}"
    );
    assert!(!home.run_dir(&run).path().join("tune-energy.json").exists());
    assert!(caps(&c).iter().sum::<f64>() <= 600.5, "{:?}", caps(&c));
    home.ok(&["budget", "off"]);
    wait_for(
        "the search's starting caps",
        Duration::from_secs(20),
        || caps(&c) == [700.0, 700.0],
    );
}

/// `gpupilot run --detach PROFILE`: the run's id.
pub(crate) fn run_detached(home: &Home, profile: &std::path::Path) -> String {
    home.ok(&["run", "--detach", &profile.display().to_string()])
        .trim()
        .to_string()
}

/// A data-parallel job of `world` synthetic ranks on GPUs 0.. of the simulated node, of which
/// ranks `started` run; its id once they all report.
fn start_job(home: &Home, world: u32, started: &[u32]) -> String {
    start_job_with(home, world, started, "")
}

/// The same, its profile with `extra` (its knobs).
fn start_job_with(home: &Home, world: u32, started: &[u32], extra: &str) -> String {
    let bin = env!("CARGO_BIN_EXE_gpupilot");
    let starts: Vec<String> = started
        .iter()
        .map(|r| {
            format!("RANK={r} LOCAL_RANK={r} WORLD_SIZE={world} {bin} synthetic-train --speed 4 &")
        })
        .collect();
    let profile = home.dir.path().join("ddp.toml");
    std::fs::write(
        &profile,
        format!(
            "name = \"ddp\"\n{extra}\n[run]\ncommand = [\"sh\", \"-c\", \"{} wait\"]\n",
            starts.join(" ")
        ),
    )
    .unwrap();
    let run = run_detached(home, &profile);
    let c = home.client();
    wait_for("every rank to report", Duration::from_secs(30), || {
        c.run_metrics(&run, 0).is_ok_and(|m| {
            m.trainer.ranks.len() == started.len()
                && m.trainer.ranks.iter().all(|r| r.last.is_some())
        })
    });
    run
}

#[test]
fn a_job_of_several_ranks_is_tuned_as_one() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let run = start_job(&home, 2, &[0, 1]);
    let mut args = vec!["tune", "energy", &run];
    args.extend(QUICK);
    let (_, stderr) = succeeded(&home, &args, 120);
    assert!(
        stderr.contains(&format!(
            "the power cap of job {run} (2 ranks) on GPUs 0,1 together, one cap for all"
        )),
        "{stderr}"
    );
    let saved = home.run_dir(&run).path().join("tune-energy.json");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
    // Zeus's max power is the job's: both GPUs' maximum limits.
    assert_eq!(r["max_power_w"].as_f64(), Some(1400.0), "{r}");
    let best = r["best"]["cap_w"].as_f64().unwrap();
    assert_eq!(caps(&home.client()), [best, best]);
    // Every cap tried went to both GPUs in one change each.
    let tried: Vec<serde_json::Value> = home
        .node_events()
        .into_iter()
        .filter(|e| e["why"] == "energy tuner: trying a cap")
        .collect();
    assert!(tried.len() >= 6, "{tried:?}");
    for pair in tried.chunks(2) {
        assert_eq!(pair[0]["new"], pair[1]["new"], "{pair:?}");
    }
}

#[test]
fn a_job_whose_ranks_do_not_all_report_here_is_refused() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    // Rank 2 of 3 is on another node (or not started): its GPU's energy is out of sight.
    let run = start_job(&home, 3, &[0, 1]);
    let mut args = vec!["tune", "energy", &run];
    args.extend(QUICK);
    let stderr = failed(&home, &args, 60);
    assert!(
        stderr.contains("a job of 3 ranks and 2 of them report to this daemon"),
        "{stderr}"
    );
    assert_eq!(caps(&home.client()), [700.0, 700.0], "nothing was changed");
}

/// How often a test asks `tune status` (a `gpupilot` process each time) while it waits for a
/// job: a search's steps last seconds.
pub(crate) const JOB_POLL: Duration = Duration::from_millis(250);

/// The job on `run` as `tune status --json` shows it.
pub(crate) fn job(home: &Home, run: &str) -> serde_json::Value {
    let out = home.ok(&["tune", "status", run, "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v[0].clone()
}

/// The `change`s of the node's `tune` events, oldest first.
pub(crate) fn tune_changes(home: &Home) -> Vec<String> {
    home.events_named("tune")
        .iter()
        .map(|e| e["change"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_client_killed_mid_search_leaves_the_job_to_the_daemon() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let run = home.start_synthetic();
    let mut args = vec!["tune", "energy", &run];
    args.extend(QUICK);
    let mut child = home
        .gpupilot(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let c = home.client();
    wait_for("the tuner's second cap", Duration::from_secs(30), || {
        caps(&c) == [450.0, 450.0]
    });
    send(child.id(), Signal::KILL);
    child.wait().unwrap();
    assert_eq!(job(&home, &run)["state"], "running");
    wait_every("the job to end", Duration::from_secs(60), JOB_POLL, || {
        job(&home, &run)["state"] != "running"
    });
    let j = job(&home, &run);
    assert_eq!(j["state"], "done", "{j}");
    let best = j["result"]["best"]["cap_w"].as_f64().unwrap();
    assert_eq!(caps(&c), [best, best]);
    assert!(home.run_dir(&run).path().join("tune-energy.json").exists());
    // Each step is a node event: the start, each cap tried and measured, the end.
    let changes = tune_changes(&home);
    assert_eq!(
        changes.first().map(String::as_str),
        Some("started"),
        "{changes:?}"
    );
    assert_eq!(
        changes.last().map(String::as_str),
        Some("done"),
        "{changes:?}"
    );
    let tried = j["result"]["curve"].as_array().unwrap().len();
    assert_eq!(changes.iter().filter(|c| *c == "measured").count(), tried);
    // `tune status` says it for people too.
    let status = home.ok(&["tune", "status"]);
    assert!(status.contains(&format!("tune-{run}  done")), "{status}");
    assert!(status.contains("best cap"), "{status}");
    // The next search on a run of this profile starts from this result.
    let mut again = vec!["tune", "energy", &run, "--detach"];
    again.extend(QUICK);
    home.ok(&again);
    let what = job(&home, &run)["what"].as_str().unwrap().to_string();
    assert!(
        what.contains(&format!(
            "the search starts around {best:.0} W, the best cap of tune-{run}"
        )),
        "{what}"
    );
    home.ok(&["tune", "stop", &run]);
}

#[test]
fn tune_stop_puts_the_starting_caps_back() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let run = home.start_synthetic();
    home.ok(&["power", "cap", "650"]);
    let mut args = vec!["tune", "energy", &run, "--detach"];
    args.extend(QUICK);
    let id = home.ok(&args).trim().to_string();
    assert_eq!(id, format!("tune-{run}"));
    let c = home.client();
    wait_for("the tuner's second cap", Duration::from_secs(30), || {
        caps(&c) == [450.0, 450.0]
    });
    // One search per run at a time.
    let again = home.run(&["tune", "energy", &run], Duration::from_secs(20));
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("is being tuned already"),
        "{again:?}"
    );
    let out = home.ok(&["tune", "stop", &id]);
    assert!(out.contains("cancelled"), "{out}");
    assert_eq!(caps(&c), [650.0, 650.0]);
    let j = job(&home, &id);
    assert_eq!(j["state"], "cancelled");
    assert_eq!(j["restored"], serde_json::json!({"Ok": null}), "{j}");
}

pub(crate) const TWO_H100: &str = "model = \"h100-sxm\"\ncount = 2\n";

/// The last power limit NVML was asked for on each GPU, watts.
pub(crate) fn last_limits(nv: &NvmlDaemon) -> std::collections::BTreeMap<u64, f64> {
    nv.setter_calls()
        .iter()
        .filter(|c| c["function"] == "nvmlDeviceSetPowerManagementLimit" && c["result"] == 0)
        .map(|c| {
            (
                c["gpu"].as_u64().unwrap(),
                c["value"].as_f64().unwrap() / 1000.0,
            )
        })
        .collect()
}

/// A daemon on two fake H100s with the synthetic trainer under a search, killed with SIGKILL
/// once the search has set its second cap: the GPUs keep that cap.
fn killed_mid_search() -> (NvmlDaemon, String) {
    let mut nv = NvmlDaemon::new(TWO_H100, &[]);
    let run = nv.home.start_synthetic();
    let mut args = vec!["tune", "energy", run.as_str(), "--detach"];
    args.extend(QUICK);
    nv.ok(&args);
    let c = nv.home.client();
    wait_for("the tuner's second cap", Duration::from_secs(30), || {
        caps(&c) == [450.0, 450.0]
    });
    nv.daemon.take().unwrap().signal_and_wait(Signal::KILL);
    let left = last_limits(&nv);
    assert_eq!(left.values().copied().collect::<Vec<_>>(), [450.0, 450.0]);
    let record = nv.home.paths.state.join(format!("tune/tune-{run}.json"));
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(record).unwrap()).unwrap();
    assert_eq!(r["state"], "running", "{r}");
    (nv, run)
}

#[test]
fn a_daemon_killed_mid_search_resumes_the_job_and_a_stop_restores() {
    let (mut nv, run) = killed_mid_search();
    nv.restart(&[]);
    wait_for("the job to resume", Duration::from_secs(30), || {
        tune_changes(&nv.home).iter().any(|c| c == "resumed")
    });
    let c = nv.home.client();
    // Resumed from the starting caps, with the cap measured before (700 W) not measured again.
    let j = job(&nv.home, &run);
    assert_eq!(j["resumed"], 1, "{j}");
    assert_ne!(j["state"], "failed", "{j}");
    nv.ok(&["tune", "stop", &run]);
    assert_eq!(caps(&c), [700.0, 700.0]);
    assert_eq!(
        last_limits(&nv).values().copied().collect::<Vec<_>>(),
        [700.0, 700.0]
    );
}

#[test]
fn a_daemon_killed_mid_search_restores_the_caps_of_a_run_that_ended_meanwhile() {
    let (mut nv, run) = killed_mid_search();
    // The run ends while no daemon watches.
    let rd = nv.home.run_dir(&run);
    let pid = rd.read_pid().unwrap().expect("the run's pid file").pid;
    let pgid = rustix::process::Pid::from_raw(pid as i32).unwrap();
    let _ = rustix::process::kill_process_group(pgid, Signal::KILL);
    std::thread::sleep(Duration::from_millis(300));
    nv.restart(&[]);
    wait_for("the caps to be restored", Duration::from_secs(30), || {
        tune_changes(&nv.home).iter().any(|c| c == "restored")
    });
    let j = job(&nv.home, &run);
    assert_eq!(j["state"], "cancelled", "{j}");
    assert!(j["why"].as_str().unwrap().contains("not resumed"), "{j}");
    assert_eq!(
        last_limits(&nv).values().copied().collect::<Vec<_>>(),
        [700.0, 700.0]
    );
    assert_eq!(caps(&nv.home.client()), [700.0, 700.0]);
}

/// A batch-size range for the synthetic trainer's profile: it starts at 128, one doubling or
/// halving either way (each batch the search walks to is a cap search of its own: a wider range
/// adds windows to every joint search here, not a claim).
const BATCH_KNOB: &str = "[knobs.batch_size]\ninitial = 128\nmin = 64\nmax = 256\n";

/// `tune energy RUN` with the quick cap settings, searching the batch size too.
pub(crate) fn joint_args(run: &str) -> Vec<&str> {
    let mut args = vec!["tune", "energy", run];
    args.extend(QUICK);
    args.extend(["--with", "batch-size"]);
    args
}

/// The batch size the daemon holds for `run` (what its trainer last took).
pub(crate) fn batch_of(c: &gpupilot::client::Client, run: &str) -> Option<i64> {
    let m = c.run_metrics(run, 0).ok()?;
    m.trainer
        .knobs
        .iter()
        .find(|k| k.knob == gpupilot::protocol::KnobName::BatchSize)?
        .value
}

/// Wait until the search has moved `run` off its starting batch of 128.
fn wait_for_another_batch(c: &gpupilot::client::Client, run: &str) {
    wait_for(
        "the search to try another batch",
        Duration::from_secs(60),
        || batch_of(c, run).is_some_and(|b| b != 128),
    );
}

#[test]
fn a_joint_search_sets_the_best_batch_and_cap_and_suggests_both() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let run = home.start_synthetic_with(BATCH_KNOB);
    let (stdout, stderr) = succeeded(&home, &joint_args(&run), 240);
    assert!(
        stderr.contains("warning: changing the batch size changes training dynamics"),
        "{stderr}"
    );
    assert!(stderr.contains("batch sizes to search: "), "{stderr}");
    let saved = home.run_dir(&run).path().join("tune-energy.json");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
    assert_eq!(r["batch"]["start"], 128, "{r}");
    let best_batch = r["batch"]["best"].as_i64().unwrap();
    let searched = r["batch"]["searched"].as_array().unwrap();
    assert!(searched.len() >= 2, "{r}");
    let curve = r["curve"].as_array().unwrap();
    assert!(curve.iter().all(|p| p["batch"].as_i64().is_some()), "{r}");
    // The default cap measured at the starting batch: the reference of the saving.
    assert_eq!(r["default"]["batch"], 128, "{r}");
    assert_eq!(r["default"]["cap_w"], 700.0, "{r}");
    let best_w = r["best"]["cap_w"].as_f64().unwrap();
    assert_eq!(r["best"]["batch"].as_i64(), Some(best_batch), "{r}");
    // Both are set: the caps through the daemon, the batch through the trainer.
    let c = home.client();
    assert_eq!(caps(&c), [best_w, best_w]);
    wait_for("the best batch", Duration::from_secs(10), || {
        batch_of(&c, &run) == Some(best_batch)
    });
    // The profile's lines: both the cap and the batch.
    assert!(
        stdout.contains(&format!(
            "[power]\ncap_w = {best_w:.0}\n\n[knobs.batch_size]\ninitial = {best_batch}"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains("instead of 700 W and batch 128"),
        "{stdout}"
    );
    // Each batch tried went through the knob change, with the tuner's reason.
    let asked: Vec<serde_json::Value> = home
        .node_events()
        .into_iter()
        .filter(|e| e.to_string().contains("energy tuner: trying a batch size"))
        .collect();
    assert!(!asked.is_empty());
    assert!(tune_changes(&home).iter().any(|c| c == "batch"));
    // `tune status` and the final event say the suggestion too.
    let status = home.ok(&["tune", "status", &run]);
    assert!(status.contains("[knobs.batch_size]"), "{status}");
    assert!(status.contains("per million samples"), "{status}");
    let done = home
        .events_named("tune")
        .into_iter()
        .find(|e| e["change"] == "done")
        .unwrap();
    assert!(
        done["why"].as_str().unwrap().contains("initial = "),
        "{done}"
    );
}

#[test]
fn a_joint_search_is_refused_without_a_batch_range() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let run = home.start_synthetic();
    let stderr = failed(&home, &joint_args(&run), 60);
    assert!(
        stderr.contains("no batch size the tuner can change"),
        "{stderr}"
    );
    assert_eq!(caps(&home.client()), [700.0, 700.0], "nothing was changed");
}

#[test]
fn stopping_a_joint_search_puts_the_caps_and_the_batch_back() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let run = home.start_synthetic_with(BATCH_KNOB);
    home.ok(&["power", "cap", "650"]);
    let mut args = joint_args(&run);
    args.push("--detach");
    home.ok(&args);
    let c = home.client();
    wait_for_another_batch(&c, &run);
    home.ok(&["tune", "stop", &run]);
    assert_eq!(caps(&c), [650.0, 650.0]);
    wait_for("the starting batch", Duration::from_secs(10), || {
        batch_of(&c, &run) == Some(128)
    });
    let j = job(&home, &run);
    assert_eq!(j["state"], "cancelled", "{j}");
    assert_eq!(j["start_batch"], 128, "{j}");
}

#[test]
fn a_client_killed_mid_joint_search_leaves_it_to_the_daemon() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let run = home.start_synthetic_with(BATCH_KNOB);
    let mut child = home
        .gpupilot(&joint_args(&run))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let c = home.client();
    wait_for_another_batch(&c, &run);
    send(child.id(), Signal::KILL);
    child.wait().unwrap();
    wait_every("the job to end", Duration::from_secs(180), JOB_POLL, || {
        job(&home, &run)["state"] != "running"
    });
    let j = job(&home, &run);
    assert_eq!(j["state"], "done", "{j}");
    let r = &j["result"];
    let best_w = r["best"]["cap_w"].as_f64().unwrap();
    assert_eq!(caps(&c), [best_w, best_w]);
    wait_for("the best batch", Duration::from_secs(10), || {
        batch_of(&c, &run) == r["batch"]["best"].as_i64()
    });
}

#[test]
fn a_run_that_ends_mid_joint_search_gets_its_caps_back() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let run = home.start_synthetic_with(BATCH_KNOB);
    let mut args = joint_args(&run);
    args.push("--detach");
    home.ok(&args);
    let c = home.client();
    wait_for_another_batch(&c, &run);
    home.ok(&["stop", &run]);
    wait_every("the job to end", Duration::from_secs(30), JOB_POLL, || {
        job(&home, &run)["state"] != "running"
    });
    let j = job(&home, &run);
    assert_eq!(j["state"], "cancelled", "{j}");
    assert!(j["why"].as_str().unwrap().contains("the run ended"), "{j}");
    assert_eq!(caps(&c), [700.0, 700.0]);
}

#[test]
fn a_joint_search_on_a_job_of_several_ranks_changes_every_rank_at_one_step() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let run = start_job_with(&home, 2, &[0, 1], BATCH_KNOB);
    let (_, stderr) = succeeded(&home, &joint_args(&run), 240);
    let saved = home.run_dir(&run).path().join("tune-energy.json");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
    let best_w = r["best"]["cap_w"].as_f64().unwrap();
    assert_eq!(caps(&home.client()), [best_w, best_w]);
    // Each batch went to both ranks as one change, agreed and applied at one step.
    let staged: Vec<serde_json::Value> = home.events_named("knob_staged");
    assert!(!staged.is_empty(), "{stderr}");
    assert!(staged.iter().all(|e| e["ranks"] == 2), "{staged:?}");
    let applied: Vec<serde_json::Value> = home
        .events_named("knob_applied")
        .into_iter()
        .filter(|e| e["ranks"] == 2)
        .collect();
    assert!(
        applied.len() >= staged.len().saturating_sub(1),
        "{applied:?}"
    );
    let best_batch = r["batch"]["best"].as_i64().unwrap();
    let c = home.client();
    wait_for(
        "every rank at the best batch",
        Duration::from_secs(20),
        || {
            c.run_metrics(&run, 0).is_ok_and(|m| {
                m.trainer.ranks.len() == 2
                    && m.trainer.ranks.iter().all(|rk| {
                        rk.last
                            .as_ref()
                            .is_some_and(|l| l.report.batch_size == Some(best_batch))
                    })
            })
        },
    );
}

/// Kill the daemon with SIGKILL mid joint search on `run`: its record says it was running, from
/// batch `start`.
pub(crate) fn kill_mid_joint_search(nv: &mut NvmlDaemon, run: &str, start: i64) {
    nv.daemon.take().unwrap().signal_and_wait(Signal::KILL);
    let record = nv.home.paths.state.join(format!("tune/tune-{run}.json"));
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(record).unwrap()).unwrap();
    assert_eq!(
        (r["state"].as_str(), r["start_batch"].as_i64()),
        (Some("running"), Some(start)),
        "{r}"
    );
}

#[test]
fn a_daemon_killed_mid_joint_search_puts_the_caps_back_and_says_where_the_batch_is() {
    let mut nv = NvmlDaemon::new(TWO_H100, &[]);
    let run = nv.home.start_synthetic_with(BATCH_KNOB);
    let mut args = joint_args(&run);
    args.push("--detach");
    nv.ok(&args);
    wait_for_another_batch(&nv.home.client(), &run);
    kill_mid_joint_search(&mut nv, &run, 128);
    nv.restart(&[]);
    // The synthetic trainer does not attach to a new daemon: the job waits for one that
    // reconnects (as the Python SDK does) for a minute, then puts the caps back, and the record
    // says why the batch could not go back and how to put it back.
    wait_for("the caps to be restored", Duration::from_secs(120), || {
        tune_changes(&nv.home).iter().any(|c| c == "restored")
    });
    assert_eq!(
        last_limits(&nv).values().copied().collect::<Vec<_>>(),
        [700.0, 700.0]
    );
    let j = job(&nv.home, &run);
    assert_eq!(j["state"], "cancelled", "{j}");
    let e = j["restored"]["Err"].as_str().unwrap_or_default();
    assert!(
        e.contains("no trainer is attached to the run")
            && e.contains("batch size 128 could not be put back")
            && e.contains(&format!(
                "`gpupilot set {run} batch-size 128` once it attaches"
            )),
        "{j}"
    );
}

#[test]
fn a_search_with_no_result_of_its_profile_starts_from_a_kept_power_sweep() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let sweep = home.power_sweep("700:300:100");
    // The cheapest cap at QUICK's eta (1: energy alone), worked out from the curve as kept:
    // energy per unit weighed by eta, time per unit at the H100's 700 W top cap by 1 - eta.
    let cheapest = sweep["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let e = p["energy_per_unit_j"].as_f64().unwrap();
            let t = 1.0 / p["throughput_per_s"].as_f64().unwrap();
            let eta = 1.0;
            (
                eta * e + (1.0 - eta) * 700.0 * t,
                p["cap_w"].as_f64().unwrap(),
            )
        })
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .unwrap()
        .1;
    let run = home.start_synthetic();
    let mut args = vec!["tune", "energy", &run, "--detach"];
    args.extend(QUICK);
    home.ok(&args);
    let what = job(&home, &run)["what"].as_str().unwrap().to_string();
    assert!(
        what.contains(&format!(
            "the search starts around {cheapest:.0} W, the best cap of the simulated power sweep of "
        )),
        "{what}\n{sweep}"
    );
    home.ok(&["tune", "stop", &run]);
}

/// The node's GPUs' energy counters together and when they were read (their mean time), from
/// the daemon's newest snapshot.
fn node_energy(c: &gpupilot::client::Client) -> (f64, f64) {
    let gpus = c.status().unwrap().snapshot.unwrap().gpus;
    let joules = gpus.iter().map(|g| g.energy_j.unwrap()).sum();
    let t = gpus.iter().map(|g| g.time_s).sum::<f64>() / gpus.len() as f64;
    (t, joules)
}

#[test]
fn at_the_default_rate_the_default_cap_and_the_saving_are_the_simulators_own() {
    let home = Home::new();
    // One snapshot a second, as a daemon started without --rate takes them.
    let _daemon = home.daemon(&["--rate", "1"]);
    let run = home.start_synthetic();
    // The node's own power at the default cap, where it has trained since it started: its
    // energy counters over six seconds.
    let c = home.client();
    let (t0, e0) = node_energy(&c);
    let mut end = (t0, e0);
    wait_for("six seconds of snapshots", Duration::from_secs(20), || {
        end = node_energy(&c);
        end.0 >= t0 + 6.0
    });
    let power_w = (end.1 - e0) / (end.0 - t0);
    // Three seconds of warm-up: the synthetic trainer learns the clock a cap gives from the
    // daemon's snapshots, up to two seconds late at this rate.
    let args = [
        "tune",
        "energy",
        &run,
        "--seconds",
        "3",
        "--warmup",
        "3",
        "--step-w",
        "250",
        "--eta",
        "1",
    ];
    succeeded(&home, &args, 180);
    let saved = home.run_dir(&run).path().join("tune-energy.json");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
    let default = &r["default"];
    assert_eq!(default["cap_w"].as_f64(), Some(700.0), "{r}");
    // The default cap's window: the node's power as its own counters give it (a window that
    // starts from an older reading overstates it by up to a third).
    let measured_w = default["avg_power_w"].as_f64().unwrap();
    assert!(
        (measured_w / power_w - 1.0).abs() < 0.02,
        "the default cap measured at {measured_w:.0} W, the node's counters give {power_w:.0} W: {r}"
    );
    // The node's GPUs and the trainer run one model (ResNet-50, batch 256, on an H100), so
    // the measured energy per sample is gpusim's steady state times one factor at every cap
    // (two GPUs' energy, the trainer's samples at four times the simulated speed), up to the
    // node settling after each cap change (its temperature, a few seconds): the saving claimed
    // is gpusim's within a few points.
    let spec = gpusim::find("h100-sxm").unwrap();
    let truth = |cap: f64| {
        gpusim::energy_per_sample_at_cap(spec, "resnet50", 256, cap)
            .unwrap()
            .0
    };
    let best = r["best"]["cap_w"].as_f64().unwrap();
    let saving = 100.0 * (1.0 - truth(best) / truth(700.0));
    let claimed = r["energy_saving_pct"].as_f64().unwrap();
    assert!(
        (claimed - saving).abs() < 4.0,
        "claimed {claimed:.1}% at {best:.0} W, gpusim's curve gives {saving:.1}%: {r}"
    );
    eprintln!(
        "default {measured_w:.0} W against the node's {power_w:.0} W; saving claimed {claimed:.1}% at {best:.0} W, gpusim {saving:.1}%"
    );
}
