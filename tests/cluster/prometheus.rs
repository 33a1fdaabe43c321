//! The exporter and the cluster view against a real Prometheus (Debian's `prometheus`, started
//! on loopback by the test): two daemons on simulated GPUs (different count, model and seed),
//! each serving `/metrics` on a free loopback port; Prometheus scrapes both every second; the
//! cluster model built through the query client must match what each daemon's `status`
//! reports (names and UUIDs exactly, utilization, power, temperature and memory within what
//! changes across a scrape interval), its render must show both nodes, and `promtool check
//! metrics` must accept each `/metrics` page but for the lints that dcgm-exporter's own names
//! draw (see [`promtool_accepts`]). The second daemon spells its node label `hostname`
//! (`[exporter] hostname_label`, as dcgm-exporter 4.x), the first `Hostname`: the cluster
//! view must name both.
//!
//! Without `prometheus`/`promtool` installed the test passes with a printed reason, unless
//! GPUPILOT_REQUIRE_PEERS=1 (CI), where it fails.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::home::{DaemonProc, Home};
use crate::support::net::{free_port, http_get};
use crate::support::peers::peer;
use crate::support::prometheus::PrometheusProc;
use crate::support::promtool::promtool_accepts;
use crate::support::wait::{poll, wait_for};
use gpupilot::client::Client;
use gpupilot::cluster::model::{ClusterModel, NodeState};
use gpupilot::cluster::query::Prometheus;
use gpupilot::cluster::view::{Key, ViewState, render};
use gpupilot::cluster::{GridMetric, fetch};
use gpupilot::telemetry::{GpuSample, now_s};
use ratatui::Terminal;
use ratatui::backend::TestBackend;

/// A daemon on `gpus` simulated GPUs of `model`, serving `/metrics` on `port`.
fn daemon(home: &Home, gpus: u32, model: &str, seed: u64, port: u16) -> DaemonProc {
    let child = Command::new(env!("CARGO_BIN_EXE_gpupilot"))
        .args([
            "--source",
            "sim",
            "--gpus",
            &gpus.to_string(),
            "--model",
            model,
        ])
        .args(["--seed", &seed.to_string(), "--workload", "resnet50"])
        .args(["daemon", "--rate", "10", "--metrics-addr"])
        .arg(format!("127.0.0.1:{port}"))
        .current_dir(home.dir.path())
        .env("GPUPILOT_HOME", home.root())
        .env_remove("GPUPILOT_SOURCE")
        .env_remove("GPUPILOT_NVML_LIB")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    DaemonProc::answering(child, &home.paths, "the daemon")
}

fn snapshot_gpus(home: &Home) -> Vec<GpuSample> {
    let s = Client::connect(&home.paths).unwrap().status().unwrap();
    s.snapshot.expect("the daemon has telemetry").gpus
}

/// Per GPU of a daemon: the range each compared value took over a window of `status` calls.
#[derive(Default, Clone)]
struct Range {
    util: (f64, f64),
    power: (f64, f64),
    temp: (f64, f64),
    mem_mib: (f64, f64),
}

fn widen(r: &mut (f64, f64), v: Option<f64>) {
    if let Some(v) = v {
        r.0 = r.0.min(v);
        r.1 = r.1.max(v);
    }
}

fn ranges(samples: &[Vec<GpuSample>]) -> Vec<Range> {
    let empty = (f64::INFINITY, f64::NEG_INFINITY);
    let n = samples[0].len();
    let mut out = vec![
        Range {
            util: empty,
            power: empty,
            temp: empty,
            mem_mib: empty
        };
        n
    ];
    for snap in samples {
        for (g, r) in snap.iter().zip(out.iter_mut()) {
            widen(&mut r.util, g.util_gpu_pct);
            widen(&mut r.power, g.power_w);
            widen(&mut r.temp, g.temperature_c);
            widen(
                &mut r.mem_mib,
                g.memory_used_bytes.map(|b| (b as f64 / 1048576.0).round()),
            );
        }
    }
    out
}

fn within(what: &str, v: Option<f64>, (lo, hi): (f64, f64), slack: f64) {
    let v = v.unwrap_or_else(|| panic!("{what}: absent in Prometheus"));
    assert!(
        v >= lo - slack && v <= hi + slack,
        "{what}: Prometheus has {v}, the daemon reported {lo}..={hi} around the query"
    );
}

