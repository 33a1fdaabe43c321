//! Both Grafana dashboards against a real Prometheus scraping a gpupilot daemon on the fake NVML
//! library: every PromQL expression of `dashboards/gpupilot.json` and of NVIDIA's
//! dcgm-exporter dashboard (its expressions in `dcgm-exporter-dashboard.queries`, which says
//! where they come from) must return data, except exactly the ones that need DCGM itself.
//!
//! The node is made so that every series the dashboards read exists: an H100 (row remapping,
//! a pending remap, ECC errors, an XID) beside a V100 (retired pages), a supervised run of the
//! synthetic trainer with its knobs, the thermal governor on every GPU, a node power budget,
//! and energy rates (price, grid intensity, PUE). Grafana's template variables are replaced as
//! Grafana does with "All" selected (`.*`), `$__rate_interval` by 10s (ten scrapes).
//!
//! Without `prometheus` installed the test passes with a printed reason, unless
//! GPUPILOT_REQUIRE_PEERS=1 (CI), where it fails.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::support::home::Home;
use crate::support::net::free_port;
use crate::support::nvml_daemon::NvmlDaemon;
use crate::support::peers::peer;
use crate::support::prometheus::PrometheusProc;
use crate::support::wait::poll;
use gpupilot::cluster::query::Prometheus;

const GPUPILOT_DASHBOARD: &str = include_str!("../../dashboards/gpupilot.json");
const DCGM_QUERIES: &str = include_str!("dcgm-exporter-dashboard.queries");

const SCENARIO: &str = r#"
gpus = ["h100-sxm", "v100-sxm2"]
[training]
model = "resnet50"
batch_size = 128
[[per_gpu]]
gpu = 0
ecc_corrected = 5
ecc_uncorrected = 1
remapped_correctable = 2
remap_pending = true
[[per_gpu]]
gpu = 1
retired_pages_sbe = 2
retired_pages_dbe = 1
[[faults]]
kind = "xid"
gpu = 0
xid = 31
at_s = 0.5
"#;

/// The expressions that cannot return data from gpupilot: DCGM's profiling fields come from
/// DCGM's own profiling module, which NVML does not offer.
const NEED_DCGM: &[&str] = &[r#"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{instance=~".*", gpu=~".*"}"#];

/// Every `expr` of every panel's targets (rows' nested panels too).
fn dashboard_exprs(json: &str) -> Vec<String> {
    fn walk(panels: &serde_json::Value, out: &mut Vec<String>) {
        for p in panels.as_array().into_iter().flatten() {
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(e) = t["expr"].as_str() {
                    out.push(e.to_string());
                }
            }
            walk(&p["panels"], out);
        }
    }
    let dash: serde_json::Value = serde_json::from_str(json).unwrap();
    let mut out = Vec::new();
    walk(&dash["panels"], &mut out);
    out
}

/// Grafana's variables as "All" selects them.
fn substitute(expr: &str) -> String {
    let mut e = expr.to_string();
    for (var, value) in [
        ("$__rate_interval", "10s"),
        ("$__interval", "5s"),
        ("$__range", "1m"),
        ("${instance}", ".*"),
        ("${gpu}", ".*"),
        ("${run}", ".*"),
        ("$instance", ".*"),
        ("$gpu", ".*"),
        ("$run", ".*"),
    ] {
        e = e.replace(var, value);
    }
    assert!(!e.contains('$'), "a variable left in {expr}");
    e
}

fn profile(home: &Home) -> String {
    let path = home.dir.path().join("synth.toml");
    std::fs::write(
        &path,
        format!(
            r#"name = "synth"
[run]
command = ["{}", "synthetic-train", "--speed", "4"]
gpus = [0, 1]
[knobs.batch_size]
initial = 256
min = 8
max = 16384
[knobs.prefetch]
initial = 2
min = 0
max = 16
"#,
            env!("CARGO_BIN_EXE_gpupilot")
        ),
    )
    .unwrap();
    path.display().to_string()
}

#[test]
fn every_query_of_both_dashboards_returns_data_but_dcgms_profiling_fields() {
    let Some(prometheus) = peer("prometheus") else {
        return;
    };
    let ours = dashboard_exprs(GPUPILOT_DASHBOARD);
    let theirs: Vec<String> = DCGM_QUERIES
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect();
    assert!(ours.len() >= 30, "{ours:?}");
    assert_eq!(theirs.len(), 8, "NVIDIA's dashboard has 8 panel queries");

    let mut s = NvmlDaemon::unstarted(SCENARIO);
    std::fs::create_dir_all(&s.home.paths.config).unwrap();
    std::fs::write(
        s.home.paths.config.join("control.toml"),
        "[energy]\nprice_per_kwh = 0.21\ncurrency = \"EUR\"\ngrid_co2_g_per_kwh = 350\n\
         pue = 1.4\n[power]\nnode_budget_w = 1500\n[thermal]\nmargin_c = 8\n",
    )
    .unwrap();
    let port = free_port();
    s.restart(&["--metrics-addr", &format!("127.0.0.1:{port}")]);
    let run = s.ok(&["run", "--detach", &profile(&s.home)]);
    assert!(!run.trim().is_empty());

    let server = PrometheusProc::start(&prometheus, &[format!("127.0.0.1:{port}")], &[]);
    let prom = Prometheus::new(&server.url()).unwrap();
    let all: Vec<(String, String)> = ours
        .iter()
        .chain(&theirs)
        .map(|e| (e.clone(), substitute(e)))
        .collect();
    poll(
        "Prometheus to answer",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || {
            prom.query("vector(1)")
                .map(|_| ())
                .map_err(|e| format!(" ({e}); its log:\n{}", server.log()))
        },
    );
    let need_dcgm: BTreeSet<&str> = NEED_DCGM.iter().copied().collect();
    // Until every query but DCGM's fills (the run attaches, rates have two scrapes, the
    // governor and the budget have acted), at most 90 s.
    let mut empty = BTreeSet::new();
    poll(
        "every dashboard query but DCGM's profiling fields to return data",
        Duration::from_secs(90),
        Duration::from_millis(500),
        || {
            empty.clear();
            let mut failed = Vec::new();
            for (expr, query) in &all {
                match prom.query(query) {
                    Ok(series) if series.is_empty() => {
                        empty.insert(query.clone());
                    }
                    Ok(_) => {}
                    Err(e) => failed.push(format!("{expr}: {e}")),
                }
            }
            assert!(failed.is_empty(), "queries Prometheus refused: {failed:#?}");
            let left: Vec<&String> = empty
                .iter()
                .filter(|q| !need_dcgm.contains(q.as_str()))
                .collect();
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    " (no data yet: {left:#?}); Prometheus's log:\n{}",
                    server.log()
                ))
            }
        },
    );
    // Exactly DCGM's profiling fields stay empty: if gpupilot ever served one, or another
    // query went empty, this says which.
    let empty: Vec<&str> = empty.iter().map(String::as_str).collect();
    assert_eq!(empty, NEED_DCGM, "the queries without data");
}
