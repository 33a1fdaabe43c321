//! The energy-optimal power-cap search (Zeus's cost), as a pure state machine.
//!
//! While a run trains, [`Tuner`] tries power caps from the maximum downward, each for a warm-up
//! and then a measured window (in trainer steps, or in seconds for runs that report no steps),
//! and scores each cap by Zeus's cost per sample (You, Chung, Chowdhury, NSDI 2023):
//!
//! `cost = eta · energy + (1 − eta) · max_power · time`, joules per sample,
//!
//! where `max_power` is the sum of the tuned GPUs' maximum power limits, so that `eta = 1` is
//! energy alone and `eta = 0` time alone, in the same unit. It stops early once the cost has
//! clearly risen (`patience` caps in a row above the best by `rise_margin`, and never before the
//! default cap has been measured, which every saving is reported against), then asks for the
//! best cap. Cancelling asks for the cap the run started with.
//!
//! On a data-parallel job of several ranks the search scores the job, the energy of all its
//! GPUs against the samples of all its ranks, and moves all its GPUs' caps together ([`job`]):
//! the job runs at the pace of its slowest rank, so one cap is a decision for all of them.
//!
//! With `--with batch-size` the batch size is searched too ([`joint`]): a line search over a
//! coarse set of batches, each with the golden cap search started around the best cap so far.
//!
//! Nothing here reads a clock, a GPU or a file: the caller feeds [`Observation`]s (cumulative
//! energy, samples, steps, time) and carries out the [`SearchStep`]s. [`live`] drives it on a run
//! (`gpupilot tune energy`, through the daemon); [`sim`] drives it on a gpusim
//! node in simulated time and runs the exhaustive sweep it is compared with (`cargo bench
//! --bench tuner`, BENCHMARKS.md).

mod golden;
pub mod job;
pub mod joint;
pub mod knob;
pub mod live;
pub mod record;
mod search;
pub mod session;
pub mod sim;

pub use joint::JointTuner;
pub use knob::{Knob, KnobSearch};
pub use search::{
    CapPoint, Confidence, NOISE_TOL, Observation, Phase, Progress, Search, SearchStep, Strategy,
    TuneResult, TuneSettings, Tuner, TunerConfig, TunerError, Unit, Window, zeus_cost,
};
