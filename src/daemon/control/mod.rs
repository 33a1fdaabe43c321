//! The daemon's control part: what it changes on the GPUs, and why. [`Control`] owns the
//! control handle (the same NVML or simulator object the daemon samples), the record of the
//! original settings, the caps runs' profiles set, the watch on limits changed outside
//! gpupilot, and the control loops; the daemon holds one.
//!
//! - `gpu_settings`: power caps, clock locks and the target temperature, asked by a person,
//!   through the control handle, with the originals recorded first.
//! - `loops`: the thermal governors, the node power budget, energy and alerts at every snapshot
//!   ([`crate::control::node::NodeControl`]), and the requests that steer them.
//! - `run_power`: a run's `[power] cap_w`, held while the run lives.
//! - `outside`: power limits changed outside gpupilot, told apart from gpupilot's own.
//!
//! # Locks
//!
//! In this order, each only after the ones before it: the loops, then the runs' caps, then
//! the originals (also the lock that makes changes one at a time), then the watch (taken
//! inside every setter, so with the originals held). The run table (the runs part's) is never
//! held with any of them: the loops read the live runs before they lock themselves and store
//! the runs' energy after; the runs' caps read the table alone first. No node event is recorded
//! while the runs' caps or the originals are held, except a request's own `gpu_changed`, which
//! is recorded as each GPU is changed (the node log's lock is the last of all).

pub(super) mod gpu_settings;
pub(super) mod loops;
pub(super) mod outside;
pub(super) mod run_power;

use std::sync::{Arc, Mutex, OnceLock};

use super::events::NodeLog;
use crate::config::Paths;
use crate::control::power::{GpuControl, Originals};
use crate::daemon::base::{DaemonError, io_err};
use loops::Loops;
use outside::{LimitWatch, Watched};
use run_power::RunCaps;

/// The daemon's GPU control. See the module doc.
pub struct Control {
    /// Set once at start, when the daemon has GPUs to control ([`Control::attach`]).
    handle: OnceLock<Controller>,
    /// The loops, made at the first snapshot that needs them (`control.toml` is read then).
    loops: Mutex<Option<Loops>>,
    /// `control.toml` in `paths.config`, the originals in `paths.state`.
    paths: Paths,
    /// A read-only daemon measures energy and raises alerts, but moves no cap.
    readonly: bool,
    /// The node's name, for alert hooks.
    node: String,
    /// The node's event log, shared with the daemon's other parts.
    events: Arc<NodeLog>,
}

/// The control handle and what goes with it.
struct Controller {
    dev: Arc<dyn GpuControl>,
    /// Also the lock that makes changes one at a time.
    originals: Mutex<Originals>,
    restore_on_exit: bool,
    /// The caps runs' profiles set (`run_power`).
    run_caps: Mutex<RunCaps>,
    /// The limits `dev` set, to tell changes made outside gpupilot (`outside`).
    watch: Arc<Mutex<LimitWatch>>,
}

impl Control {
    /// Nothing to control until [`Self::attach`]; the loops are made at the first snapshot.
    pub fn new(paths: Paths, readonly: bool, node: String, events: Arc<NodeLog>) -> Control {
        Control {
            handle: OnceLock::new(),
            loops: Mutex::new(None),
            paths,
            readonly,
            node,
            events,
        }
    }

    /// Give the daemon GPUs to control; `restore_on_exit`: restore the recorded originals
    /// when it stops. Reads the record a previous daemon left.
    pub fn attach(
        &self,
        dev: Arc<dyn GpuControl>,
        restore_on_exit: bool,
    ) -> Result<(), DaemonError> {
        let path = Originals::path_in(&self.paths.state);
        let originals =
            Originals::load(path.clone()).map_err(io_err(format!("reading {}", path.display())))?;
        // Every setter goes through the watch, so what it did not set was set by another.
        let watch = Arc::new(Mutex::new(LimitWatch::default()));
        let dev: Arc<dyn GpuControl> = Arc::new(Watched {
            inner: dev,
            watch: Arc::clone(&watch),
        });
        let _ = self.handle.set(Controller {
            dev,
            originals: Mutex::new(originals),
            restore_on_exit,
            run_caps: Mutex::default(),
            watch,
        });
        Ok(())
    }

    /// The control handle, for the control loops (`loops`).
    fn gpu_control(&self) -> Option<Arc<dyn GpuControl>> {
        self.handle.get().map(|c| Arc::clone(&c.dev))
    }

    /// The control handle, the record of originals and the runs' caps, for `run_power` and the
    /// loops. Lock order: the loops, then the runs' caps, then the originals.
    #[allow(clippy::type_complexity)]
    fn control_parts(&self) -> Option<(&Arc<dyn GpuControl>, &Mutex<Originals>, &Mutex<RunCaps>)> {
        self.handle
            .get()
            .map(|c| (&c.dev, &c.originals, &c.run_caps))
    }

    /// The watch on the GPUs' limits and the record of originals, for `outside`.
    /// Lock order: the originals, then the watch (a setter called with the originals held).
    fn limit_watch(&self) -> Option<(&Mutex<LimitWatch>, &Mutex<Originals>)> {
        self.handle.get().map(|c| (c.watch.as_ref(), &c.originals))
    }
}
