//! The daemon's control of the GPUs: the requests that change GPU settings, the control loops
//! run at every snapshot, the caps runs' profiles set, and limits changed outside gpupilot.
//!
//! - `gpu_settings`: power caps, clock locks and the target temperature, asked by a person,
//!   through the control handle, with the originals recorded first.
//! - `loops`: the thermal governors, the node power budget, energy and alerts at every snapshot
//!   ([`crate::control::node::NodeControl`]), and the requests that steer them.
//! - `run_power`: a run's `[power] cap_w`, held while the run lives.
//! - `outside`: power limits changed outside gpupilot, told apart from gpupilot's own.

pub(super) mod gpu_settings;
pub(super) mod loops;
pub(super) mod outside;
pub(super) mod run_power;
