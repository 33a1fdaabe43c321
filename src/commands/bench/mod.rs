//! `gpupilot bench …`: real load on the GPUs. `gemm` and `memory` ([`kernels`]) time cuBLAS
//! GEMMs and device copies through [`crate::cuda`] and print a table or JSON. Without CUDA each
//! prints one line naming what is missing and exits with status 2, never touching cudarc.

pub mod burn;
pub mod kernels;
mod setup;
pub mod sweep;

use std::process::ExitCode;

use crate::cli::{BenchCommand, GlobalArgs};

/// The command.
pub fn bench(g: &GlobalArgs, cmd: &BenchCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        BenchCommand::Gemm(args) => kernels::gemm(g, args),
        BenchCommand::Memory(args) => kernels::memory(g, args),
        BenchCommand::Burn(args) => burn::burn(g, args),
        BenchCommand::PowerSweep(args) => sweep::power_sweep(g, args),
    }
}
