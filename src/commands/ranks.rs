//! `gpupilot ranks` (hidden): the process of a `launcher = "ranks"` run, N local ranks of a
//! command with torchrun's environment. The work is [`crate::supervisor::ranks`]; this turns
//! the arguments and this process's environment into its configuration.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;

use crate::cli::RanksArgs;
use crate::supervisor::ranks::{self, RanksConfig};

/// Start the ranks and exit as they did: 0, or the first failed rank's code.
pub fn ranks(args: &RanksArgs) -> anyhow::Result<ExitCode> {
    let config = RanksConfig {
        nproc: args.nproc,
        master_addr: args.master_addr.clone(),
        master_port: (args.master_port != 0).then_some(args.master_port),
        grace: Duration::from_secs_f64(args.grace),
        command: args.command.clone(),
        run_id: std::env::var("GPUPILOT_RUN_ID")
            .ok()
            .filter(|id| !id.is_empty()),
        one_omp_thread: std::env::var_os("OMP_NUM_THREADS").is_none(),
    };
    let code = ranks::run(&config).with_context(|| {
        format!(
            "starting {} rank{} of `{}`",
            args.nproc,
            if args.nproc == 1 { "" } else { "s" },
            shell_words::join(&args.command)
        )
    })?;
    Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
}
