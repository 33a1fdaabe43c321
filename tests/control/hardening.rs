//! Control on bad readings, through a real daemon on the fake NVML library: a GPU whose limit
//! reads 0 W is left alone, a limit changed outside gpupilot is recorded and undone by `power
//! reset`, a run's energy survives a kill -9 of the daemon, a CPU-only run is charged no GPU
//! energy, a lost GPU keeps its identity in the daemon's `status` and `/metrics`, and wild
//! readings (an energy counter that jumps or wraps, a limit outside its range) are set aside by
//! the energy meter and the budget, and said once.

use std::time::Duration;

use crate::support::net::{free_port, http_get};
use crate::support::nvml_daemon::NvmlDaemon;
use crate::support::wait::wait_for;
use gpupilot::protocol::{Request, Response};
use serde_json::Value;

/// Two H100 at rest (29 °C or so in a 25 °C room), GPU 0's limit reading 0 mW.
const ZERO_LIMIT: &str = r#"
model = "h100-sxm"
count = 2
[[faults]]
kind = "power_limit_zero"
gpu = 0
"#;

fn governor_events(s: &NvmlDaemon, change: &str) -> Vec<Value> {
    s.home
        .node_events()
        .into_iter()
        .filter(|e| e["event"] == "governor" && e["change"] == change)
        .collect()
}

#[test]
fn a_limit_read_as_zero_is_left_alone_and_the_reason_is_said() {
    let s = NvmlDaemon::new(ZERO_LIMIT, &[]);
    s.ok(&["thermal", "target", "85"]);
    wait_for(
        "the governor to refuse GPU 0",
        Duration::from_secs(20),
        || !governor_events(&s, "refused").is_empty(),
    );
    // Several more decisions: none moves GPU 0's cap.
    std::thread::sleep(Duration::from_secs(2));
    let calls = s.setter_calls();
    assert!(
        calls.iter().all(|c| c["gpu"] != 0),
        "a setter was called on GPU 0: {calls:?}"
    );
    let refused = governor_events(&s, "refused");
    assert_eq!(refused.len(), 1, "said once: {refused:?}");
    assert_eq!(refused[0]["gpu"], 0);
    let why = refused[0]["why"].as_str().unwrap();
    assert!(why.contains("power limit reads 0 W"), "{why}");
    assert!(governor_events(&s, "cap").iter().all(|e| e["gpu"] != 0));
    let thermal = s.ok(&["thermal"]);
    assert!(
        thermal.contains(
            "GPU 0: governor 85 °C: cap ? (not acting: the GPU's power limits are implausible)"
        ) || thermal.contains("not acting: the GPU's power limits are implausible"),
        "{thermal}"
    );
    assert!(thermal.contains("power limit reads 0 W"), "{thermal}");

    // Off: nothing was changed, so nothing is put back and nothing recorded.
    s.ok(&["thermal", "off"]);
    std::thread::sleep(Duration::from_millis(500));
    assert!(s.setter_calls().iter().all(|c| c["gpu"] != 0));
    assert!(governor_events(&s, "restored").is_empty());
    let reset = s.ok(&["power", "reset"]);
    assert!(reset.contains("nothing recorded"), "{reset}");
}

/// Two H100; GPU 1 falls off the bus 6 simulated seconds in.
const LOSES_GPU_1: &str = r#"
model = "h100-sxm"
count = 2
[[faults]]
kind = "gpu_lost"
gpu = 1
at_s = 6.0
"#;

/// The daemon's newest snapshot (its `status` request), GPU by GPU.
fn status_gpus(s: &NvmlDaemon) -> Vec<Value> {
    let r = s.home.client().request(Request::Status {}).unwrap();
    let Response::Status(st) = r else {
        panic!("{r:?}")
    };
    let v = serde_json::to_value(st.snapshot.expect("a snapshot")).unwrap();
    v["gpus"].as_array().unwrap().clone()
}

