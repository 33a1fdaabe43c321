//! Runs of several ranks: the `ranks` launcher, ranks of the Python SDK whose knob changes land
//! at one step, ranks on another node through SSH, a torch.distributed job, training frameworks
//! (Hugging Face's Trainer, Lightning), and a straggler on the fake NVML library. One test binary; its tests share one process and run in parallel.

#[path = "../support/mod.rs"]
mod support;

mod frameworks;
mod job_figures;
mod launcher;
mod rank_lines;
mod remote;
mod sdk_ranks;
mod straggler;
mod torch;
