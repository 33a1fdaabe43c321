//! `gpupilot tune energy` on a live run: a real daemon on the simulator, the synthetic trainer
//! reporting over the trainer channel (its steps slow down as the cap lowers the clock), and the
//! command as a user types it.

mod daemon_common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use daemon_common::{Home, power_caps as caps, send, wait_for};
use rustix::process::Signal;

/// 700, 450, 200 W, 1 s warm-up and 2 s measured each: about ten seconds.
const QUICK: [&str; 8] = [
    "--seconds",
    "2",
    "--warmup",
    "1",
    "--step-w",
    "250",
    "--eta",
    "1",
];

#[test]
fn a_search_on_a_live_run_sets_the_best_cap_and_saves_it() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let run = home.start_synthetic();
    let mut args = vec!["tune", "energy", &run];
    args.extend(QUICK);
    let out = home.run(&args, Duration::from_secs(120));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
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
    let mut child = home
        .gpupilot(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Interrupt once the search has moved to its second cap.
    let c = home.client();
    wait_for("the tuner's second cap", Duration::from_secs(30), || {
        caps(&c) == [450.0, 450.0]
    });
    send(child.id(), Signal::INT);
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the tuner did not stop");
        std::thread::sleep(Duration::from_millis(20));
    }
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
    let child = home
        .gpupilot(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
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
