//! The process's view of the shared node: the scenario, an in-memory gpusim node kept at
//! "now", and the protocol that keeps it equal to every other process's.
//!
//! Time: wall-clock time since the node's epoch, cut to whole simulation steps. Every process
//! advances its own copy of the node step by step from the last shared snapshot; gpusim is
//! deterministic, so all copies agree without talking. A setter takes the file's exclusive
//! lock, reloads the latest snapshot, advances it to now, applies the change, writes it back
//! and bumps the generation; the others see the bump on their next call and reload.

use std::io;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use gpusim::{Gpu, GpuReading, Node, Training};

use crate::ffi::{NVML_ERROR_UNKNOWN, nvmlReturn_t};
use crate::identity::Identity;
use crate::scenario::{DEFAULT_PID_BASE, ProcessKind, Scenario, ScenarioError};
use crate::setlog::SetLog;
use crate::store::{GpuExtra, Snapshot, Store};

/// Environment variable naming the scenario file.
pub const ENV_SCENARIO: &str = "FAKE_NVML_SCENARIO";
/// Environment variable naming the shared state file.
pub const ENV_STATE: &str = "FAKE_NVML_STATE";
/// Environment variable naming the setter log (JSON lines).
pub const ENV_LOG: &str = "FAKE_NVML_LOG";

/// Simulated seconds a process may run ahead of the last snapshot before it writes a
/// checkpoint, so that a process started later has little to catch up.
const CHECKPOINT_AFTER_S: f64 = 300.0;

/// A process running on a simulated GPU, as the process-list calls report it.
#[derive(Debug, Clone, PartialEq)]
pub struct Proc {
    pub pid: u32,
    pub used_bytes: u64,
    pub kind: ProcessKind,
}

/// Why the library could not start.
#[derive(Debug)]
pub enum InitError {
    Scenario(ScenarioError),
    Sim(gpusim::SimError),
}

impl std::fmt::Display for InitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InitError::Scenario(e) => write!(f, "bad scenario {e}"),
            InitError::Sim(e) => write!(f, "cannot build the simulated node: {e}"),
        }
    }
}

/// Everything the exported functions read and change, behind one mutex in `exports`.
pub struct Context {
    pub scenario: Scenario,
    pub identities: Vec<Identity>,
    store: Option<Store>,
    node: Node,
    extras: Vec<GpuExtra>,
    epoch_unix_ns: u64,
    step_ns: u64,
    /// The step `node` is at.
    step: u64,
    /// The step of the snapshot `node` was loaded from (or checkpointed at).
    snapshot_step: u64,
    generation: u64,
    /// `reading()` of each GPU at `step`, filled on first use.
    readings: Vec<Option<GpuReading>>,
    warned_foreign: bool,
    pub log: Option<SetLog>,
}

fn now_unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The step the node is at, `now_ns` being wall-clock time. The node starts one step in, so
/// that even the first call reads a computed state (gpusim fills its outputs in `step`).
fn step_at(now_ns: u64, epoch_ns: u64, step_ns: u64) -> u64 {
    now_ns.saturating_sub(epoch_ns) / step_ns + 1
}

/// Where the node lives when `FAKE_NVML_STATE` is unset: per user, per scenario path.
pub fn default_state_path(scenario: Option<&std::path::Path>) -> PathBuf {
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let dir = std::env::temp_dir().join(format!("fake-nvml-{uid}"));
    match scenario {
        None => dir.join("builtin.state"),
        Some(p) => {
            let abs = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
            let hash = crate::scenario::fnv1a(abs.as_os_str().as_encoded_bytes());
            dir.join(format!("{hash:016x}.state"))
        }
    }
}

/// [`fresh_node`] for the scenario module's tests.
#[cfg(test)]
pub(crate) fn fresh_node_for_tests(
    s: &Scenario,
) -> Result<(Node, Vec<GpuExtra>), gpusim::SimError> {
    fresh_node(s)
}

/// Builds a node as the scenario starts it.
fn fresh_node(s: &Scenario) -> Result<(Node, Vec<GpuExtra>), gpusim::SimError> {
    let mut node = Node::new(&s.node)?;
    for i in 0..node.gpus().len() {
        let gpu = node.gpu_mut(i).ok_or(gpusim::SimError::NoSuchGpu(i))?;
        // Node::new gave every GPU the node-wide load; replace it only where the scenario differs.
        let wanted = s.training.get(i).cloned().flatten();
        if wanted != s.node.training {
            gpu.set_training(wanted.map(Training::new).transpose()?);
        }
        if let Some(w) = s.power_limit_w.get(i).copied().flatten() {
            gpu.set_power_limit_w(w)?;
        }
        if let Some((curve, noise)) = s.measured.get(i).cloned().flatten() {
            gpu.set_measured(Some(curve), noise)?;
        }
        if let Some(on) = s.persistence.get(i).copied().flatten() {
            gpu.set_persistence(on);
        }
    }
    for f in &s.cooling {
        node.add_cooling_fault(f.clone())?;
    }
    node.set_activity(s.activity.clone())?;
    let extras = vec![GpuExtra::default(); node.gpus().len()];
    Ok((node, extras))
}