#[test]
fn a_lost_gpu_keeps_its_identity_in_status_and_metrics() {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let s = NvmlDaemon::new(LOSES_GPU_1, &["--metrics-addr", &addr]);
    let before = status_gpus(&s);
    assert_eq!(before[1]["lost"], false, "lost too early: {before:?}");
    let uuid = before[1]["uuid"].as_str().unwrap().to_string();
    let pci = before[1]["pci_bus_id"].as_str().unwrap().to_string();
    assert!(uuid.starts_with("GPU-"), "{uuid}");
    wait_for("GPU 1 to be lost", Duration::from_secs(30), || {
        status_gpus(&s)[1]["lost"] == true
    });
    let after = status_gpus(&s);
    assert_eq!(after[1]["uuid"], uuid.as_str(), "{:?}", after[1]);
    assert_eq!(after[1]["pci_bus_id"], pci.as_str());
    assert_eq!(after[1]["name"], before[1]["name"]);
    // /metrics: the lost series is labelled with the same UUID, none with an empty one.
    let body = http_get(port, "/metrics").1;
    let lost: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("gpupilot_gpu_lost{"))
        .collect();
    assert_eq!(lost.len(), 2, "{body}");
    let gpu1 = lost.iter().find(|l| l.contains("gpu=\"1\"")).unwrap();
    assert!(gpu1.contains(&format!("UUID=\"{uuid}\"")), "{gpu1}");
    assert!(gpu1.ends_with(" 1"), "{gpu1}");
    assert!(!body.contains("UUID=\"\""), "{body}");

    // A cap for every GPU names the lost one, changes nothing, and says how to cap the others.
    let err = s.fails(&["power", "cap", "300"]);
    assert!(
        err.contains("GPU 1") && err.contains("nothing changed") && err.contains("--gpu 0"),
        "{err}"
    );
    assert!(s.setter_calls().is_empty(), "{:?}", s.setter_calls());
    s.ok(&["power", "cap", "300", "--gpu", "0"]);
    assert_eq!(s.setter_calls().len(), 1, "{:?}", s.setter_calls());
}

/// Two H100 training at full power.
const TRAINING: &str = r#"
model = "h100-sxm"
count = 2
[training]
model = "resnet50"
"#;

/// The energy counters of GPUs `gpus` now, joules (`status --json` reads the node itself).
fn counters_j(s: &NvmlDaemon, gpus: &[usize]) -> f64 {
    let v: Value = serde_json::from_str(&s.ok(&["status", "--json"])).unwrap();
    gpus.iter()
        .map(|&g| v["gpus"][g]["energy_j"].as_f64().unwrap())
        .sum()
}

/// `ps --json`: run `id`'s energy, joules.
fn run_energy_j(s: &NvmlDaemon, id: &str) -> Option<f64> {
    let v: Value = serde_json::from_str(&s.ok(&["ps", "--json"])).unwrap();
    v.as_array().unwrap().iter().find(|r| r["id"] == id)?["energy"]["energy_j"].as_f64()
}

/// Start a detached run of `command` from a profile with `[run] gpus` as given; its id.
fn start(s: &NvmlDaemon, command: &str, gpus: Option<&str>) -> String {
    let path = s.home.dir.path().join("run.toml");
    let gpus = gpus.map_or(String::new(), |g| format!("gpus = {g}\n"));
    std::fs::write(
        &path,
        format!("name = \"r\"\n[run]\ncommand = [\"sh\", \"-c\", \"{command}\"]\n{gpus}"),
    )
    .unwrap();
    s.ok(&["run", "--detach", &path.display().to_string()])
        .trim()
        .to_string()
}

#[test]
fn a_runs_energy_survives_kill_9_of_the_daemon() {
    let mut s = NvmlDaemon::new(TRAINING, &[]);
    let before = counters_j(&s, &[0, 1]);
    let id = start(&s, "sleep 60", Some("[0, 1]"));
    std::thread::sleep(Duration::from_secs(4));
    assert!(run_energy_j(&s, &id).is_some_and(|e| e > 1000.0));
    // kill -9, and 8 s with no daemon while the run trains on.
    let mut child = s.daemon.take().unwrap().child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    std::thread::sleep(Duration::from_secs(8));
    s.restart(&[]);
    std::thread::sleep(Duration::from_secs(3));
    let e = run_energy_j(&s, &id).expect("the run's energy");
    let truth = counters_j(&s, &[0, 1]) - before;
    // The run started after `before` and was read before the last counters: a little below
    // the truth, never above, and not short by the 8 s of downtime (about 40% of it).
    assert!(
        e <= truth && e >= 0.93 * truth,
        "{e:.0} J for a run whose GPUs used at most {truth:.0} J"
    );
}

