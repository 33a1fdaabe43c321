//! What `bench burn` and `bench power-sweep` share: choosing the load (CUDA, or gpusim's with
//! `--source sim`), opening the node through the daemon, and checking the two agree. A choice
//! that cannot run is a [`Usage`] error: one line, exit status 2.

use std::process::ExitCode;

use crate::cli::{GlobalArgs, SourceKind};
use crate::client::bench::DaemonBench;
use crate::config::Paths;
use crate::control::bench::cuda::CudaLoads;
use crate::control::bench::sim::SimLoads;
use crate::control::bench::{Loads, Refused};
use crate::cuda::Availability;

/// A benchmark that cannot run as asked: its line, and exit status 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Usage(pub String);

/// `result`, with a [`Usage`] error or a [`Refused`] request printed as one line and turned into
/// exit status 2.
pub fn exit_2_on_usage(result: anyhow::Result<ExitCode>) -> anyhow::Result<ExitCode> {
    match result {
        Err(e) if e.is::<Usage>() => {
            crate::commands::err_line(&e.to_string());
            Ok(ExitCode::from(2))
        }
        Err(e) if e.is::<Refused>() => {
            crate::commands::err_line(&format!("gpupilot: {e}"));
            Ok(ExitCode::from(2))
        }
        other => other,
    }
}

/// The load and the node for `command` (`burn`, `power-sweep`).
pub fn open(g: &GlobalArgs, command: &str) -> anyhow::Result<(Box<dyn Loads>, DaemonBench, Paths)> {
    let simulated = g.source == SourceKind::Sim;
    let loads: Box<dyn Loads> = if simulated {
        Box::new(SimLoads)
    } else {
        real_loads(command)?
    };
    let paths = Paths::from_env();
    let node = DaemonBench::open(super::super::connect_or_spawn(g, &paths)?)?;
    match (simulated, node.source() == "sim") {
        (true, false) => {
            return Err(Usage(format!(
                "gpupilot bench {command}: --source sim needs a daemon on the simulator, and the \
                 one answering reads `{}`: stop it (or use another GPUPILOT_HOME) and run again",
                node.source()
            ))
            .into());
        }
        (false, true) => {
            return Err(Usage(format!(
                "gpupilot bench {command}: the daemon answering runs on the simulator: a load on \
                 real GPUs would not be what it reports; add --source sim for a simulated \
                 {command}, or stop that daemon"
            ))
            .into());
        }
        _ => {}
    }
    Ok((loads, node, paths))
}

/// A load on the real GPUs through CUDA, or the line that says why there is none.
fn real_loads(command: &str) -> anyhow::Result<Box<dyn Loads>> {
    match crate::cuda::availability() {
        Availability::Present { .. } => Ok(Box::new(CudaLoads)),
        Availability::Missing { what } => Err(Usage(format!(
            "gpupilot bench {command}: no CUDA: {what}. `gpupilot --source sim bench {command}` \
             runs the same {command} on the simulator"
        ))
        .into()),
    }
}
