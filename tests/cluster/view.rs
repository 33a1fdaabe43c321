//! The cluster view on ratatui's TestBackend, from a hand-built model: the grid at 80×24 and
//! 200×50 (up, stale, down and missing nodes, a stale and a lost GPU, absent values as N/A),
//! sorted by the metric, filtered, one node in detail, and a tiny terminal that must not panic;
//! a live Slurm job on the grid and in detail (with a node Prometheus lacks); `a` and the
//! `attach --host` it runs, failing through SSH.

use crate::support::tui::text;
use gpupilot::cluster::GridMetric;
use gpupilot::cluster::jobs;
use gpupilot::cluster::model::{ClusterModel, GpuCell, Node, NodeState};
use gpupilot::cluster::view::{Key, ViewState, render};
use insta::assert_snapshot;
use ratatui::Terminal;
use ratatui::backend::TestBackend;

const T0: f64 = 1_700_000_000.0;

fn gpu(node: usize, i: u32) -> GpuCell {
    let x = (node * 8 + i as usize) as f64;
    GpuCell {
        index: i,
        uuid: Some(format!(
            "GPU-{node:02}{i:02}aaaa-bbbb-cccc-dddd-eeeeffff0000"
        )),
        model: Some("NVIDIA H100 80GB HBM3".into()),
        util_pct: Some(((x * 37.0) % 101.0).round()),
        mem_used_mib: Some(20_000.0 + x * 500.0),
        mem_total_mib: Some(81_559.0),
        temp_c: Some(40.0 + (x * 7.0) % 45.0),
        power_w: Some(120.0 + (x * 53.0) % 560.0),
        power_limit_w: Some(700.0),
        energy_mj: Some(3.6e9 * (10.0 + x)),
        sm_clock_mhz: Some(1980.0),
        stale: false,
        lost: false,
    }
}

fn node(n: usize, gpus: u32, state: NodeState) -> Node {
    Node {
        instance: format!("10.0.0.{}:9400", n + 10),
        name: format!("gpu-node-{n:02}"),
        hostname: Some(format!("gpu-node-{n:02}")),
        job: Some("dcgm".into()),
        state,
        last_scrape_s: Some(T0 - if state == NodeState::Up { 1.0 } else { 90.0 }),
        gpus: (0..gpus).map(|i| gpu(n, i)).collect(),
        jobs: Vec::new(),
    }
}

fn model() -> ClusterModel {
    let mut nodes: Vec<Node> = (0..12).map(|n| node(n, 8, NodeState::Up)).collect();
    nodes[3].state = NodeState::Stale;
    nodes[3].last_scrape_s = Some(T0 - 45.0);
    nodes[5].state = NodeState::Down;
    nodes[7].state = NodeState::Missing;
    nodes[1].gpus[2].stale = true;
    nodes[1].gpus[6].lost = true;
    // An older exporter: no power limit, no memory total.
    nodes[2].gpus[0].power_limit_w = None;
    nodes[2].gpus[0].mem_total_mib = None;
    nodes[2].gpus[0].temp_c = None;
    // A node with 4 GPUs.
    nodes[9].gpus.truncate(4);
    ClusterModel { time_s: T0, nodes }
}

fn state() -> ViewState {
    let mut s = ViewState::new("http://head:9090", GridMetric::Util);
    s.age_s = Some(0.4);
    s.now_s = Some(T0);
    s
}

fn render_to(model: &ClusterModel, state: &ViewState, w: u16, h: u16) -> Terminal<TestBackend> {
    let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
    t.draw(|f| render(f, model, state)).unwrap();
    t
}

fn shot(name: &str, model: &ClusterModel, state: &ViewState) {
    for (w, h) in [(80, 24), (200, 50)] {
        let t = render_to(model, state, w, h);
        assert_snapshot!(format!("{name}_{w}x{h}"), t.backend());
    }
}

#[test]
fn grid() {
    let m = model();
    shot("cluster_grid", &m, &state());
    let s = text(&render_to(&m, &state(), 200, 50));
    // Totals leave out the nodes that do not answer (3 of 12).
    assert!(
        s.contains("12 nodes (9 up, 1 stale, 1 down, 1 missing) · 68 GPUs"),
        "{s}"
    );
    assert!(s.contains("gpu-node-05 down") && s.contains("gpu-node-07 missing"));
    assert!(s.contains("LOST"));
}

