//! The supervisor in the test's own process: runs started and watched, runs that outlive their
//! supervisor (this binary started again as `helper_supervisor`), and the Slurm launcher
//! against stand-in commands. One test binary; its tests share one process and run in
//! parallel.

#[path = "../support/mod.rs"]
mod support;

mod runs;
mod slurm_fake;
mod survive;
