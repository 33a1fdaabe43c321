//! `gpupilot report` on a real run: a daemon on simulated GPUs supervises the synthetic trainer,
//! a knob and a power cap change while it trains, and once it has ended the report's figures
//! equal `summary.json`'s (cost, CO2 and facility energy at the node's rates and the run's own
//! grid intensity), the Markdown has its sections, the daemon has written report.html into the
//! run directory and said so (its last event, `ps`), and the page, opened in headless Chromium
//! where it is installed, renders its charts (SVG with data points) without a request leaving
//! it.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::support::home::Home;
use crate::support::wait::wait_for;

const BIN: &str = env!("CARGO_BIN_EXE_gpupilot");

fn profile(home: &Home) -> String {
    let body = format!(
        r#"name = "synth"
[run]
command = ["{BIN}", "synthetic-train", "--steps", "150", "--speed", "4"]
gpus = [0]
[knobs.batch_size]
initial = 256
min = 8
max = 4096
[energy]
grid_co2_g_per_kwh = 100
"#
    );
    let path = home.dir.path().join("synth.toml");
    std::fs::write(&path, body).unwrap();
    path.display().to_string()
}

#[test]
fn a_finished_runs_report_has_its_figures_and_charts() {
    let home = Home::new();
    // The node's rates; the run's profile has its own grid intensity.
    std::fs::create_dir_all(&home.paths.config).unwrap();
    std::fs::write(
        home.paths.config.join("control.toml"),
        "[energy]\nprice_per_kwh = 0.2\ncurrency = \"EUR\"\ngrid_co2_g_per_kwh = 350\npue = 1.4\n",
    )
    .unwrap();
    let _daemon = home.daemon(&[]);
    let run = home
        .ok(&["run", "--detach", &profile(&home)])
        .trim()
        .to_string();
    let c = home.client();
    wait_for("the trainer to report", Duration::from_secs(30), || {
        c.run_metrics(&run, 0)
            .is_ok_and(|m| m.trainer.attached && !m.points.is_empty())
    });

    // A report so far, marked as such.
    let live: serde_json::Value = json(&home, &run);
    assert_eq!(live["live"], true, "{live}");
    assert!(home.ok(&["report", &run, "--md"]).contains("report so far"));

    home.ok(&["set", &run, "batch-size", "512"]);
    home.ok(&["power", "cap", "250", "--gpu", "0"]);
    wait_for("the run to end", Duration::from_secs(120), || {
        c.run(&run).is_ok_and(|r| r.is_final())
    });
    let dir = home.run_dir(&run);
    let html_path = dir.path().join("report.html");
    wait_for("the daemon's report.html", Duration::from_secs(20), || {
        html_path.exists()
    });
    // The run's last event, `ps` and `ps --json` say where the report is.
    let shown = html_path.display().to_string();
    wait_for("the report_written event", Duration::from_secs(10), || {
        std::fs::read_to_string(dir.events_path())
            .unwrap_or_default()
            .lines()
            .any(|l| l.contains("\"event\":\"report_written\"") && l.contains(&shown))
    });
    assert!(home.ok(&["ps"]).contains(&shown));
    let ps: serde_json::Value = serde_json::from_str(&home.ok(&["ps", "--json"])).unwrap();
    let listed = ps
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == run.as_str())
        .unwrap();
    assert_eq!(listed["report"], shown.as_str());
    // Energy is settled once the daemon's report is written; read the summary after it.
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.summary_path()).unwrap()).unwrap();
    let r: serde_json::Value = json(&home, &run);
    assert_eq!(r["live"], false);
    assert_eq!(r["summary"]["exit_code"], 0, "{}", r["summary"]);
    assert_eq!(r["summary"]["exit_code"], summary["exit_code"]);
    assert_eq!(r["summary"]["restarts"], summary["restarts"]);
    assert_eq!(r["summary"]["duration_s"], summary["duration_s"]);
    assert_eq!(
        r["energy"], summary["energy"],
        "energy as summary.json has it"
    );
    assert_eq!(r["throughput"]["samples"], summary["samples"]);
    // Cost at the node's price, CO2 at the run's intensity, the facility at the node's PUE.
    let e = &summary["energy"];
    let kwh = e["kwh"].as_f64().unwrap();
    assert!(kwh > 0.0, "{e}");
    let close = |v: &serde_json::Value, want: f64| (v.as_f64().unwrap() - want).abs() < 1e-9;
    assert!(close(&e["cost"], kwh * 0.2), "{e}");
    assert_eq!(e["currency"], "EUR");
    assert!(
        close(&e["co2_g"], kwh * 100.0),
        "the run's intensity wins: {e}"
    );
    assert!(
        close(&e["pue"], 1.4) && close(&e["facility_kwh"], kwh * 1.4),
        "{e}"
    );
    assert!(close(&e["facility_co2_g"], kwh * 140.0), "{e}");
    assert_eq!(
        r["throughput"]["steps"], 150,
        "the last step the trainer reported"
    );
    assert_eq!(r["unreadable"]["metrics"], 0);
    let kinds: Vec<&str> = r["markers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["kind"].as_str().unwrap())
        .collect();
    assert!(kinds.contains(&"knob"), "{kinds:?}");
    assert!(kinds.contains(&"cap"), "{kinds:?}");
    assert!(
        r["gpu_history"].as_array().is_some_and(|h| !h.is_empty()),
        "{}",
        r["missing"]
    );

    // The environment the daemon recorded at the start: its snapshot's driver and CUDA, the
    // run's GPU and its model, the daemon's version; one rank, so no straggler share.
    assert!(dir.path().join("environment.json").exists());
    let status: serde_json::Value = serde_json::from_str(&home.ok(&["status", "--json"])).unwrap();
    let env = &r["environment"];
    assert_eq!(
        env["driver_version"], status["node"]["driver_version"],
        "{env}"
    );
    assert!(env["driver_version"].is_string(), "{env}");
    assert_eq!(
        env["cuda_driver_version"], status["node"]["cuda_driver_version"],
        "{env}"
    );
    assert_eq!(env["gpupilot_version"], env!("CARGO_PKG_VERSION"));
    let gpus = env["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 1, "the run's GPU only: {env}");
    assert_eq!(gpus[0]["index"], 0);
    assert!(gpus[0]["name"].is_string(), "{env}");
    assert!(r["time_lost"]["straggler"].is_null());
    // What the trainer said when it attached, and the GPU's rated figures for the advice.
    assert_eq!(
        env["software"]["gpupilot_synthetic"],
        env!("CARGO_PKG_VERSION"),
        "{env}"
    );
    assert!(gpus[0]["power_default_w"].is_number(), "{env}");
    assert!(r["advice"].is_array(), "{r}");

    let md = home.ok(&["report", &run, "--md"]);
    for h in [
        "# Run report: ",
        "## Verdict",
        "## Energy",
        "## Time lost",
        "## Advice",
        "## Changes during the run",
        "## Events",
        "## Environment",
    ] {
        assert!(md.contains(h), "{h} missing from\n{md}");
    }
    assert!(md.contains("| exit code | 0 |"), "{md}");
    assert!(md.contains("the facility's share"), "{md}");
    assert!(home.ok(&["ps"]).contains("(PUE 1.40)"));

    // The command's own page, to a file of our choosing.
    let page = home.dir.path().join("page.html");
    let printed = home.ok(&["report", &run, "--html", &page.display().to_string()]);
    assert_eq!(printed.trim(), page.display().to_string());
    for path in [&page, &html_path] {
        let html = std::fs::read_to_string(path).unwrap();
        check_static(&html);
        assert!(html.contains("<h2>Environment</h2>"));
    }
    chromium(&page);

    // A run that does not exist.
    let out = home.run(&["report", "no-such-run"], Duration::from_secs(30));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no-such-run"), "{err}");
}

#[test]
fn without_a_daemon_a_truncated_run_directory_still_has_its_report() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let run = home.start_synthetic();
    home.ok(&["stop", &run]);
    let c = home.client();
    wait_for("the run to end", Duration::from_secs(30), || {
        c.run(&run).is_ok_and(|r| r.is_final())
    });
    drop(c);
    drop(_daemon);
    let dir = home.run_dir(&run);
    let metrics = dir.path().join("metrics.jsonl");
    let mut text = std::fs::read_to_string(&metrics).unwrap();
    text.push_str("{\"n\":12345,\"t\":17");
    std::fs::write(&metrics, text).unwrap();
    let r: serde_json::Value = json(&home, &run);
    assert_eq!(r["unreadable"]["metrics"], 1, "{}", r["missing"]);
    let missing = r["missing"].to_string();
    assert!(missing.contains("metrics.jsonl: 1 line"), "{missing}");
    assert!(missing.contains("no daemon answered"), "{missing}");
    let printed = home.ok(&["report", &run]);
    assert_eq!(
        printed.trim(),
        dir.path().join("report.html").display().to_string()
    );
    let out = home.run(&["report", "nothing-like-it"], Duration::from_secs(30));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no run `nothing-like-it`"));
}