#[test]
fn metric_sort_and_filter_keys() {
    let m = model();
    let mut st = state();
    st.key(Key::Char('p'), &m);
    st.key(Key::Char('s'), &m);
    assert_eq!(st.metric, GridMetric::Power);
    shot("cluster_power_sorted", &m, &st);
    let order: Vec<String> = st.visible(&m).iter().map(|n| n.name.clone()).collect();
    let means: Vec<f64> = st
        .visible(&m)
        .iter()
        .map(|n| n.mean(GridMetric::Power).unwrap())
        .collect();
    assert!(
        means.windows(2).all(|w| w[0] >= w[1]),
        "{order:?} {means:?}"
    );

    let mut st = state();
    for k in [
        Key::Char('/'),
        Key::Char('E'),
        Key::Char('-'),
        Key::Char('1'),
        Key::Enter,
    ] {
        st.key(k, &m);
    }
    let names: Vec<String> = st.visible(&m).iter().map(|n| n.name.clone()).collect();
    assert_eq!(names, ["gpu-node-10", "gpu-node-11"], "case-insensitive");
    shot("cluster_filtered", &m, &st);
    st.key(Key::Esc, &m);
    assert_eq!(st.visible(&m).len(), 12, "Esc clears the filter");
    assert!(st.key(Key::Char('q'), &m), "q quits");
}

#[test]
fn one_node_in_detail() {
    let m = model();
    let mut st = state();
    st.key(Key::Down, &m);
    st.key(Key::Enter, &m);
    assert_eq!(st.detail.as_deref(), Some("10.0.0.11:9400"));
    shot("cluster_detail", &m, &st);
    let s = text(&render_to(&m, &st, 200, 50));
    assert!(
        s.contains("GPU-0102aaaa-bbbb-cccc-dddd-eeeeffff0000"),
        "{s}"
    );
    assert!(s.contains("stale") && s.contains("LOST"));
    st.key(Key::Esc, &m);
    assert_eq!(st.detail, None);
}

#[test]
fn empty_failing_and_tiny() {
    let empty = ClusterModel::default();
    let mut st = state();
    st.error = Some("http://head:9090: connection refused".into());
    st.age_s = None;
    let s = text(&render_to(&empty, &st, 80, 24));
    assert!(
        s.contains("query failed: http://head:9090: connection refused"),
        "{s}"
    );
    assert!(s.contains("no GPU series in Prometheus yet"), "{s}");
    for (w, h) in [(1, 1), (20, 5), (39, 30), (80, 8)] {
        render_to(&model(), &state(), w, h);
    }
}

/// The daemon's runs as `runs` answers them (JSON, as on the wire): one live Slurm run on
/// gpu-node-02, gpu-node-03 (by its full name) and gpu-node-40 (not in Prometheus), one ended.
fn slurm_runs() -> Vec<gpupilot::protocol::RunInfo> {
    let run = |name: &str, status: &str, job: &str, state: &str, nodes: &[&str]| {
        serde_json::json!({
            "id": format!("20261130-064100-{name}"), "name": name, "status": status,
            "pid": 4242, "attempt": 0, "restarts": 0, "started_at": "2026-11-30T06:41:00Z",
            "ended_at": null, "uptime_s": 60.0, "exit_code": null, "signal_name": null,
            "description": null, "command": ["srun", "train.py"], "cwd": "/srv",
            "gpus": "all", "adopted": false, "dir": "/tmp/runs/x",
            "slurm": {"job_id": job, "attempt": 0, "state": state, "nodes": nodes,
                      "partition": "h100"}
        })
    };
    serde_json::from_value(serde_json::json!([
        run(
            "llm-pretrain",
            "running",
            "48213",
            "RUNNING",
            &["gpu-node-02", "gpu-node-03", "gpu-node-40"]
        ),
        run(
            "old-sweep",
            "succeeded",
            "47000",
            "COMPLETED",
            &["gpu-node-04"]
        ),
    ]))
    .unwrap()
}

fn model_with_job() -> ClusterModel {
    let mut m = model();
    m.nodes[3].hostname = Some("gpu-node-03.cluster.example".into());
    m.nodes[3].name = "gpu-node-03.cluster.example".into();
    jobs::mark(m, &slurm_runs())
}

#[test]
fn slurm_job_on_the_grid_and_in_detail() {
    let m = model_with_job();
    shot("cluster_slurm_job", &m, &state());
    let s = text(&render_to(&m, &state(), 200, 50));
    assert!(
        s.contains("13 nodes (9 up, 1 stale, 1 down, 2 missing)"),
        "{s}"
    );
    let row = |name: &str| {
        s.lines()
            .find(|l| l.contains(name))
            .unwrap_or_else(|| panic!("no row {name}:\n{s}"))
            .to_string()
    };
    for n in ["gpu-node-02 ", "gpu-node-03.cluster.example", "gpu-node-40"] {
        assert!(row(n).contains("llm-pretrain #48213"), "{}", row(n));
    }
    assert!(row("gpu-node-40").contains("missing"));
    assert!(
        !row("gpu-node-04").contains('#'),
        "an ended run marks nothing"
    );

    // The missing node in detail: the job, and why it has no GPUs.
    let mut st = state();
    let at = st
        .visible(&m)
        .iter()
        .position(|n| n.name == "gpu-node-40")
        .unwrap();
    for _ in 0..at {
        st.key(Key::Down, &m);
    }
    st.key(Key::Enter, &m);
    assert_eq!(st.detail.as_deref(), Some("slurm:gpu-node-40"));
    shot("cluster_slurm_missing_detail", &m, &st);
    let s = text(&render_to(&m, &st, 200, 50));
    assert!(
        s.contains("Slurm job 48213 (RUNNING, partition h100) · run llm-pretrain (20261130-064100-llm-pretrain)"),
        "{s}"
    );
    assert!(s.contains("Prometheus does not have"), "{s}");
}

