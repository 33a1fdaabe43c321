//! A run's `[power] cap_w` through a real daemon on the fake NVML library: the exact
//! milliwatts NVML receives for exactly the run's GPUs, the originals put back when the run
//! ends (or not, with `restore_on_exit = false`), a cap changed since left alone, and an
//! out-of-range cap refusing the run before anything starts. Then, in process on the
//! simulator: the run's cap is the user's cap for the thermal governor.

use std::path::PathBuf;
use std::time::Duration;

use crate::support::nvml_daemon::NvmlDaemon;
use crate::support::wait::wait_for;
use serde_json::Value;

const FOUR_H100: &str = r#"
model = "h100-sxm"
count = 4
"#;

impl NvmlDaemon {
    /// A profile file in the home: `power` is the body of its `[power]` table.
    fn profile(&self, gpus: &str, command: &str, power: &str) -> PathBuf {
        let path = self.home.dir.path().join("p.toml");
        std::fs::write(
            &path,
            format!(
                "name = \"capped\"\n[run]\ncommand = [\"sh\", \"-c\", \"{command}\"]\n{gpus}\n\
                 [power]\n{power}\n"
            ),
        )
        .unwrap();
        path
    }

    /// Start the profile detached; its id.
    fn start(&self, profile: &std::path::Path) -> String {
        self.ok(&["run", "--detach", profile.to_str().unwrap()])
            .trim()
            .to_string()
    }

    /// (gpu, milliwatts) of every power-limit call NVML received.
    fn power_calls(&self) -> Vec<(u64, u64)> {
        std::fs::read_to_string(&self.node.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|c| c["function"] == "nvmlDeviceSetPowerManagementLimit")
            .map(|c| {
                assert_eq!(c["result"], 0, "{c}");
                (c["gpu"].as_u64().unwrap(), c["value"].as_u64().unwrap())
            })
            .collect()
    }

    /// The run's `changed` events about power limits.
    fn power_events(&self, id: &str) -> Vec<Value> {
        self.home
            .run_dir(id)
            .read_events(0, usize::MAX)
            .unwrap()
            .into_iter()
            .map(|e| serde_json::to_value(e).unwrap())
            .filter(|e| e["event"] == "changed" && e["what"].as_str().unwrap().contains("power"))
            .collect()
    }

    fn wait_power_events(&self, id: &str, n: usize) -> Vec<Value> {
        wait_for("the run's power events", Duration::from_secs(20), || {
            self.power_events(id).len() >= n
        });
        self.power_events(id)
    }
}

#[test]
fn cap_w_caps_exactly_the_runs_gpus_and_the_end_restores_them() {
    let s = NvmlDaemon::new(FOUR_H100, &[]);
    let p = s.profile("gpus = [1, 3]", "sleep 30", "cap_w = 300");
    let id = s.start(&p);

    // Set before the run was answered: GPUs 1 and 3 only, 300 000 mW each.
    assert_eq!(s.power_calls(), [(1, 300_000), (3, 300_000)]);
    let o = s.originals().expect("originals recorded");
    assert_eq!(o["gpus"]["1"]["power_limit_w"], 700.0);
    assert_eq!(o["gpus"]["3"]["power_limit_w"], 700.0);
    assert!(o["gpus"].get("0").is_none());

    let why = format!("profile [power] cap_w of run {id}");
    let changed: Vec<Value> = s
        .home
        .node_events()
        .into_iter()
        .filter(|e| e["event"] == "gpu_changed")
        .collect();
    assert_eq!(changed.len(), 2, "{changed:?}");
    for (e, gpu) in changed.iter().zip([1, 3]) {
        assert_eq!(e["gpu"], gpu);
        assert_eq!(e["what"], "power_limit");
        assert_eq!(
            (e["old"].as_str(), e["new"].as_str()),
            (Some("700 W"), Some("300 W"))
        );
        assert_eq!(e["by"], "daemon");
        assert_eq!(e["why"], why.as_str());
    }
    let ev = s.power_events(&id);
    assert_eq!(ev.len(), 2, "{ev:?}");
    assert_eq!(ev[0]["what"], "GPU 1 power_limit");
    assert_eq!(ev[0]["by"], "daemon");
    assert_eq!(ev[0]["why"], why.as_str());
    assert_eq!(ev[1]["what"], "GPU 3 power_limit");

    // The run ends for good: both originals come back, and the record is cleared.
    s.ok(&["stop", &id, "--kill"]);
    let ev = s.wait_power_events(&id, 4);
    assert_eq!(
        s.power_calls(),
        [(1, 300_000), (3, 300_000), (1, 700_000), (3, 700_000)]
    );
    assert_eq!(ev[2]["old"], "300 W");
    assert_eq!(ev[2]["new"], "700 W");
    assert!(
        ev[2]["why"]
            .as_str()
            .unwrap()
            .contains("original limit is back")
    );
    assert!(s.originals().is_none(), "{:?}", s.originals());
    let restored = s
        .home
        .node_events()
        .into_iter()
        .filter(|e| e["event"] == "gpu_changed" && e["new"] == "700 W")
        .count();
    assert_eq!(restored, 2);
}

