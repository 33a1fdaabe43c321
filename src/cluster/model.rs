//! The cluster model: Prometheus query results turned into nodes × GPUs, with each node's
//! state, and the totals. Pure: no I/O, no clock (the time is an argument).
//!
//! A node is a scrape target (`instance`): one gpupilot daemon or one dcgm-exporter. Its name
//! is the host label its series carry — `Hostname` (dcgm-exporter up to 3.x, gpupilot by
//! default) or `hostname` (dcgm-exporter 4.x), so mixed fleets keep their names — or the
//! instance when they carry none (or when two targets report the same host name,
//! `host@instance`). A GPU is a `gpu` label within it; its model is `modelName`, or the
//! `model_name` that gpupilot exported before.

use std::collections::BTreeMap;

use serde::Serialize;

use super::GridMetric;
use super::query::Series;

/// A node whose newest scrape is older than this is stale (seconds).
pub const STALE_AFTER_S: f64 = 30.0;
/// A GPU at or above this utilization is busy (percent).
pub const BUSY_UTIL_PCT: f64 = 10.0;

/// dcgm-exporter's names of the fields the model reads.
pub mod names {
    pub const UTIL: &str = "DCGM_FI_DEV_GPU_UTIL";
    pub const FB_USED: &str = "DCGM_FI_DEV_FB_USED";
    pub const FB_FREE: &str = "DCGM_FI_DEV_FB_FREE";
    pub const TEMP: &str = "DCGM_FI_DEV_GPU_TEMP";
    pub const POWER: &str = "DCGM_FI_DEV_POWER_USAGE";
    pub const POWER_LIMIT: &str = "DCGM_FI_DEV_POWER_MGMT_LIMIT";
    pub const ENERGY: &str = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION";
    pub const SM_CLOCK: &str = "DCGM_FI_DEV_SM_CLOCK";
    pub const STALE: &str = "gpupilot_gpu_stale";
    pub const LOST: &str = "gpupilot_gpu_lost";
    /// Every name above.
    pub const ALL: &[&str] = &[
        UTIL,
        FB_USED,
        FB_FREE,
        TEMP,
        POWER,
        POWER_LIMIT,
        ENERGY,
        SM_CLOCK,
        STALE,
        LOST,
    ];
}

/// The PromQL that fetches every field the model reads, in one query.
pub fn fields_query() -> String {
    format!("{{__name__=~\"{}\"}}", names::ALL.join("|"))
}

/// One GPU as Prometheus last saw it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GpuCell {
    pub index: u32,
    pub uuid: Option<String>,
    pub model: Option<String>,
    pub util_pct: Option<f64>,
    pub mem_used_mib: Option<f64>,
    pub mem_total_mib: Option<f64>,
    pub temp_c: Option<f64>,
    pub power_w: Option<f64>,
    pub power_limit_w: Option<f64>,
    pub energy_mj: Option<f64>,
    pub sm_clock_mhz: Option<f64>,
    /// The exporter says it has no fresh reading (gpupilot only).
    pub stale: bool,
    /// The GPU fell off the bus (gpupilot only).
    pub lost: bool,
}

impl GpuCell {
    /// The value the grid shows for `metric`.
    pub fn value(&self, metric: GridMetric) -> Option<f64> {
        match metric {
            GridMetric::Util => self.util_pct,
            GridMetric::Power => self.power_w,
            GridMetric::Temp => self.temp_c,
            GridMetric::Mem => self.mem_pct(),
        }
    }

    /// Memory used, percent of total.
    pub fn mem_pct(&self) -> Option<f64> {
        match (self.mem_used_mib, self.mem_total_mib) {
            (Some(u), Some(t)) if t > 0.0 => Some(100.0 * u / t),
            _ => None,
        }
    }

    /// Where the value sits between cool (0) and hot (1), for the colour.
    pub fn heat(&self, metric: GridMetric) -> Option<f64> {
        let v = self.value(metric)?;
        let x = match metric {
            GridMetric::Util | GridMetric::Mem => v / 100.0,
            GridMetric::Power => v / self.power_limit_w.filter(|l| *l > 0.0).unwrap_or(700.0),
            GridMetric::Temp => (v - 30.0) / 55.0,
        };
        Some(x.clamp(0.0, 1.0))
    }

    pub fn busy(&self) -> bool {
        self.util_pct.is_some_and(|u| u >= BUSY_UTIL_PCT)
    }
}

/// How a node answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    /// Scraped recently and up.
    Up,
    /// Prometheus reaches the target but its newest scrape is old.
    Stale,
    /// Prometheus's last scrape failed (`up` = 0).
    Down,
    /// Seen before, absent from Prometheus's answer now.
    Missing,
}