#[test]
fn a_asks_for_the_console_on_the_selected_node() {
    let m = model_with_job();
    let mut st = state();
    st.key(Key::Down, &m);
    assert!(!st.key(Key::Char('a'), &m), "a does not quit");
    assert_eq!(st.attach.as_deref(), Some("gpu-node-01"));
    // In detail: that node, by its full host name.
    let mut st = state();
    let at = st
        .visible(&m)
        .iter()
        .position(|n| n.name.starts_with("gpu-node-03"))
        .unwrap();
    for _ in 0..at {
        st.key(Key::Down, &m);
    }
    st.key(Key::Enter, &m);
    st.key(Key::Char('a'), &m);
    assert_eq!(st.attach.as_deref(), Some("gpu-node-03.cluster.example"));
    // Nothing to attach to in an empty view; the metric keys still work.
    let mut st = state();
    st.key(Key::Char('a'), &ClusterModel::default());
    assert_eq!(st.attach, None);
    let s = text(&render_to(&m, &state(), 200, 50));
    assert!(s.contains("a attach"), "the footer names the key: {s}");
}

#[test]
fn attach_through_a_failing_ssh_shows_why_in_the_header() {
    let exe = std::path::Path::new(env!("CARGO_BIN_EXE_gpupilot"));
    let mut cmd = gpupilot::cluster::attach_command(exe, "gpu-node-07");
    let args: Vec<String> = cmd
        .get_args()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    assert_eq!(args, ["attach", "--host", "gpu-node-07"]);
    // `false` in place of ssh: the connection fails the way an unreachable node's does.
    let home = tempfile::tempdir().unwrap();
    cmd.env("GPUPILOT_SSH", "false")
        .env("GPUPILOT_HOME", home.path())
        .stdin(std::process::Stdio::null());
    let err = gpupilot::cluster::run_attach(cmd).unwrap_err();
    assert!(
        err.contains("no gpupilot daemon reachable through `false -o BatchMode=yes"),
        "{err}"
    );
    assert!(err.contains("gpu-node-07 gpupilot bridge"), "{err}");

    let m = model();
    let mut st = state();
    st.notice = Some(gpupilot::cluster::view::Notice::Error(err.clone()));
    let s = text(&render_to(&m, &st, 200, 50));
    assert!(
        s.contains("attach failed: ") && s.contains("no gpupilot daemon reachable through `false"),
        "{s}"
    );
    st.key(Key::Down, &m);
    assert_eq!(st.notice, None, "the next key clears it");
}

/// Names come from Prometheus labels, which any exporter can set: one that clears the screen,
/// forges a line or turns the text around is shown escaped, in the grid and in detail, and the
/// columns are measured on what is shown.
#[test]
fn hostile_labels_are_shown_escaped() {
    let mut m = model();
    let evil = "gpu\u{1b}[2J\nFAKE\u{202e}";
    m.nodes[0].name = evil.into();
    m.nodes[0].job = Some("dcgm\u{7}".into());
    m.nodes[0].gpus[0].model = Some("H100\r\u{1b}[31m".into());
    let shown = "gpu\\x1b[2J\\nFAKE\\u{202e}";
    let s = text(&render_to(&m, &state(), 200, 50));
    assert!(s.contains(shown), "{s}");
    let mut st = state();
    st.key(Key::Enter, &m);
    let s = text(&render_to(&m, &st, 200, 50));
    assert!(s.contains(shown), "{s}");
    assert!(s.contains("job dcgm\\x07"), "{s}");
    assert!(s.contains("H100\\r\\x1b[31m"), "{s}");
    for c in ['\u{1b}', '\u{7}', '\r', '\u{202e}'] {
        assert!(!s.contains(c), "{c:?} reached the screen");
    }
    let mut failing = state();
    failing.error = Some("bad answer: \u{1b}]0;owned\u{7}".into());
    let s = text(&render_to(&m, &failing, 200, 50));
    assert!(
        s.contains("query failed: bad answer: \\x1b]0;owned\\x07"),
        "{s}"
    );
}
