//! `gpupilot tune energy RUN --knob clocks|both`: the search of locked SM clocks on a live run,
//! end to end, on the simulator and on the fake NVML library (whose GPUs are gpusim's: a
//! locked clock lowers their power and slows the synthetic trainer's steps).

use std::time::Duration;

use gpupilot::advisor::Thresholds;
use gpupilot::client::Client;
use gpupilot::client::advise::gather;
use gpupilot::control::owner::CapOwner;
use gpupilot::protocol::{Request, Response};

use crate::support::home::{Home, power_caps as caps};
use crate::support::nvml_daemon::NvmlDaemon;
use crate::support::proc::send;
use crate::support::wait::wait_for;
use crate::tune_energy::{TWO_H100, succeeded};
use rustix::process::Signal;

/// 1 s warm-up and 2 s measured per setting, 300 MHz between clocks (H100: 1980, 1680, 1380,
/// 1080 MHz), 250 W between caps, energy only.
const QUICK: [&str; 10] = [
    "--seconds",
    "2",
    "--warmup",
    "1",
    "--step-mhz",
    "300",
    "--step-w",
    "250",
    "--eta",
    "1",
];

/// Each GPU's SM clock lock as the daemon reports it (`None`: unlocked).
fn locks(c: &Client) -> Vec<Option<[u32; 2]>> {
    let Response::Power { gpus, .. } = c.request(Request::Power {}).unwrap() else {
        panic!("power answered otherwise")
    };
    gpus.iter().map(|g| g.locked_clocks_mhz).collect()
}

fn result(home: &Home, run: &str) -> serde_json::Value {
    let saved = home.run_dir(run).path().join("tune-energy.json");
    serde_json::from_str(&std::fs::read_to_string(saved).unwrap()).unwrap()
}

#[test]
fn a_clock_search_on_a_live_run_locks_the_best_clock_and_says_so_in_mhz() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let run = home.start_synthetic();
    let mut args = vec!["tune", "energy", &run, "--knob", "clocks"];
    args.extend(QUICK);
    let (stdout, stderr) = succeeded(&home, &args, 180);
    assert!(stderr.contains("the locked SM clocks of"), "{stderr}");
    assert!(stderr.contains("1980 MHz measuring"), "{stderr}");
    assert!(stdout.contains("  MHz   J/sample"), "{stdout}");
    assert!(stdout.contains("← best"), "{stdout}");
    let r = result(&home, &run);
    assert_eq!(r["knob"], "clocks", "{r}");
    let best = r["best"]["cap_w"].as_f64().unwrap();
    // gpusim's H100 spends less energy per sample below its top clock.
    assert!(best < 1980.0, "{r}");
    assert!(r["energy_saving_pct"].as_f64().unwrap() > 0.0, "{r}");
    // The best clock is locked on both GPUs (from their lowest clock); caps were not touched.
    let c = home.client();
    for l in locks(&c) {
        assert_eq!(l.map(|l| l[1]), Some(best as u32), "{r}");
    }
    assert_eq!(caps(&c), [700.0, 700.0]);
    assert!(
        stdout.contains(&format!("gpupilot clocks lock MIN {best:.0}")),
        "{stdout}"
    );
    // One voice: the lock is the tuner's choice for those GPUs, and the advisor's input says
    // so (it proposes no cap under it).
    let input = gather(&c, &Thresholds::default()).unwrap();
    for gpu in [0, 1] {
        let owner = input.owners.iter().find(|o| o.gpu == gpu).unwrap();
        let Some(CapOwner::TunedClocks(lock)) = &owner.owner else {
            panic!("GPU {gpu}: {:#?}", input.owners)
        };
        assert_eq!(
            (lock.run.as_str(), lock.max_mhz, &lock.gpus[..]),
            (run.as_str(), best as u32, &[0, 1][..])
        );
    }
    // The node's events say the search's steps in MHz, as the console and `events` show them.
    let (events, _) = succeeded(&home, &["events"], 30);
    assert!(
        events.contains("measured SM clocks up to 1980 MHz"),
        "{events}"
    );
    assert!(
        events.contains(&format!("best SM clock lock up to {best:.0} MHz set")),
        "{events}"
    );
    assert!(!events.contains("1980 W"), "{events}");
}

#[test]
fn an_interrupted_clock_search_unlocks_the_clocks_again() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let run = home.start_synthetic();
    let mut args = vec!["tune", "energy", &run, "--knob", "clocks"];
    args.extend(QUICK);
    let child = home
        .gpupilot(&args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let c = home.client();
    wait_for("a locked clock", Duration::from_secs(40), || {
        locks(&c).iter().all(Option::is_some)
    });
    send(child.id(), Signal::INT);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("tuning stopped (interrupted)"), "{stderr}");
    assert_eq!(locks(&c), [None, None]);
}