#[test]
fn restore_on_exit_false_leaves_the_cap_on_every_gpu() {
    let s = NvmlDaemon::new(FOUR_H100, &[]);
    let p = s.profile(
        "gpus = \"all\"",
        "exit 0",
        "cap_w = 450\nrestore_on_exit = false",
    );
    let id = s.start(&p);
    let ev = s.wait_power_events(&id, 5);
    assert!(
        ev[4]["why"]
            .as_str()
            .unwrap()
            .contains("restore_on_exit = false"),
        "{ev:?}"
    );
    // All four GPUs capped, none put back; the originals stay for `power reset`.
    assert_eq!(
        s.power_calls(),
        [(0, 450_000), (1, 450_000), (2, 450_000), (3, 450_000)]
    );
    assert_eq!(s.originals().unwrap()["gpus"]["2"]["power_limit_w"], 700.0);
    s.ok(&["power", "reset"]);
    assert_eq!(s.power_calls().len(), 8);
}

#[test]
fn a_cap_changed_since_is_left_alone_and_said() {
    let s = NvmlDaemon::new(FOUR_H100, &[]);
    let p = s.profile("gpus = [2]", "sleep 30", "cap_w = 300");
    let id = s.start(&p);
    s.ok(&["power", "cap", "250", "--gpu", "2"]);
    s.ok(&["stop", &id, "--kill"]);
    let ev = s.wait_power_events(&id, 2);
    let why = ev[1]["why"].as_str().unwrap();
    assert!(why.contains("changed since"), "{why}");
    assert!(why.contains("250 W"), "{why}");
    assert_eq!(s.power_calls(), [(2, 300_000), (2, 250_000)]);
    // The first original is still recorded.
    assert_eq!(s.originals().unwrap()["gpus"]["2"]["power_limit_w"], 700.0);
}

#[test]
fn a_restart_caps_again_and_the_final_end_restores() {
    let s = NvmlDaemon::new(FOUR_H100, &[]);
    let p = s.profile(
        "gpus = [0]\n[run.restart]\npolicy = \"on-failure\"\nmax_restarts = 1\nbackoff_s = 0.2",
        "sleep 2; exit 1",
        "cap_w = 300",
    );
    let id = s.start(&p);
    // Changed by hand while the first attempt runs: the restart sets the run's cap again.
    s.ok(&["power", "cap", "250", "--gpu", "0"]);
    let ev = s.wait_power_events(&id, 3);
    assert!(
        ev[1]["why"]
            .as_str()
            .unwrap()
            .contains("(restart, attempt 1)"),
        "{ev:?}"
    );
    assert_eq!(
        (ev[1]["old"].as_str(), ev[1]["new"].as_str()),
        (Some("250 W"), Some("300 W"))
    );
    // The second attempt fails too and the run ends for good: the original is back.
    assert!(
        ev[2]["why"]
            .as_str()
            .unwrap()
            .contains("original limit is back"),
        "{ev:?}"
    );
    assert_eq!(
        s.power_calls(),
        [(0, 300_000), (0, 250_000), (0, 300_000), (0, 700_000)]
    );
    assert!(s.originals().is_none());
}

