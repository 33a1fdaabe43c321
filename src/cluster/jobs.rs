//! Slurm jobs on the grid: the local daemon's live Slurm runs mark the nodes their jobs hold.
//!
//! [`mark`] is pure: a Prometheus model and the daemon's runs in, the model with each node's
//! jobs out, plus a **missing** row for every node a job lists that Prometheus does not have
//! (so the operator sees that the job runs where nothing is scraped). Slurm names nodes by
//! short names (`gpu-node-07`) while the `Hostname` label may be a full name
//! (`gpu-node-07.cluster.example`): a name matches when it is equal, or when their first labels
//! are (case-insensitive).
//!
//! [`poll_runs`] reads the runs from a daemon already running (never starting one): no daemon,
//! no marks, and no message.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::model::{ClusterModel, Node, NodeState};
use crate::protocol::RunInfo;

/// How often the runs are read from the local daemon.
pub const RUNS_EVERY: Duration = Duration::from_secs(3);

/// One live Slurm job on a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JobMark {
    /// The run's name (the profile's `name`).
    pub run: String,
    /// The run's id.
    pub run_id: String,
    pub job_id: String,
    /// Slurm's state as last seen (`RUNNING`, `PENDING`, …).
    pub state: Option<String>,
    pub partition: Option<String>,
}

impl JobMark {
    /// `train-llm #48213` for the grid.
    pub fn label(&self) -> String {
        format!("{} #{}", self.run, self.job_id)
    }
}

/// The live Slurm jobs of `runs`, with their nodes: runs that have not ended whose job is not
/// over for Slurm either.
pub fn live_jobs(runs: &[RunInfo]) -> Vec<(JobMark, &[String])> {
    runs.iter()
        .filter(|r| !r.is_final())
        .filter_map(|r| {
            let job = r.slurm.as_ref()?;
            let over = job
                .state
                .as_deref()
                .and_then(|s| s.split_whitespace().next())
                .is_some_and(crate::supervisor::slurm::is_final);
            if over {
                return None;
            }
            Some((
                JobMark {
                    run: r.name.clone(),
                    run_id: r.id.clone(),
                    job_id: job.job_id.clone(),
                    state: job.state.clone(),
                    partition: job.partition.clone(),
                },
                job.nodes.as_slice(),
            ))
        })
        .collect()
}

fn first_label(name: &str) -> &str {
    name.split('.').next().unwrap_or(name)
}

/// Whether Slurm's node name `slurm` names `host` (equal, or the same first label).
pub fn same_host(slurm: &str, host: &str) -> bool {
    let (a, b) = (slurm.trim(), host.trim());
    if a.is_empty() || b.is_empty() {
        return false;
    }
    a.eq_ignore_ascii_case(b) || first_label(a).eq_ignore_ascii_case(first_label(b))
}

/// The instance without its port: `10.0.0.11:9400` → `10.0.0.11`, `[fe80::1]:9400` →
/// `fe80::1`.
fn instance_host(instance: &str) -> &str {
    if let Some(rest) = instance.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match instance.rsplit_once(':') {
        Some((h, port)) if !h.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => instance,
    }
}

/// Whether the grid's `node` is Slurm's node `slurm`: by its `Hostname` label, or by the host
/// of its scrape target when it has none.
pub fn node_is(node: &Node, slurm: &str) -> bool {
    match &node.hostname {
        Some(h) => same_host(slurm, h),
        None => same_host(slurm, instance_host(&node.instance)),
    }
}

/// The host to reach `node` on over SSH: its `Hostname` label, else its scrape target's host.
pub fn ssh_host(node: &Node) -> String {
    match &node.hostname {
        Some(h) if !h.trim().is_empty() => h.trim().to_string(),
        _ => instance_host(&node.instance).to_string(),
    }
}

/// The instance of the row of a job's node that Prometheus does not have.
pub fn missing_instance(slurm_node: &str) -> String {
    format!("slurm:{slurm_node}")
}

