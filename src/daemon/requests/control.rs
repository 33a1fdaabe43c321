//! The GPU settings and the control loops: `power` (the settings as they are), `power_cap`,
//! `power_reset`, `clocks_lock`, `clocks_reset`, `gpu_max_temp`, `gpu_max_temp_reset`
//! (through the control handle, originals recorded first: `super::super::control`), `thermal`,
//! `thermal_set`, `thermal_off` and `power_budget` (the thermal governor and the node budget).

use super::{Class, Sender, not_of};
use crate::daemon::auth::Access;
use crate::daemon::base::RequestError;
use crate::daemon::state::Daemon;
use crate::ipc::Peer;
use crate::protocol::{Request, Response};

pub(super) fn class(request: &Request) -> Option<Class> {
    use Access::{GpuSettings, Watch};
    let (access, changes) = match request {
        Request::Power {} | Request::Thermal {} => (Watch, false),
        Request::PowerCap { .. }
        | Request::PowerReset { .. }
        | Request::ClocksLock { .. }
        | Request::ClocksReset { .. }
        | Request::GpuMaxTemp { .. }
        | Request::GpuMaxTempReset { .. }
        | Request::ThermalSet { .. }
        | Request::ThermalOff { .. }
        | Request::PowerBudget { .. } => (GpuSettings, true),
        _ => return None,
    };
    Some(Class::new(Sender::Client, access, changes))
}

pub(super) fn answer(
    daemon: &Daemon,
    peer: &Peer,
    request: Request,
) -> Result<Response, RequestError> {
    let control = &daemon.control;
    let telemetry = &daemon.telemetry;
    // Who asked, for the records: only a change needs it (a name from /etc/passwd and the
    // process's from /proc), not the console's polls of `power` and `thermal`.
    let by = || peer.describe();
    match request {
        Request::Power {} => control.power_settings(),
        Request::PowerCap { gpus, watts, why } => control.power_cap(&by(), &gpus, watts, why),
        Request::PowerReset { gpus, why } => control.power_reset(&by(), &gpus, why),
        Request::ClocksLock {
            gpus,
            min_mhz,
            max_mhz,
            why,
        } => control.clocks_lock(&by(), &gpus, min_mhz, max_mhz, why),
        Request::ClocksReset { gpus, why } => control.clocks_reset(&by(), &gpus, why),
        Request::GpuMaxTemp { gpus, celsius, why } => control.gpu_max(&by(), &gpus, celsius, why),
        Request::GpuMaxTempReset { gpus, why } => control.gpu_max_reset(&by(), &gpus, why),
        Request::Thermal {} => Ok(control.loops_answer()),
        Request::ThermalSet {
            gpus,
            target_c,
            margin_c,
            why,
        } => control.thermal_set(&by(), &gpus, target_c, margin_c, why, telemetry),
        Request::ThermalOff { gpus, why } => control.thermal_off(&by(), &gpus, why, telemetry),
        Request::PowerBudget { budget_w, why } => control.power_budget(&by(), budget_w, why),
        other => Err(not_of("control", &other)),
    }
}