#[test]
fn an_out_of_range_cap_w_refuses_the_run_and_changes_nothing() {
    let s = NvmlDaemon::new(FOUR_H100, &[]);
    let p = s.profile("gpus = [0, 1]", "sleep 30", "cap_w = 150");
    let out = s.run(&["run", "--detach", p.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("150 W is outside GPU 0's range 200–700 W"),
        "{err}"
    );
    assert!(err.contains("the run was not started"), "{err}");
    assert!(s.power_calls().is_empty());
    assert!(s.originals().is_none());
    let ps: Value = serde_json::from_str(&s.ok(&["ps", "--json"])).unwrap();
    assert_eq!(ps.as_array().unwrap().len(), 0, "{ps}");

    // A GPU the node lacks is refused the same way.
    let p = s.profile("gpus = [7]", "sleep 30", "cap_w = 300");
    let out = s.run(&["run", "--detach", p.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("`7`, which is no GPU of this node"), "{err}");
    assert!(s.power_calls().is_empty());
}

#[test]
fn a_readonly_daemon_starts_no_run_so_caps_nothing() {
    let s = NvmlDaemon::new(FOUR_H100, &["--readonly"]);
    let p = s.profile("gpus = [0]", "sleep 30", "cap_w = 300");
    let out = s.run(&["run", "--detach", p.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("read-only"));
    assert!(s.power_calls().is_empty());
}

mod in_process {
    use super::*;
    use crate::support::sim_daemon::{caps, daemon, me, sim, tick};
    use crate::support::wait::poll;
    use gpupilot::profile::Profile;
    use gpupilot::protocol::{Request, Response, TargetGpus};
    use gpupilot::supervisor::Caller;

    /// A governor already holds GPU 0 when a run with `cap_w` starts: the run's cap becomes
    /// its ceiling at once, and the user's cap the governor reports; the run's end puts the
    /// original back as the ceiling.
    #[test]
    fn the_runs_cap_is_the_governors_user_cap() {
        let tmp = tempfile::tempdir().unwrap();
        let src = sim();
        let d = daemon(tmp.path(), false, &src);
        tick(&d, &src);
        // A hot target the governor will not need: it holds the user's cap (700 W).
        let r = d.answer(
            &me(),
            Request::ThermalSet {
                gpus: TargetGpus::Some(vec![0]),
                target_c: Some(110.0),
                margin_c: None,
                why: None,
            },
        );
        assert!(matches!(r, Response::Control(_)), "{r:?}");
        for _ in 0..5 {
            tick(&d, &src);
        }
        assert_eq!(caps(&src), [700.0, 700.0]);

        let mut profile = Profile::from_command(vec!["sleep".into(), "30".into()]);
        profile.power.cap_w = Some(400.0);
        profile.run.gpus = gpupilot::profile::GpuSelection::List(vec![0]);
        let mut caller = Caller::current().unwrap();
        caller.cwd = std::env::temp_dir();
        let r = d.answer(
            &me(),
            Request::RunStart {
                profile: Box::new(profile),
                caller,
                knobs: Default::default(),
                why: None,
            },
        );
        let Response::RunStarted { run } = r else {
            panic!("{r:?}")
        };
        assert_eq!(caps(&src), [400.0, 700.0], "lowered at once");
        for _ in 0..20 {
            tick(&d, &src);
            assert!(caps(&src)[0] <= 400.0, "{:?}", caps(&src));
        }
        let Response::Control(c) = d.answer(&me(), Request::Thermal {}) else {
            panic!()
        };
        assert_eq!(c.governors[0].user_cap_w, Some(400.0));

        d.answer(
            &me(),
            Request::RunStop {
                run: run.id.clone(),
                kill: true,
                grace_s: None,
                why: None,
            },
        );
        poll(
            "the original to come back",
            Duration::from_secs(10),
            Duration::from_millis(20),
            || {
                d.poll_runs();
                tick(&d, &src);
                let Response::Control(c) = d.answer(&me(), Request::Thermal {}) else {
                    panic!()
                };
                if c.governors[0].user_cap_w == Some(700.0) {
                    Ok(())
                } else {
                    Err(String::new())
                }
            },
        );
        // The governor, no longer held at 400 W, may raise the cap to the original again.
        for _ in 0..30 {
            tick(&d, &src);
        }
        assert!(caps(&src)[0] > 400.0, "{:?}", caps(&src));
    }
}