impl NodeState {
    pub fn word(self) -> &'static str {
        match self {
            NodeState::Up => "up",
            NodeState::Stale => "stale",
            NodeState::Down => "down",
            NodeState::Missing => "missing",
        }
    }
}

/// One node (scrape target).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Node {
    /// The scrape target (`instance`), the node's identity.
    pub instance: String,
    /// What the view shows.
    pub name: String,
    pub hostname: Option<String>,
    pub job: Option<String>,
    pub state: NodeState,
    /// When Prometheus last scraped it (Unix seconds).
    pub last_scrape_s: Option<f64>,
    pub gpus: Vec<GpuCell>,
    /// Live Slurm jobs of the local daemon's runs on this node ([`super::jobs::mark`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub jobs: Vec<super::jobs::JobMark>,
}

impl Node {
    pub fn power_w(&self) -> Option<f64> {
        sum(self.gpus.iter().map(|g| g.power_w))
    }

    /// Mean of the metric over the node's GPUs that have it.
    pub fn mean(&self, metric: GridMetric) -> Option<f64> {
        let v: Vec<f64> = self.gpus.iter().filter_map(|g| g.value(metric)).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    }
}

fn sum(it: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    it.flatten()
        .fold(None, |acc, v| Some(acc.unwrap_or(0.0) + v))
}

/// Cluster-wide figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Totals {
    pub nodes: usize,
    pub nodes_up: usize,
    pub nodes_stale: usize,
    pub nodes_down: usize,
    pub nodes_missing: usize,
    pub gpus: usize,
    pub gpus_busy: usize,
    pub gpus_idle: usize,
    pub power_w: f64,
    /// Sum of the GPUs' energy counters (since each driver loaded), kWh.
    pub energy_kwh: f64,
}

/// Every node, by instance.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ClusterModel {
    /// When the answers were read (Unix seconds).
    pub time_s: f64,
    pub nodes: Vec<Node>,
}

/// What one round of queries returned.
pub struct Answers<'a> {
    /// [`fields_query`].
    pub fields: &'a [Series],
    /// `up`.
    pub up: &'a [Series],
    /// `timestamp(up)`.
    pub scraped: &'a [Series],
}