#[test]
fn prometheus_scrapes_two_daemons_and_the_cluster_view_matches() {
    let (Some(prometheus), Some(promtool)) = (peer("prometheus"), peer("promtool")) else {
        return;
    };
    let (home_a, home_b) = (Home::new(), Home::new());
    let (port_a, port_b) = (free_port(), free_port());
    let _da = daemon(&home_a, 2, "h100-sxm", 1, port_a);
    std::fs::create_dir_all(&home_b.paths.config).unwrap();
    std::fs::write(
        home_b.paths.config.join("prometheus.toml"),
        "[exporter]\nhostname_label = \"hostname\"\n",
    )
    .unwrap();
    let _db = daemon(&home_b, 3, "a100", 2, port_b);

    // The exporter itself: content type, and promtool's checks on each page.
    for port in [port_a, port_b] {
        wait_for("a snapshot on /metrics", Duration::from_secs(10), || {
            http_get(port, "/metrics")
                .1
                .contains("DCGM_FI_DEV_GPU_UTIL{")
        });
        let (head, body) = http_get(port, "/metrics");
        assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: text/plain; version=0.0.4"),
            "{head}"
        );
        promtool_accepts(&promtool, &body);
        // dcgm-exporter's labels: modelName, the node label as configured, the driver.
        let (host_label, other) = if port == port_a {
            ("Hostname=", "hostname=")
        } else {
            ("hostname=", "Hostname=")
        };
        let first = body
            .lines()
            .find(|l| l.starts_with("DCGM_FI_DEV_GPU_UTIL{"))
            .unwrap();
        for label in ["modelName=", host_label, "DCGM_FI_DRIVER_VERSION="] {
            assert!(first.contains(label), "{label} in {first}");
        }
        assert!(
            !body.contains(other) && !body.contains("model_name="),
            "{body}"
        );
        assert!(body.contains("# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n"));
    }

    // Prometheus on loopback, scraping both every second.
    let server = PrometheusProc::start(
        &prometheus,
        &[format!("127.0.0.1:{port_a}"), format!("127.0.0.1:{port_b}")],
        &[],
    );
    let prom = Prometheus::new(&server.url()).unwrap();
    poll(
        "Prometheus to scrape both daemons",
        Duration::from_secs(60),
        Duration::from_millis(250),
        || {
            let up = prom.query("up").unwrap_or_default();
            let model = fetch(&prom, None, now_s()).ok();
            let gpus = model
                .as_ref()
                .map_or(0, |m| m.nodes.iter().map(|n| n.gpus.len()).sum::<usize>());
            if up.iter().filter(|s| s.v == 1.0).count() == 2 && gpus == 5 {
                return Ok(());
            }
            Err(format!(" (up: {up:?}); its log:\n{}", server.log()))
        },
    );

    // The daemons' own view over the last seconds, then the model, then once more.
    let mut seen_a = Vec::new();
    let mut seen_b = Vec::new();
    for _ in 0..25 {
        seen_a.push(snapshot_gpus(&home_a));
        seen_b.push(snapshot_gpus(&home_b));
        std::thread::sleep(Duration::from_millis(100));
    }
    let model: ClusterModel = fetch(&prom, None, now_s()).unwrap();
    seen_a.push(snapshot_gpus(&home_a));
    seen_b.push(snapshot_gpus(&home_b));

    assert_eq!(model.nodes.len(), 2, "{model:#?}");
    for (port, seen) in [(port_a, &seen_a), (port_b, &seen_b)] {
        let instance = format!("127.0.0.1:{port}");
        let node = model
            .nodes
            .iter()
            .find(|n| n.instance == instance)
            .unwrap_or_else(|| panic!("no node {instance} in {model:#?}"));
        assert_eq!(node.state, NodeState::Up);
        assert_eq!(node.job.as_deref(), Some("gpupilot"));
        // Named by its host label, `Hostname` or `hostname` alike.
        assert!(
            node.hostname.is_some(),
            "{instance} has no host name: {node:#?}"
        );
        let last = seen.last().unwrap();
        assert_eq!(node.gpus.len(), last.len());
        let r = ranges(seen);
        for (cell, (g, r)) in node.gpus.iter().zip(last.iter().zip(&r)) {
            let what = format!("{instance} GPU {}", g.index);
            assert_eq!(cell.index, g.index);
            assert_eq!(cell.uuid, g.uuid, "{what}");
            assert_eq!(cell.model, g.name, "{what}");
            within(&format!("{what} util"), cell.util_pct, r.util, 2.0);
            within(&format!("{what} power"), cell.power_w, r.power, 5.0);
            within(&format!("{what} temperature"), cell.temp_c, r.temp, 1.0);
            within(&format!("{what} memory"), cell.mem_used_mib, r.mem_mib, 1.0);
            let total = g.memory_total_bytes.map(|b| (b as f64 / 1048576.0).round());
            let got = cell.mem_total_mib.unwrap();
            assert!(
                (got - total.unwrap()).abs() <= 1.0,
                "{what}: total {got} vs {total:?}"
            );
            assert!(cell.energy_mj.is_some_and(|e| e > 0.0), "{what}: energy");
            assert!(!cell.stale && !cell.lost);
        }
    }
    let totals = model.totals();
    assert_eq!((totals.nodes, totals.nodes_up, totals.gpus), (2, 2, 5));
    assert_eq!(totals.gpus_busy + totals.gpus_idle, 5);

    // The view of that model: both nodes in the grid, and one node's GPUs in detail.
    let mut state = ViewState::new(&prom.base, GridMetric::Util);
    let screen = |state: &ViewState| {
        let mut t = Terminal::new(TestBackend::new(200, 50)).unwrap();
        t.draw(|f| render(f, &model, state)).unwrap();
        let buf = t.backend().buffer().clone();
        let mut s = String::new();
        for y in 0..buf.area.height {
            for x in 0..buf.area.width {
                s.push_str(buf[(x, y)].symbol());
            }
            s.push('\n');
        }
        s
    };
    let grid = screen(&state);
    assert!(grid.contains("2 nodes (2 up) · 5 GPUs"), "{grid}");
    assert!(grid.contains(&format!("@127.0.0.1:{port_a}")), "{grid}");
    assert!(grid.contains(&format!("@127.0.0.1:{port_b}")), "{grid}");
    let b_first = port_b.to_string() < port_a.to_string();
    state.key(Key::Down, &model);
    state.key(Key::Enter, &model);
    let detail = screen(&state);
    let (home, port) = if b_first {
        (&home_a, port_a)
    } else {
        (&home_b, port_b)
    };
    assert!(
        detail.contains(&format!("target 127.0.0.1:{port}")),
        "{detail}"
    );
    for g in snapshot_gpus(home) {
        assert!(detail.contains(g.uuid.as_deref().unwrap()), "{detail}");
    }
}