#[test]
fn both_knobs_on_the_fake_nvml_keep_the_better_and_leave_the_other_as_it_was() {
    // Training GPUs: their power follows the cap and the clock.
    let nv = NvmlDaemon::new(
        &format!("{TWO_H100}[training]\nmodel = \"resnet50\"\n"),
        &[],
    );
    let run = nv.home.start_synthetic();
    let mut args = vec!["tune", "energy", run.as_str(), "--knob", "both"];
    args.extend(QUICK);
    let stdout = nv.ok(&args);
    let r = result(&nv.home, &run);
    let (knob, other) = (r["knob"].as_str().unwrap_or("cap"), &r["other"]);
    let other_knob = other["knob"].as_str().unwrap_or("cap");
    assert_ne!(knob, other_knob, "{r}");
    assert!(stdout.contains("kept over the"), "{stdout}");
    assert!(
        r["cost_saving_pct"].as_f64().unwrap() >= other["cost_saving_pct"].as_f64().unwrap(),
        "{r}"
    );
    // NVML saw both knobs move: caps first, then clock locks.
    let calls = nv.setter_calls();
    let first = |f: &str| calls.iter().position(|c| c["function"] == f);
    let (cap, lock) = (
        first("nvmlDeviceSetPowerManagementLimit").unwrap(),
        first("nvmlDeviceSetGpuLockedClocks").unwrap(),
    );
    assert!(cap < lock, "{calls:?}");
    // The winner is set; the other is where it started.
    let c = nv.home.client();
    let best = r["best"]["cap_w"].as_f64().unwrap();
    if knob == "clocks" {
        assert_eq!(caps(&c), [700.0, 700.0]);
        // The highest clock is no lock at all.
        let want = (best < 1980.0).then_some(best as u32);
        assert!(locks(&c).iter().all(|l| l.map(|l| l[1]) == want), "{r}");
    } else {
        assert_eq!(caps(&c), [best, best]);
        assert_eq!(locks(&c), [None, None], "{r}");
    }
}

#[test]
fn bad_clock_settings_are_refused_before_anything_changes() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let run = home.start_synthetic();
    for (args, says) in [
        (vec!["--knob", "fan"], "the knob is cap, clocks or both"),
        (vec!["--knob", "clocks", "--step-mhz", "5"], "step in MHz"),
        (
            vec!["--knob", "clocks", "--with", "batch-size"],
            "with the power cap only",
        ),
    ] {
        let mut all = vec!["tune", "energy", run.as_str()];
        all.extend(args);
        let out = home.run(&all, Duration::from_secs(30));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(stderr.contains(says), "{stderr}");
    }
    assert_eq!(locks(&home.client()), [None, None]);
}

/// A daemon killed with SIGKILL mid clock search leaves a probe's lock on the fake GPUs (they
/// outlive it); the next daemon does not resume a clock search: it unlocks them and says why.
#[test]
fn a_daemon_killed_mid_clock_search_puts_the_locks_back_and_does_not_resume() {
    let mut nv = NvmlDaemon::new(TWO_H100, &[]);
    let run = nv.home.start_synthetic();
    let mut args = vec![
        "tune",
        "energy",
        run.as_str(),
        "--knob",
        "clocks",
        "--detach",
    ];
    args.extend(QUICK);
    nv.ok(&args);
    let c = nv.home.client();
    wait_for("a locked clock", Duration::from_secs(40), || {
        locks(&c).iter().all(Option::is_some)
    });
    nv.daemon.take().unwrap().signal_and_wait(Signal::KILL);
    // What NVML was last asked for each GPU's clocks: a lock, left in place.
    let last_clock_call = |nv: &NvmlDaemon| -> Vec<String> {
        let calls = nv.setter_calls();
        (0..2u64)
            .map(|g| {
                calls
                    .iter()
                    .rev()
                    .find(|c| {
                        c["gpu"].as_u64() == Some(g)
                            && c["result"] == 0
                            && c["function"]
                                .as_str()
                                .is_some_and(|f| f.ends_with("GpuLockedClocks"))
                    })
                    .map_or(String::new(), |c| c["function"].as_str().unwrap().into())
            })
            .collect()
    };
    assert!(
        last_clock_call(&nv)
            .iter()
            .all(|f| f == "nvmlDeviceSetGpuLockedClocks")
    );
    nv.restart(&[]);
    let record = nv.home.paths.state.join(format!("tune/tune-{run}.json"));
    wait_for("the job to end unresumed", Duration::from_secs(60), || {
        std::fs::read_to_string(&record)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .is_some_and(|r| r["state"] == "cancelled")
    });
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&record).unwrap()).unwrap();
    assert!(
        r["why"].as_str().is_some_and(|w| w.contains("starts over")),
        "{r}"
    );
    assert_eq!(r["restored"], serde_json::json!({"Ok": null}), "{r}");
    assert!(
        last_clock_call(&nv)
            .iter()
            .all(|f| f == "nvmlDeviceResetGpuLockedClocks"),
        "{:?}",
        last_clock_call(&nv)
    );
}