impl Context {
    /// Loads the scenario from the environment and joins (or creates) the shared node.
    pub fn from_env() -> Result<Context, InitError> {
        let scenario_path = std::env::var_os(ENV_SCENARIO)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
        let scenario = match &scenario_path {
            Some(p) => Scenario::load(p).map_err(InitError::Scenario)?,
            None => Scenario::builtin(),
        };
        let state_path = std::env::var_os(ENV_STATE)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| default_state_path(scenario_path.as_deref()));
        let log = std::env::var_os(ENV_LOG)
            .filter(|v| !v.is_empty())
            .map(|p| SetLog::new(PathBuf::from(p)));
        Context::new(scenario, Some(state_path), log)
    }

    /// A context for `scenario`, sharing its node through `state` (`None`: private to this
    /// process).
    pub fn new(
        scenario: Scenario,
        state: Option<PathBuf>,
        log: Option<SetLog>,
    ) -> Result<Context, InitError> {
        // Validate before touching any shared file.
        let (node, extras) = fresh_node(&scenario).map_err(InitError::Sim)?;
        let step_ns = ((scenario.node.step_s * 1e9).round() as u64).max(1);
        let fresh = |node: Node, extras: Vec<GpuExtra>| Snapshot {
            scenario_hash: scenario.hash,
            epoch_unix_ns: now_unix_ns(),
            step: 0,
            node,
            extras,
        };
        let (store, snap, generation) = match state {
            None => (None, fresh(node, extras), 0),
            Some(path) => {
                let (n2, e2) = (node.clone(), extras.clone());
                match Store::open(&path, scenario.hash, || fresh(n2, e2)) {
                    Ok((store, snap, generation)) => (Some(store), snap, generation),
                    Err(e) => {
                        eprintln!(
                            "fake-nvml: cannot share the node through {}: {e}; this process simulates it alone",
                            path.display()
                        );
                        (None, fresh(node, extras), 0)
                    }
                }
            }
        };
        let identities = scenario
            .node
            .gpus
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let spec = gpusim::find(id)
                    .ok_or_else(|| InitError::Sim(gpusim::SimError::UnknownGpu(id.clone())))?;
                Ok(Identity::new(scenario.node.seed, i, spec))
            })
            .collect::<Result<Vec<_>, InitError>>()?;
        let n = snap.node.gpus().len();
        let mut ctx = Context {
            scenario,
            identities,
            store,
            epoch_unix_ns: snap.epoch_unix_ns,
            step_ns,
            step: snap.step,
            snapshot_step: snap.step,
            node: snap.node,
            extras: snap.extras,
            generation,
            readings: vec![None; n],
            warned_foreign: false,
            log,
        };
        ctx.sync();
        Ok(ctx)
    }

    pub fn gpu_count(&self) -> usize {
        self.node.gpus().len()
    }

    /// The step wall-clock time has reached.
    fn now_step(&self) -> u64 {
        step_at(now_unix_ns(), self.epoch_unix_ns, self.step_ns)
    }

    fn step_time_s(&self, step: u64) -> f64 {
        // Half a step past the target so float error in gpusim's accumulated time can never
        // drop or add a step; every process computes the same target.
        (step as f64 + 0.5) * self.scenario.node.step_s
    }

    fn load(&mut self, snap: Snapshot, generation: u64) {
        self.epoch_unix_ns = snap.epoch_unix_ns;
        self.step = snap.step;
        self.snapshot_step = snap.step;
        self.node = snap.node;
        self.extras = snap.extras;
        self.generation = generation;
        self.readings.iter_mut().for_each(|r| *r = None);
    }

    /// Brings the node to now: reloads it if another process changed it, then advances it.
    /// Cheap when nothing happened: one atomic load and one clock read.
    pub fn sync(&mut self) {
        if let Some(store) = &self.store {
            if store.generation() != self.generation {
                match store.read() {
                    Ok((snap, generation)) if snap.scenario_hash == self.scenario.hash => {
                        self.load(snap, generation)
                    }
                    Ok((_, generation)) => {
                        if !self.warned_foreign {
                            eprintln!(
                                "fake-nvml: {} now holds a node of another scenario; this process keeps its own",
                                store.path().display()
                            );
                            self.warned_foreign = true;
                        }
                        self.generation = generation;
                    }
                    Err(e) => {
                        eprintln!("fake-nvml: cannot reload {}: {e}", store.path().display());
                        self.generation = store.generation();
                    }
                }
            }
        }
        let now = self.now_step();
        if now > self.step {
            self.node.advance_to(self.step_time_s(now));
            self.step = now;
            self.readings.iter_mut().for_each(|r| *r = None);
            self.maybe_checkpoint();
        }
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot {
            scenario_hash: self.scenario.hash,
            epoch_unix_ns: self.epoch_unix_ns,
            step: self.step,
            node: self.node.clone(),
            extras: self.extras.clone(),
        }
    }

    fn maybe_checkpoint(&mut self) {
        let behind_s = (self.step - self.snapshot_step) as f64 * self.scenario.node.step_s;
        if behind_s < CHECKPOINT_AFTER_S {
            return;
        }
        let Some(store) = &self.store else {
            self.snapshot_step = self.step;
            return;
        };
        // Never wait for a writer here: this is an optimisation, not a change.
        if let Some(lock) = store.try_lock() {
            if lock.generation() == self.generation && lock.checkpoint(&self.snapshot()).is_ok() {
                self.snapshot_step = self.step;
            }
        }
    }

    /// Simulated seconds since the node started.
    pub fn sim_time_s(&self) -> f64 {
        self.step as f64 * self.scenario.node.step_s
    }

    /// Wall-clock time of the current step, microseconds since the Unix epoch (what NVML puts
    /// in a field value's `timestamp`).
    pub fn step_unix_us(&self) -> i64 {
        ((self.epoch_unix_ns + self.step * self.step_ns) / 1000) as i64
    }

    /// The simulated node at the current step.
    pub fn node(&self) -> &Node {
        &self.node
    }

    pub fn gpu(&self, i: usize) -> &Gpu {
        &self.node.gpus()[i]
    }

    pub fn extra(&self, i: usize) -> &GpuExtra {
        &self.extras[i]
    }

    /// The GPU's reading at the current step (computed once per step).
    pub fn reading(&mut self, i: usize) -> &GpuReading {
        let gpu = &self.node.gpus()[i];
        self.readings[i].get_or_insert_with(|| gpu.reading())
    }

    /// Applies a change to the shared node: lock, reload, advance, apply, publish. `apply`
    /// returning an error leaves the node as it was.
    pub fn update<R>(
        &mut self,
        apply: impl FnOnce(&mut Node, &mut Vec<GpuExtra>) -> Result<R, nvmlReturn_t>,
    ) -> Result<R, nvmlReturn_t> {
        let Some(store) = &self.store else {
            self.sync();
            let r = apply(&mut self.node, &mut self.extras)?;
            self.readings.iter_mut().for_each(|r| *r = None);
            return Ok(r);
        };
        let lock = store.lock().map_err(io_error)?;
        let (mut snap, generation) = lock.read().map_err(io_error)?;
        if snap.scenario_hash != self.scenario.hash {
            // The file was taken over by another scenario; stay private from now on.
            drop(lock);
            self.store = None;
            return self.update(apply);
        }
        let now = step_at(now_unix_ns(), snap.epoch_unix_ns, self.step_ns);
        if now > snap.step {
            snap.node.advance_to(self.step_time_s(now));
            snap.step = now;
        }
        let result = apply(&mut snap.node, &mut snap.extras);
        let generation = match &result {
            Ok(_) => lock.publish(&snap).map_err(io_error)?,
            Err(_) => generation,
        };
        drop(lock);
        self.load(snap, generation);
        result
    }

    /// Processes on GPU `i`: the scenario's, or one compute process per GPU that trains.
    pub fn processes(&mut self, i: usize) -> Vec<Proc> {
        let used = self.reading(i).memory_used_bytes;
        match &self.scenario.processes {
            Some(list) => {
                let here: Vec<_> = list.iter().filter(|p| p.gpu == i).collect();
                let share = used / (here.len().max(1) as u64);
                here.iter()
                    .map(|p| Proc {
                        pid: p.pid,
                        used_bytes: p.used_memory_bytes.unwrap_or(share),
                        kind: p.kind,
                    })
                    .collect()
            }
            None => {
                let busy = self.gpu(i).training().is_some_and(|t| !t.oom);
                if busy {
                    vec![Proc {
                        pid: DEFAULT_PID_BASE + i as u32,
                        used_bytes: used,
                        kind: ProcessKind::Compute,
                    }]
                } else {
                    Vec::new()
                }
            }
        }
    }

    /// The name `nvmlSystemGetProcessName` gives `pid`, if it is one of ours.
    pub fn process_name(&self, pid: u32) -> Option<String> {
        match &self.scenario.processes {
            Some(list) => list.iter().find(|p| p.pid == pid).map(|p| p.name.clone()),
            None => {
                let i = pid.checked_sub(DEFAULT_PID_BASE)? as usize;
                (i < self.gpu_count()).then(|| "python3".to_string())
            }
        }
    }
}

fn io_error(e: io::Error) -> nvmlReturn_t {
    eprintln!("fake-nvml: shared state: {e}");
    NVML_ERROR_UNKNOWN
}