/// `report RUN --json`, read as it comes (it holds every series: more than a pipe buffers).
fn json(home: &Home, run: &str) -> serde_json::Value {
    let out = home.gpupilot(&["report", run, "--json"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Charts inline, nothing that loads from elsewhere.
fn check_static(html: &str) {
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.matches("<svg").count() >= 6, "training and GPU charts");
    assert!(html.contains("<polyline"), "line series with data points");
    assert!(!html.contains("<script"), "no script");
    for attr in ["src=", "href=", "url(", "@import"] {
        assert!(!html.contains(attr), "{attr} in the page");
    }
}

/// Open the page in headless Chromium: it renders the charts and a screenshot, with every host
/// name unresolvable so that a request leaving the page would fail and show in the DOM check.
fn chromium(page: &Path) {
    if Command::new("chromium").arg("--version").output().is_err() {
        eprintln!(
            "chromium is not installed (Debian package `chromium`, installed by .ci/run): \
             the report was checked statically only"
        );
        return;
    }
    let shot = page.with_file_name("report.png");
    let base = |cmd: &mut Command| {
        cmd.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--host-resolver-rules=MAP * ~NOTFOUND",
        ])
        .arg(format!(
            "--user-data-dir={}",
            page.with_file_name("chromium-profile").display()
        ))
        .arg("--window-size=1200,2000");
    };
    let mut cmd = Command::new("chromium");
    base(&mut cmd);
    let out = cmd
        .arg(format!("--screenshot={}", shot.display()))
        .arg(format!("file://{}", page.display()))
        .output()
        .unwrap();
    let size = std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0);
    assert!(
        size > 10_000,
        "no screenshot ({size} bytes): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut cmd = Command::new("chromium");
    base(&mut cmd);
    let out = cmd
        .arg("--dump-dom")
        .arg(format!("file://{}", page.display()))
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        dom.matches("<svg").count() >= 6,
        "rendered charts: {dom:.2000}"
    );
    let points = dom
        .split("<polyline")
        .skip(1)
        .filter(|p| {
            p.contains("points=\"")
                && p.split("points=\"")
                    .nth(1)
                    .is_some_and(|v| v.split(' ').count() > 2)
        })
        .count();
    assert!(
        points >= 6,
        "polylines with data points in the rendered DOM"
    );
    // (SVG's xmlns names a namespace; it is not fetched.)
    for load in ["src=\"http", "href=\"http", "url(http", "<link", "<script"] {
        assert!(!dom.contains(load), "{load} in the rendered DOM");
    }
}