#[test]
fn a_cpu_only_run_is_charged_no_gpu_energy() {
    // The node's GPUs train (their processes are not the run's): the run itself uses none.
    let s = NvmlDaemon::new(TRAINING, &[]);
    let id = start(&s, "sleep 30", None);
    std::thread::sleep(Duration::from_secs(4));
    // Charged no GPU: no energy figure at all (absent, not 0 J, and never -0).
    let e = run_energy_j(&s, &id);
    assert_eq!(e, None, "a CPU-only run was charged {e:?} J");
    // The same with its GPUs declared: they are charged (no other run claims them).
    let id = start(&s, "sleep 30", Some("[1]"));
    std::thread::sleep(Duration::from_secs(4));
    let e = run_energy_j(&s, &id).unwrap_or(0.0);
    assert!(e > 500.0, "a run on GPU 1 was charged {e:.0} J");
}

/// Two H100 at rest, nothing else.
const TWO_H100: &str = r#"
model = "h100-sxm"
count = 2
"#;

fn outside_events(s: &NvmlDaemon) -> Vec<Value> {
    s.home
        .node_events()
        .into_iter()
        .filter(|e| e["event"] == "power_changed_outside")
        .collect()
}

/// GPU `gpu`'s power limit in the daemon's newest snapshot, watts.
fn limit_w(s: &NvmlDaemon, gpu: usize) -> f64 {
    status_gpus(s)[gpu]["power_limit_w"].as_f64().unwrap()
}

#[test]
fn a_limit_changed_outside_gpupilot_is_an_event_once_and_reset_restores_it() {
    let s = NvmlDaemon::new(TWO_H100, &[]);
    let before = limit_w(&s, 0);
    assert!(before > 500.0, "{before}");
    // Another program on the same node: here a second gpupilot daemon of another home, which
    // this daemon knows nothing of (as it knows nothing of pynvml or nvidia-smi).
    let mut other = NvmlDaemon::unstarted(TWO_H100);
    other.node.scenario = s.node.scenario.clone();
    other.node.state = s.node.state.clone();
    other.node.log = s.node.log.clone();
    other.restart(&[]);
    other.ok(&["power", "cap", "400", "--gpu", "0"]);
    drop(other);

    wait_for(
        "the outside change to be recorded",
        Duration::from_secs(20),
        || !outside_events(&s).is_empty(),
    );
    // More snapshots at the new limit: the change is recorded once.
    std::thread::sleep(Duration::from_secs(2));
    let ev = outside_events(&s);
    assert_eq!(ev.len(), 1, "one event per change: {ev:?}");
    assert_eq!(ev[0]["gpu"], 0);
    assert!(
        (ev[0]["old_w"].as_f64().unwrap() - before).abs() < 1.0,
        "{ev:?}"
    );
    assert!(
        (ev[0]["new_w"].as_f64().unwrap() - 400.0).abs() < 1.0,
        "{ev:?}"
    );
    assert!(
        ev[0]["uuid"].as_str().unwrap().starts_with("GPU-"),
        "{ev:?}"
    );
    assert!(
        (limit_w(&s, 1) - before).abs() < 1.0,
        "GPU 1 was not touched"
    );
    // The limit before it is the original `power reset` restores.
    let rec = s.originals().expect("an original recorded");
    assert_eq!(rec["gpus"]["0"]["power_limit_w"].as_f64(), Some(before));
    let reset = s.ok(&["power", "reset"]);
    assert!(reset.contains("GPU 0"), "{reset}");
    wait_for(
        "GPU 0 back at its original",
        Duration::from_secs(10),
        || (limit_w(&s, 0) - before).abs() < 1.0,
    );
    assert!(s.originals().is_none(), "{:?}", s.originals());
    // gpupilot's own restore is not an outside change.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(outside_events(&s).len(), 1, "{:?}", outside_events(&s));
}