impl ClusterModel {
    /// Build the model from one round of answers at `now_s`; nodes of `previous` that are no
    /// longer in the answers stay, marked missing, with their last values.
    pub fn build(answers: &Answers<'_>, now_s: f64, previous: Option<&ClusterModel>) -> Self {
        let mut nodes: BTreeMap<String, Node> = BTreeMap::new();
        let new_node = |instance: &str| Node {
            instance: instance.to_string(),
            name: instance.to_string(),
            hostname: None,
            job: None,
            state: NodeState::Up,
            last_scrape_s: None,
            gpus: Vec::new(),
            jobs: Vec::new(),
        };
        for s in answers.fields {
            let Some(instance) = s.label("instance") else {
                continue;
            };
            let Some(gpu) = s.label("gpu").and_then(|g| g.parse::<u32>().ok()) else {
                continue;
            };
            let node = nodes
                .entry(instance.to_string())
                .or_insert_with(|| new_node(instance));
            if node.hostname.is_none() {
                node.hostname = s
                    .label("Hostname")
                    .or_else(|| s.label("hostname"))
                    .filter(|h| !h.is_empty())
                    .map(str::to_string);
            }
            if node.job.is_none() {
                node.job = s.label("job").map(str::to_string);
            }
            let cell = match node.gpus.iter().position(|g| g.index == gpu) {
                Some(i) => &mut node.gpus[i],
                None => {
                    node.gpus.push(GpuCell {
                        index: gpu,
                        ..Default::default()
                    });
                    node.gpus.last_mut().expect("pushed")
                }
            };
            if cell.uuid.is_none() {
                cell.uuid = s
                    .label("UUID")
                    .filter(|u| !u.is_empty())
                    .map(str::to_string);
            }
            if cell.model.is_none() {
                cell.model = s
                    .label("modelName")
                    .or_else(|| s.label("model_name"))
                    .filter(|m| !m.is_empty())
                    .map(str::to_string);
            }
            let v = Some(s.v);
            match s.label("__name__").unwrap_or_default() {
                names::UTIL => cell.util_pct = v,
                names::FB_USED => cell.mem_used_mib = v,
                // dcgm-exporter has no total: used + free.
                names::FB_FREE => cell.mem_total_mib = v,
                names::TEMP => cell.temp_c = v,
                names::POWER => cell.power_w = v,
                names::POWER_LIMIT => cell.power_limit_w = v,
                names::ENERGY => cell.energy_mj = v,
                names::SM_CLOCK => cell.sm_clock_mhz = v,
                names::STALE => cell.stale = s.v != 0.0,
                names::LOST => cell.lost = s.v != 0.0,
                _ => {}
            }
        }
        for node in nodes.values_mut() {
            node.gpus.sort_by_key(|g| g.index);
            for g in &mut node.gpus {
                // FB_FREE was parked in mem_total: used + free is the total.
                g.mem_total_mib = match (g.mem_used_mib, g.mem_total_mib) {
                    (Some(u), Some(f)) => Some(u + f),
                    _ => None,
                };
            }
        }
        // Targets: `up` says whether the last scrape worked, `timestamp(up)` when it was.
        let mut up: BTreeMap<&str, (f64, Option<&Series>)> = BTreeMap::new();
        for s in answers.up {
            if let Some(i) = s.label("instance") {
                up.entry(i).or_insert((s.v, None)).0 = s.v;
            }
        }
        for s in answers.scraped {
            if let Some(i) = s.label("instance") {
                up.entry(i).or_insert((1.0, None)).1 = Some(s);
            }
        }
        for (instance, (value, scraped)) in &up {
            // Targets without GPU series are handled below.
            let Some(node) = nodes.get_mut(*instance) else {
                continue;
            };
            node.last_scrape_s = scraped.map(|s| s.v);
            node.state = if *value == 0.0 {
                NodeState::Down
            } else if scraped.is_some_and(|s| now_s - s.v > STALE_AFTER_S) {
                NodeState::Stale
            } else {
                NodeState::Up
            };
        }
        // A GPU target that is down has no GPU series (Prometheus marks them stale at once):
        // it comes back from `previous`, or from `up` alone when its job has GPU nodes.
        let gpu_jobs: std::collections::BTreeSet<String> =
            nodes.values().filter_map(|n| n.job.clone()).collect();
        let known_before =
            |i: &str| previous.is_some_and(|p| p.nodes.iter().any(|n| n.instance == i));
        for (instance, (value, scraped)) in &up {
            if nodes.contains_key(*instance) || *value != 0.0 {
                continue;
            }
            let job = answers
                .up
                .iter()
                .find(|s| s.label("instance") == Some(instance))
                .and_then(|s| s.label("job"));
            if !known_before(instance) && !job.is_some_and(|j| gpu_jobs.contains(j)) {
                continue;
            }
            let mut node = previous
                .and_then(|p| p.nodes.iter().find(|n| n.instance == *instance).cloned())
                .unwrap_or_else(|| new_node(instance));
            node.state = NodeState::Down;
            node.last_scrape_s = scraped.map(|s| s.v).or(node.last_scrape_s);
            node.job = node.job.or(job.map(str::to_string));
            nodes.insert(instance.to_string(), node);
        }
        if let Some(prev) = previous {
            for n in &prev.nodes {
                if !nodes.contains_key(&n.instance) {
                    let mut n = n.clone();
                    n.state = NodeState::Missing;
                    nodes.insert(n.instance.clone(), n);
                }
            }
        }
        // Names: the host name, unless two targets share it.
        let mut count: BTreeMap<String, usize> = BTreeMap::new();
        for n in nodes.values() {
            if let Some(h) = &n.hostname {
                *count.entry(h.clone()).or_default() += 1;
            }
        }
        for n in nodes.values_mut() {
            n.name = match &n.hostname {
                Some(h) if count[h] == 1 => h.clone(),
                Some(h) => format!("{h}@{}", n.instance),
                None => n.instance.clone(),
            };
        }
        let mut nodes: Vec<Node> = nodes.into_values().collect();
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        ClusterModel {
            time_s: now_s,
            nodes,
        }
    }

    pub fn totals(&self) -> Totals {
        let mut t = Totals {
            nodes: self.nodes.len(),
            ..Default::default()
        };
        for n in &self.nodes {
            match n.state {
                NodeState::Up => t.nodes_up += 1,
                NodeState::Stale => t.nodes_stale += 1,
                NodeState::Down => t.nodes_down += 1,
                NodeState::Missing => t.nodes_missing += 1,
            }
            // Values of a node that does not answer are not current: not in the sums.
            if n.state != NodeState::Up {
                continue;
            }
            for g in &n.gpus {
                t.gpus += 1;
                if g.busy() {
                    t.gpus_busy += 1;
                } else if g.util_pct.is_some() {
                    t.gpus_idle += 1;
                }
                t.power_w += g.power_w.unwrap_or(0.0);
                t.energy_kwh += g.energy_mj.unwrap_or(0.0) / 3.6e9;
            }
        }
        t
    }
}

#[cfg(test)]
mod tests;