/// `model` with the live Slurm jobs of `runs` on its nodes, and a missing row (no GPUs) for
/// each node a job lists that the model lacks.
pub fn mark(mut model: ClusterModel, runs: &[RunInfo]) -> ClusterModel {
    let prometheus_nodes = model.nodes.len();
    for (job, nodes) in live_jobs(runs) {
        for name in nodes {
            let mut found = false;
            for node in model.nodes[..prometheus_nodes].iter_mut() {
                if node_is(node, name) {
                    found = true;
                    if !node.jobs.contains(&job) {
                        node.jobs.push(job.clone());
                    }
                }
            }
            if found {
                continue;
            }
            let instance = missing_instance(name);
            match model.nodes.iter_mut().find(|n| n.instance == instance) {
                Some(n) => {
                    if !n.jobs.contains(&job) {
                        n.jobs.push(job.clone());
                    }
                }
                None => model.nodes.push(Node {
                    instance,
                    name: name.clone(),
                    hostname: Some(name.clone()),
                    job: None,
                    state: NodeState::Missing,
                    last_scrape_s: None,
                    gpus: Vec::new(),
                    jobs: vec![job.clone()],
                }),
            }
        }
    }
    model.nodes.sort_by(|a, b| a.name.cmp(&b.name));
    model
}

