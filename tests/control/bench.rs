//! `gpupilot bench power-sweep` and `bench burn` with `--source sim`, as a user types them,
//! against a real daemon on the simulator in a private GPUPILOT_HOME: every cap through the
//! daemon and into its events, the cap put back at the end and on SIGHUP (a dropped SSH
//! session), the curve kept under the state directory; and without CUDA, one line and exit 2.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::home::{Home, power_caps as caps};
use crate::support::proc::send;
use crate::support::wait::{finish, wait_for};
use crate::wait_every;
use rustix::process::Signal;

/// The node's events of the caps the sweep set, oldest first.
fn sweep_events(home: &Home) -> Vec<serde_json::Value> {
    home.events_named("gpu_changed")
        .into_iter()
        .filter(|e| {
            e["what"] == "power_limit" && e["why"].to_string().contains("bench power-sweep")
        })
        .collect()
}

#[test]
fn a_simulated_sweep_measures_each_cap_puts_the_cap_back_and_keeps_the_curve() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    home.ok(&["power", "cap", "650", "--gpu", "0"]);
    let v = home.power_sweep("700:500:100");
    assert_eq!(v["schema"], "gpupilot.bench.power-sweep/1");
    assert_eq!(v["label"], "simulated");
    assert_eq!(v["original_cap_w"], 650.0);
    assert_eq!(v["stopped"], false);
    let points = v["points"].as_array().unwrap();
    let measured: Vec<f64> = points
        .iter()
        .map(|p| p["cap_w"].as_f64().unwrap())
        .collect();
    assert_eq!(measured, [700.0, 600.0, 500.0]);
    for p in points {
        assert!(p["throughput_per_s"].as_f64().unwrap() > 1e14, "{p}");
        let w = p["power_w"].as_f64().unwrap();
        assert!(w > 100.0 && w <= p["cap_w"].as_f64().unwrap() + 5.0, "{p}");
    }
    assert!(v["knee"]["cap_w"].is_number(), "{v}");
    assert!(v["best_perf_per_w_cap_w"].is_number(), "{v}");
    // Back where the operator left it; GPU 1 never touched.
    assert_eq!(caps(&home.client()), [650.0, 700.0]);
    // Each change in the node's events, with its reason, the restore last.
    let events = sweep_events(&home);
    let text: Vec<String> = events.iter().map(|e| e.to_string()).collect();
    assert_eq!(events.len(), 4, "{text:#?}");
    for (e, cap) in events.iter().zip(["700", "600", "500"]) {
        assert_eq!(
            e["why"],
            format!("bench power-sweep: measuring at {cap} W"),
            "{e}"
        );
        assert_eq!(e["new"], format!("{cap} W"), "{e}");
        assert!(e["by"].as_str().unwrap().contains("via gpupilot"), "{e}");
    }
    assert_eq!(events[3]["why"], "bench power-sweep: done, cap restored");
    assert_eq!(events[3]["new"], "650 W");
    // The curve, where docs/bench.md says.
    let file = v["curve_file"].as_str().unwrap();
    assert!(
        file.ends_with("/state/bench/power-sweep-nvidia-h100-80gb-hbm3-gemm.json"),
        "{file}"
    );
    let kept: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    assert_eq!(kept["points"], v["points"]);
}

#[test]
fn a_sighup_mid_sweep_puts_the_cap_back() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let mut child = home
        .gpupilot(&[
            "bench",
            "power-sweep",
            "--caps",
            "700:300:100",
            "--warmup",
            "1s",
            "--window",
            "2s",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let c = home.client();
    wait_for("the sweep's second cap", Duration::from_secs(30), || {
        caps(&c)[0] == 600.0
    });
    send(child.id(), Signal::HUP);
    wait_for("the sweep to stop", Duration::from_secs(20), || {
        child.try_wait().unwrap().is_some()
    });
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("sweep stopped") && stderr.contains("back at 700 W"),
        "{stderr}"
    );
    assert_eq!(caps(&c), [700.0, 700.0]);
    let last = sweep_events(&home).last().unwrap().to_string();
    assert!(last.contains("stopped, cap restored"), "{last}");
}