/// Two H100 training; 8 simulated seconds in, GPU 0's energy counter jumps by 1e15 mJ and GPU
/// 1's goes back by 1e18 mJ, further than it has counted: it wraps round 2^64.
const WILD_COUNTERS: &str = r#"
model = "h100-sxm"
count = 2
[training]
model = "resnet50"
[[faults]]
kind = "wild_readings"
gpu = 0
at_s = 8.0
energy_offset_mj = 1000000000000000
[[faults]]
kind = "wild_readings"
gpu = 1
at_s = 8.0
energy_offset_mj = -1000000000000000000
"#;

#[test]
fn wild_energy_counters_are_not_a_runs_energy_and_are_said_once_per_gpu() {
    let s = NvmlDaemon::new(WILD_COUNTERS, &[]);
    let started = std::time::Instant::now();
    let id = start(&s, "sleep 60", Some("[0, 1]"));
    let implausible = || governor_events(&s, "implausible");
    wait_for(
        "the meter to set both counters aside",
        Duration::from_secs(30),
        || implausible().len() >= 2,
    );
    // Several more samples after the jump: said once per GPU, not at every sample.
    std::thread::sleep(Duration::from_secs(3));
    let said = implausible();
    assert_eq!(said.len(), 2, "{said:?}");
    let by_gpu = |g: u64| -> String {
        let e = said
            .iter()
            .find(|e| e["gpu"] == g)
            .expect("said for each GPU");
        assert_eq!(e["by"], "energy meter", "{e}");
        e["why"].as_str().unwrap().to_string()
    };
    let why = by_gpu(0);
    assert!(why.contains("jumped by 1.000e12 J"), "{why}");
    let why = by_gpu(1);
    // 2^64 mJ less 1e15 J and what it had counted: a jump of about 1.745e16 J.
    assert!(why.contains("jumped by 1.74"), "{why}");
    // No more than two H100s at their 700 W maximum could have drawn since the run started.
    let e = run_energy_j(&s, &id).expect("the run's energy");
    let most = 2.0 * 700.0 * started.elapsed().as_secs_f64();
    assert!(e > 0.0 && e < most, "{e:.3e} J in at most {most:.0} J");
}

/// Two H100 training, GPU 0's limit reading 4294967295 mW: 4,294,967 W, outside its 200–700 W.
const WILD_LIMIT: &str = r#"
model = "h100-sxm"
count = 2
[training]
model = "resnet50"
[[faults]]
kind = "wild_readings"
gpu = 0
power_limit_mw = 4294967295
"#;

#[test]
fn a_limit_outside_its_range_is_absent_to_the_budget() {
    let s = NvmlDaemon::new(WILD_LIMIT, &[]);
    s.ok(&["budget", "1000"]);
    wait_for("the budget to cap GPU 1", Duration::from_secs(30), || {
        s.setter_calls().iter().any(|c| c["gpu"] == 1)
    });
    std::thread::sleep(Duration::from_secs(2));
    let calls = s.setter_calls();
    assert!(
        calls.iter().all(|c| c["gpu"] != 0),
        "GPU 0 was set: {calls:?}"
    );
    // GPU 0 counts at its maximum, 700 W: GPU 1 gets the other 300 W, not its 200 W minimum.
    let last = calls.iter().rev().find(|c| c["gpu"] == 1).unwrap();
    assert_eq!(last["value"], 300_000, "{calls:?}");
    let v: Value = serde_json::from_str(&s.ok(&["thermal", "--json"])).unwrap();
    let b = &v["budget"];
    assert_eq!(b["infeasible"], Value::Null, "{b}");
    assert_eq!(
        b["caps"],
        serde_json::json!([[0, 700.0], [1, 300.0]]),
        "{b}"
    );
    assert_eq!(b["total_w"], 1000.0, "{b}");
    let budget_events = s.home.events_named("budget");
    assert!(
        budget_events
            .iter()
            .all(|e| !e["why"].as_str().unwrap().contains("raise node_budget_w")),
        "{budget_events:?}"
    );
    let refused = governor_events(&s, "refused");
    assert_eq!(refused.len(), 1, "said once: {refused:?}");
    assert_eq!(
        (&refused[0]["gpu"], &refused[0]["by"]),
        (&0.into(), &"power budget".into())
    );
    let why = refused[0]["why"].as_str().unwrap();
    assert!(
        why.contains("4294967 W, outside its range 200–700 W"),
        "{why}"
    );
}