/// Read the local daemon's runs every `every` and send them; an empty list when no daemon
/// answers (it is never started from here). Ends when the receiver is dropped.
pub fn poll_runs(paths: crate::config::Paths, every: Duration, tx: mpsc::Sender<Vec<RunInfo>>) {
    let mut client: Option<crate::client::Client> = None;
    loop {
        let started = Instant::now();
        if client.is_none() {
            client = crate::client::Client::connect(&paths)
                .ok()
                .map(|c| c.with_timeout(Duration::from_secs(3)));
        }
        let runs = match client.as_ref().map(|c| c.runs()) {
            Some(Ok(runs)) => runs,
            Some(Err(_)) => {
                // Gone (restarted, stopped): connect afresh next round.
                client = None;
                Vec::new()
            }
            None => Vec::new(),
        };
        if tx.send(runs).is_err() {
            return;
        }
        std::thread::sleep(every.saturating_sub(started.elapsed()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::model::GpuCell;
    use crate::supervisor::RunStatus;
    use crate::supervisor::slurm::SlurmJob;

    fn node(instance: &str, hostname: Option<&str>) -> Node {
        Node {
            instance: instance.into(),
            name: hostname.unwrap_or(instance).into(),
            hostname: hostname.map(str::to_string),
            job: Some("gpupilot".into()),
            state: NodeState::Up,
            last_scrape_s: Some(1.0),
            gpus: vec![GpuCell::default()],
            jobs: Vec::new(),
        }
    }

    fn run(name: &str, status: RunStatus, job: Option<(&str, &str, &[&str])>) -> RunInfo {
        RunInfo {
            id: format!("20261130-064100-{name}"),
            name: name.into(),
            status,
            pid: None,
            attempt: 0,
            restarts: 0,
            started_at: "2026-11-30T06:41:00Z".into(),
            ended_at: None,
            uptime_s: None,
            exit_code: None,
            signal_name: None,
            description: None,
            command: vec!["train".into()],
            cwd: "/".into(),
            gpus: "all".into(),
            adopted: false,
            dir: "/tmp".into(),
            energy: None,
            slurm: job.map(|(id, state, nodes)| SlurmJob {
                job_id: id.into(),
                attempt: 0,
                state: Some(state.into()),
                nodes: nodes.iter().map(|n| n.to_string()).collect(),
                partition: Some("gpu".into()),
            }),
        }
    }

    fn model() -> ClusterModel {
        ClusterModel {
            time_s: 10.0,
            nodes: vec![
                node("10.0.0.1:9400", Some("gpu-a.cluster.example")),
                node("10.0.0.2:9400", Some("gpu-b")),
                node("gpu-c:9400", None),
            ],
        }
    }

    fn jobs_of<'m>(m: &'m ClusterModel, name: &str) -> Vec<&'m str> {
        m.nodes
            .iter()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name} in {m:?}"))
            .jobs
            .iter()
            .map(|j| j.job_id.as_str())
            .collect()
    }

    #[test]
    fn host_names_match_on_the_first_label() {
        assert!(same_host("gpu-a", "gpu-a.cluster.example"));
        assert!(same_host("gpu-a.cluster.example", "gpu-a"));
        assert!(same_host("GPU-A", "gpu-a"));
        assert!(!same_host("gpu-a", "gpu-ab"));
        assert!(!same_host("gpu-a", "gpu-b.cluster.example"));
        assert!(!same_host("", "gpu-a"));
        assert_eq!(instance_host("10.0.0.1:9400"), "10.0.0.1");
        assert_eq!(instance_host("[fe80::1]:9400"), "fe80::1");
        assert_eq!(instance_host("gpu-c"), "gpu-c");
    }

    #[test]
    fn live_jobs_mark_their_nodes_and_missing_ones_get_rows() {
        let runs = vec![
            run(
                "llm",
                RunStatus::Running,
                Some(("4821", "RUNNING", &["gpu-a", "gpu-c", "gpu-z"])),
            ),
            // Ended run, pending job without nodes, job over for Slurm, no Slurm at all.
            run(
                "old",
                RunStatus::Succeeded,
                Some(("4000", "COMPLETED", &["gpu-b"])),
            ),
            run("queued", RunStatus::Running, Some(("4900", "PENDING", &[]))),
            run(
                "ending",
                RunStatus::Running,
                Some(("4822", "CANCELLED by 1000", &["gpu-b"])),
            ),
            run("local", RunStatus::Running, None),
        ];
        let m = mark(model(), &runs);
        assert_eq!(jobs_of(&m, "gpu-a.cluster.example"), ["4821"]);
        assert_eq!(jobs_of(&m, "gpu-c:9400"), ["4821"], "by the target's host");
        assert!(jobs_of(&m, "gpu-b").is_empty());
        let z = m.nodes.iter().find(|n| n.name == "gpu-z").expect("row");
        assert_eq!(z.state, NodeState::Missing);
        assert_eq!(z.instance, "slurm:gpu-z");
        assert!(z.gpus.is_empty());
        assert_eq!(z.jobs[0].label(), "llm #4821");
        assert_eq!(m.nodes.len(), 4);
        let names: Vec<&str> = m.nodes.iter().map(|n| n.name.as_str()).collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
        assert_eq!(m.totals().nodes_missing, 1);
    }

    #[test]
    fn two_jobs_share_a_node_and_a_missing_row() {
        let runs = vec![
            run(
                "a",
                RunStatus::Running,
                Some(("1", "RUNNING", &["gpu-b", "x"])),
            ),
            run(
                "b",
                RunStatus::Backoff,
                Some(("2", "RUNNING", &["gpu-b", "x"])),
            ),
        ];
        let m = mark(model(), &runs);
        assert_eq!(jobs_of(&m, "gpu-b"), ["1", "2"]);
        assert_eq!(jobs_of(&m, "x"), ["1", "2"]);
        assert_eq!(m.nodes.len(), 4);
        // No runs, no change.
        assert_eq!(mark(model(), &[]), model());
    }

    #[test]
    fn no_daemon_no_runs_and_none_started() {
        let home = tempfile::tempdir().unwrap();
        let paths = crate::config::Paths {
            config: home.path().join("config"),
            state: home.path().join("state"),
            runtime: home.path().join("run"),
        };
        let (tx, rx) = mpsc::channel();
        let p = paths.clone();
        std::thread::spawn(move || poll_runs(p, Duration::from_millis(10), tx));
        for _ in 0..3 {
            let runs = rx.recv_timeout(Duration::from_secs(5)).expect("a round");
            assert!(runs.is_empty());
        }
        drop(rx);
        assert!(!crate::ipc::socket_path(&paths).exists());
        assert!(!paths.runtime.exists() && !paths.state.exists());
    }

    #[test]
    fn ssh_host_is_the_host_name_or_the_target() {
        let m = model();
        assert_eq!(ssh_host(&m.nodes[0]), "gpu-a.cluster.example");
        assert_eq!(ssh_host(&m.nodes[2]), "gpu-c");
    }
}