#[test]
fn a_simulated_burn_gives_a_verdict_per_gpu() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let out = home.ok(&["bench", "burn", "--duration", "3s", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["schema"], "gpupilot.bench.burn/1");
    assert_eq!(v["label"], "simulated");
    let gpus = v["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 2);
    for g in gpus {
        assert!(g["steady"]["temperature_c"].is_number(), "{g}");
        assert!(
            g["steady"]["throughput_per_s"].as_f64().unwrap() > 1e14,
            "{g}"
        );
        // Two identical GPUs on the same load: neither is named.
        assert!(g["slow"].is_null(), "{g}");
    }
    let table = home.ok(&["bench", "burn", "--gpu", "1", "--duration", "2s"]);
    assert!(
        table.contains("simulated: figures of gpusim's model"),
        "{table}"
    );
}

#[test]
fn without_cuda_or_sim_one_line_and_exit_2() {
    let home = Home::new();
    for cmd in [
        &["bench", "burn"][..],
        &["bench", "power-sweep", "--gpu", "0"],
    ] {
        let child = Command::new(env!("CARGO_BIN_EXE_gpupilot"))
            .args(cmd)
            .env("GPUPILOT_HOME", home.root())
            .env_remove("GPUPILOT_SOURCE")
            .env_remove("GPUPILOT_SYSTEM")
            // No libcuda.so.1 anywhere it looks.
            .env("LD_LIBRARY_PATH", home.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = finish(child, "bench without CUDA", Duration::from_secs(20));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
        let head = format!("gpupilot {} {}: no CUDA: ", cmd[0], cmd[1]);
        assert!(stderr.starts_with(&head), "{stderr}");
        assert!(
            stderr.contains(&format!("`gpupilot --source sim {} {}`", cmd[0], cmd[1])),
            "{stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
        // No daemon was started for nothing.
        assert!(!home.socket().exists());
    }
}

#[test]
fn a_cap_outside_the_range_or_an_unknown_gpu_is_refused_with_exit_2_and_nothing_changed() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    for (args, says) in [
        (
            &["bench", "power-sweep", "--caps", "900:500:100"][..],
            "a cap of 900 W is outside GPU 0's range, 200–700 W",
        ),
        (
            &[
                "bench",
                "power-sweep",
                "--gpu",
                "7",
                "--caps",
                "700:500:100",
            ],
            "the daemon reports no GPU 7",
        ),
        (
            &["bench", "burn", "--gpu", "7", "--duration", "2s"],
            "the daemon reports no GPU 7",
        ),
    ] {
        let out = home.run(args, Duration::from_secs(30));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        // The last line (the sweep announces itself first).
        let last = stderr.trim().lines().last().unwrap_or_default();
        assert_eq!(last, format!("gpupilot: {says}"), "{args:?}: {stderr}");
    }
    assert!(sweep_events(&home).is_empty());
    assert_eq!(caps(&home.client()), [700.0, 700.0]);
}

#[test]
fn the_advisor_tells_a_busy_gpu_the_best_cap_of_its_models_kept_sweep() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let v = home.power_sweep("700:300:100");
    // GPU 1, busy at its 700 W cap, is an H100 as GPU 0 is.
    let best = v["best_perf_per_w_cap_w"].as_f64().unwrap();
    let mut hint = serde_json::Value::Null;
    // The hint needs 20 s of the busy GPU's samples: ask `advise` (a process) twice a second.
    wait_every(
        "the advisor's measured-cap hint",
        Duration::from_secs(40),
        Duration::from_millis(500),
        || {
            let out = home.run(&["advise", "--json"], Duration::from_secs(20));
            let hints: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            hint = hints
                .as_array()
                .and_then(|a| {
                    a.iter()
                        .find(|h| h["kind"] == "measured_cap" && h["gpu"] == 1)
                })
                .cloned()
                .unwrap_or_default();
            !hint.is_null()
        },
    );
    assert_eq!(hint["action"]["action"], "power_cap", "{hint}");
    assert_eq!(hint["action"]["watts"], best, "{hint}");
    assert!(
        hint["summary"]
            .as_str()
            .is_some_and(|s| s.contains("a simulated power sweep of its model")),
        "{hint}"
    );
}
