//! The command line (clap derive). Names here are stable: tests and docs rely on them.

use clap::builder::TypedValueParser as _;
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

use crate::control::bench::Workload as BenchWorkload;
use crate::control::bench::sweep::CapSteps;
use crate::control::tuner::{Knob, Strategy, TuneSettings};
use crate::protocol::bounds::{self, brief};

pub use crate::telemetry::open::{SimSpec, SourceKind};

/// What `gpupilot --version` prints after the name: the version, the commit and the build
/// profile (`0.1.0 (abc1234 2026-12-01, release)`), so that a bug report says what ran. Set at
/// compile time by build.rs.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("GPUPILOT_BUILD"), ")");

/// gpupilot: watch, supervise and tune deep-learning training on GPU machines.
#[derive(Debug, Parser)]
#[command(name = "gpupilot", version = VERSION, about, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Options every command understands.
#[derive(Debug, Args, Clone)]
pub struct GlobalArgs {
    /// Where GPU telemetry comes from: NVML if it loads (auto), NVML only, or the simulator.
    #[arg(long, global = true, default_value_t = SourceKind::Auto, env = "GPUPILOT_SOURCE",
          value_parser = source_kind_parser())]
    pub source: SourceKind,
    /// Load NVML from this file instead of the system's libnvidia-ml.so.1.
    #[arg(long, global = true, value_name = "PATH", env = "GPUPILOT_NVML_LIB")]
    pub nvml_lib: Option<PathBuf>,
    /// Colour theme: dark, light, high-contrast, mono, or one of yours in the config dir.
    #[arg(long, global = true, value_name = "NAME", env = "GPUPILOT_THEME")]
    pub theme: Option<String>,
    /// Seconds between console redraws (and polls of the daemon; samples in `demo`); raise it
    /// on slow links.
    #[arg(long, global = true, value_name = "SECONDS", default_value_t = 1.0, value_parser = parse_refresh)]
    pub refresh: f64,
    /// Use the system daemon (root's, /run/gpupilot/daemon.sock) instead of your own: watch
    /// the node, and change power caps and clocks as a member of its group. With `daemon`:
    /// be that daemon (as root).
    #[arg(long, global = true, env = "GPUPILOT_SYSTEM",
          value_parser = clap::builder::BoolishValueParser::new())]
    pub system: bool,
    #[command(flatten)]
    pub sim: SimArgs,
}

const DEMO_ABOUT: &str = "The console on a simulated node (--gpus, --model, --workload, \
--seed) with a supervised synthetic training run: no GPU needed. The demo starts a daemon of its \
own on the simulator and stops it, and its run, when the console quits. Before the console takes \
the screen it prints how another terminal reaches that daemon \
(`GPUPILOT_HOME=/tmp/gpupilot-demo-… gpupilot ps`, `… gpupilot logs last`). Its home is a new \
temporary directory, removed on the way out, unless --home DIR (or GPUPILOT_HOME) names one: \
then the daemon lives there and the run's files stay after the demo. A home where a daemon already \
runs is refused.";

/// Options of `gpupilot demo`.
#[derive(Debug, Args, Clone)]
pub struct DemoArgs {
    /// The demo's home (config, state, socket) instead of a temporary one; kept afterwards.
    #[arg(long, value_name = "DIR", env = "GPUPILOT_HOME")]
    pub home: Option<PathBuf>,
}

/// The simulated node used by `--source sim` and `demo`.
#[derive(Debug, Args, Clone)]
pub struct SimArgs {
    /// Number of simulated GPUs.
    #[arg(long = "gpus", global = true, value_name = "N", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..=64))]
    pub gpus: u32,
    /// Simulated GPU model: h100-sxm, h200, a100-sxm-80gb, v100-sxm2, rtx-4090, rtx-6000, a40,
    /// v100-pcie.
    #[arg(
        long = "model",
        global = true,
        value_name = "NAME",
        default_value = "h100-sxm"
    )]
    pub model: String,
    /// Synthetic training workload on the simulated GPUs (or `idle`).
    #[arg(
        long = "workload",
        global = true,
        value_name = "NAME",
        default_value = "resnet50"
    )]
    pub workload: String,
    /// Seed of the simulator (same seed, same node).
    #[arg(long = "seed", global = true, value_name = "N", default_value_t = 0)]
    pub seed: u64,
}

impl SimArgs {
    /// The simulated node these options name, for `telemetry::open`.
    pub fn spec(&self) -> SimSpec {
        SimSpec {
            gpus: self.gpus,
            model: self.model.clone(),
            workload: self.workload.clone(),
            seed: self.seed,
            counters: None,
        }
    }
}

/// `--source`: telemetry's own names, listed in `--help` and completed by the shells.
fn source_kind_parser() -> impl clap::builder::TypedValueParser<Value = SourceKind> {
    clap::builder::PossibleValuesParser::new(SourceKind::ALL.map(SourceKind::as_str))
        .map(|s| SourceKind::parse(&s).unwrap_or(SourceKind::Auto))
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// The console on a simulated node with a supervised synthetic training run (no GPU needed;
    /// a daemon of its own, stopped on the way out; it says how another terminal reaches it).
    #[command(long_about = DEMO_ABOUT)]
    Demo(DemoArgs),
    /// The console, as `gpupilot` alone: for fingers used to nvtop, htop and btop.
    Top,
    /// One-shot snapshot of every GPU (like gpustat; --json for scripts).
    Status(StatusArgs),
    /// The background daemon: GPU sampling, history, runs, event log (one per GPUPILOT_HOME;
    /// `--system`: root's daemon that every user of the node watches and its group tunes).
    #[command(
        long_about = "The background daemon: it samples the GPUs, keeps their history, supervises \
runs and writes the node's event log; the console and the other commands are its clients over a \
Unix socket. One per GPUPILOT_HOME. Runs outlive it: on SIGTERM or SIGINT it leaves them running, \
and the next daemon adopts them.

`sudo gpupilot daemon --system` starts the system daemon instead: root's, one per node, its socket \
/run/gpupilot/daemon.sock open to every local user (state in /var/lib/gpupilot; \
GPUPILOT_SYSTEM_DIR=DIR puts everything under DIR). Everyone may watch the GPUs through it \
(`gpupilot --system`); root and the members of group `gpupilot` (--allow-group NAME) may change \
power caps, clocks and the target temperature (`gpupilot --system power cap 300`); runs stay on \
each user's own daemon. See docs/operations.md, \"A root daemon for power control\"."
    )]
    Daemon(DaemonArgs),
    /// Start a supervised run from a profile or a command line.
    #[command(long_about = RUN_ABOUT)]
    Run(RunArgs),
    /// List runs: id, status, pid, uptime, restarts, exit, GPUs, energy, command.
    Ps(PsArgs),
    /// Open the console on a run (the newest live run unless RUN is given); q detaches.
    #[command(long_about = ATTACH_ABOUT)]
    Attach(AttachArgs),
    /// Print a run's output; -f follows it until the run ends; --rank N keeps one rank's lines.
    Logs(LogsArgs),
    /// Stop a run: SIGTERM to its process group, SIGKILL after the grace period.
    Stop(StopArgs),
    /// The node's event log: who changed what, old → new, when and why, one event a line in
    /// the console's words; --follow prints new ones as they happen.
    #[command(long_about = EVENTS_ABOUT)]
    Events(EventsArgs),
    /// Work with run profiles.
    #[command(subcommand)]
    Profile(ProfileCommand),
    /// Power limits of every GPU; cap them, or restore the limits found before the first cap.
    #[command(long_about = POWER_ABOUT)]
    Power(PowerArgs),
    /// Change a knob of a run while it trains: `set RUN batch-size N` or `set RUN prefetch N`.
    #[command(long_about = SET_ABOUT)]
    Set(SetArgs),
    /// A synthetic training process for demos and tests: gpusim's workload model, paced in real
    /// time, reporting over the trainer channel (what `gpupilot demo` runs).
    #[command(hide = true)]
    SyntheticTrain(SyntheticTrainArgs),
    /// N local ranks of a command with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE,
    /// MASTER_ADDR, MASTER_PORT, …): the process of a `launcher = "ranks"` run.
    #[command(hide = true)]
    Ranks(RanksArgs),
    /// This node's daemon on stdin and stdout, for `ssh NODE gpupilot bridge` (what
    /// `gpupilot attach --host NODE` runs); starts a daemon when none answers.
    Bridge,
    /// Lock the GPUs' SM clocks within a range, or unlock them.
    #[command(subcommand, long_about = CLOCKS_ABOUT)]
    Clocks(ClocksCommand),
    /// Is this node fit to train: driver, CUDA and PyTorch versions, persistence, power limits,
    /// thermal slowdown, ECC errors, power-cap permission, each finding with its fix (exit 0
    /// ok, 1 warnings, 2 problems).
    #[command(long_about = DOCTOR_ABOUT)]
    Doctor(DoctorArgs),
    /// Real load on the GPUs through CUDA: GEMM throughput, memory bandwidth, a perf/W sweep
    /// over power caps and a burn-in (one clear line, exit status 2, on a node without CUDA).
    #[command(subcommand, long_about = BENCH_ABOUT)]
    Bench(BenchCommand),
    /// Tune a live run: `tune energy RUN` searches for the energy-optimal power cap (a job of
    /// the daemon: `tune status`, `tune stop`).
    #[command(subcommand)]
    Tune(TuneCommand),
    /// Hints from the last minutes of telemetry and run metrics, each with its evidence and the
    /// command that acts on it (data stalls, memory headroom, throttling, idle GPUs, drops).
    Advise(AdviseArgs),
    /// Hold the GPUs at a target temperature by moving their power caps (the thermal governor),
    /// or turn it off; without a subcommand, the governors, the node budget and active alerts.
    #[command(long_about = THERMAL_ABOUT)]
    Thermal(ThermalArgs),
    /// Keep the sum of every GPU's power cap within WATTS (the node power budget), or `off`.
    #[command(long_about = BUDGET_ABOUT)]
    Budget(BudgetArgs),
    /// Many nodes at once: every node's GPUs through Prometheus's query API (from gpupilot
    /// daemons or dcgm-exporter), as a grid coloured by a metric.
    #[command(long_about = CLUSTER_ABOUT)]
    Cluster(ClusterArgs),
    /// A run's report: verdict, energy, charts over time with change markers, time lost,
    /// events. Writes report.html into the run directory (or --html FILE) and prints its path;
    /// --md or --json print to stdout.
    Report(ReportArgs),
    /// The GPU history, or a run's trainer metrics, as CSV, JSON lines or Parquet for pandas
    /// (units in the column names; an absent value is empty, never 0).
    #[command(long_about = EXPORT_ABOUT)]
    Export(ExportArgs),
    /// Record the node (telemetry, runs, trainer metrics and knobs, events) as it goes into one
    /// compact file, until Ctrl-C or --for; `gpupilot replay FILE` plays it in the console.
    #[command(long_about = RECORD_ABOUT)]
    Record(RecordArgs),
    /// The console on a recording: the same views, keys and charts, its time at --speed;
    /// Space pauses, [ and ] seek 10 s. Nothing in a replay changes a node.
    Replay(ReplayArgs),
    /// Shell completions for bash, zsh or fish, printed to stdout; they also complete run ids,
    /// profiles and themes.
    #[command(long_about = COMPLETIONS_ABOUT)]
    Completions(CompletionsArgs),
    /// Manual pages made from this command line: gpupilot.1 to stdout, or every page into DIR.
    #[command(long_about = MAN_ABOUT)]
    Man(ManArgs),
    /// What a completion offers for a value, one a line: the run ids and names, the profile
    /// files or the theme names (what the scripts of `completions` call).
    #[command(hide = true)]
    CompleteValues(CompleteValuesArgs),
}

const COMPLETIONS_ABOUT: &str = "Print the completion script for SHELL: subcommands and options \
come from this command line, so they are never out of date. Beyond them, the scripts complete a \
run (`logs`, `attach`, `stop`, `set`, `report`, `tune energy`, `events --run`) with the ids \
and names of your runs, asking the daemon (at most half a second, never starting one) or else \
reading the run directories; `run` and `profile check` with .toml files and your profiles in \
$CONFIG/profiles; --theme with the shipped and your own themes.

Installed by the Debian package. By hand: `gpupilot completions bash > \
~/.local/share/bash-completion/completions/gpupilot`; zsh: `gpupilot completions zsh > \
~/.zfunc/_gpupilot` with ~/.zfunc on $fpath; fish: `gpupilot completions fish > \
~/.config/fish/completions/gpupilot.fish`.";

const MAN_ABOUT: &str = "Manual pages made from this command line, so they say what `--help` \
says: without DIR, gpupilot.1 to stdout (`gpupilot man | man -l -`); with DIR, gpupilot.1 and one \
page per subcommand (gpupilot-run.1, gpupilot-power-cap.1, …) written into DIR, whose names are \
printed. The Debian package ships them.";

/// Options of `gpupilot completions`.
#[derive(Debug, Args, Clone)]
pub struct CompletionsArgs {
    /// The shell whose script to print.
    #[arg(value_name = "SHELL", value_enum)]
    pub shell: CompletionShell,
}

/// The shells `gpupilot completions` writes for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CompletionShell {
    Bash,
    Zsh,
    Fish,
}

/// Options of `gpupilot man`.
#[derive(Debug, Args, Clone)]
pub struct ManArgs {
    /// Write every page into this directory (made if missing) instead of gpupilot.1 to stdout.
    #[arg(value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// Options of `gpupilot complete-values`.
#[derive(Debug, Args, Clone)]
pub struct CompleteValuesArgs {
    /// What to list.
    #[arg(value_name = "KIND", value_enum)]
    pub kind: CompleteKind,
}

/// The values the completion scripts ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CompleteKind {
    /// Run ids and names, and `last`.
    Runs,
    /// Profile files in $CONFIG/profiles.
    Profiles,
    /// Theme names: the shipped ones and those in $CONFIG/themes.
    Themes,
}

const CLUSTER_ABOUT: &str = "A grid of nodes × GPUs read from Prometheus's HTTP query API once a \
second: from gpupilot daemons (`/metrics`, see `gpupilot daemon --metrics-addr`) or dcgm-exporter \
alike, by dcgm-exporter's metric names. Colour by utilization, power, temperature or memory (u p t \
m); sort by name or by the metric (s); filter nodes by name (/); Enter shows one node's GPUs; a \
opens the console on the selected node (`attach --host`, through SSH) and comes back here; q \
quits. Nodes of live Slurm jobs of the local daemon are marked with the run and job. Totals: power, energy, GPUs busy and idle. A node whose samples are older than 3 scrape \
intervals, or whose target is down, is marked stale; a node Prometheus no longer has is marked \
missing. The URL comes from --prometheus, else from `$CONFIG/prometheus.toml` ([cluster] \
prometheus); http or https. Credentials come from files, never from an option's value: \
--prometheus-bearer-token-file, --prometheus-basic-auth-file (USER:PASSWORD), or a user and \
password in the URL; --prometheus-ca gives a private CA's PEM file for https. Each has a [cluster] \
key (bearer_token_file, basic_auth_file, ca_file). See docs/operations.md, \"Prometheus\".";

/// Options of `gpupilot cluster`.
#[derive(Debug, Args, Clone)]
pub struct ClusterArgs {
    /// Prometheus's base URL (`http://head:9090`, `https://head:9090`); default from
    /// `$CONFIG/prometheus.toml`.
    #[arg(long, value_name = "URL")]
    pub prometheus: Option<String>,
    /// A file holding the bearer token to send to Prometheus; default [cluster]
    /// bearer_token_file.
    #[arg(long, value_name = "FILE")]
    pub prometheus_bearer_token_file: Option<std::path::PathBuf>,
    /// A file whose first line is USER:PASSWORD, sent as basic auth; default [cluster]
    /// basic_auth_file.
    #[arg(long, value_name = "FILE")]
    pub prometheus_basic_auth_file: Option<std::path::PathBuf>,
    /// The PEM file of the CA that signed Prometheus's certificate (https); default [cluster]
    /// ca_file.
    #[arg(long, value_name = "FILE")]
    pub prometheus_ca: Option<std::path::PathBuf>,
    /// The metric that colours the grid at start.
    #[arg(long, value_enum, default_value_t = crate::cluster::GridMetric::Util)]
    pub metric: crate::cluster::GridMetric,
    /// Seconds between queries.
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0, value_parser = parse_refresh)]
    pub interval: f64,
    /// Print the model once as JSON and exit (no terminal needed).
    #[arg(long)]
    pub json: bool,
}

const DOCTOR_ABOUT: &str = "Check this node through NVML (no daemon needed), one line per \
finding with what to do about it: the driver version, the newest CUDA it runs, and the CUDA version \
the installed PyTorch was built for, with a verdict on compatibility (NVIDIA's table: a driver runs \
CUDA up to the version it reports; a newer minor release of the same major one runs through \
minor-version compatibility from driver 525.60.13 for CUDA 12.x and 450.80.02 for 11.x), or a \
PyTorch built without CUDA; the driver's CUDA library (libcuda.so.1) and a kernel on every GPU; \
persistence mode; power limits below their default; GPUs in thermal slowdown; ECC errors; whether \
this user may set power caps (probed by setting a GPU's limit to the value it already has, which \
changes nothing); gpupilot's directories and daemon.

A node without a usable NVML is diagnosed, not refused: the driver line names the library tried \
(--nvml-lib / GPUPILOT_NVML_LIB, else the loader's libnvidia-ml.so.1), whether nvidia-smi and the \
kernel module are there, and what to install; the checks that need no NVML still run. With \
--source sim it checks PyTorch, gpupilot's directories and daemon, and says what a simulated node \
cannot have checked.

PyTorch is asked through `python3`, or the interpreter --python or GPUPILOT_PYTHON names (the one \
your runs use); no PyTorch is a note, not a problem. Exit status: 0 nothing to fix, 1 warnings \
only, 2 at least one problem (1 also when doctor itself could not run: a message on stderr and no \
report). --json prints the checks and the facts behind them.";

const BENCH_ABOUT: &str = "Real load on the GPUs through CUDA (the driver library loaded at run \
time, cuBLAS for the GEMM): `gemm` measures TFLOP/s in FP32, BF16 and FP16, `memory` the \
device-to-device copy bandwidth against the memory's peak. Each GPU is measured on its own, for \
--duration per measurement after a warm-up, as the median of five timed windows. GPU numbers are \
CUDA's (the NVML indices `status` shows on a node of identical GPUs without \
CUDA_VISIBLE_DEVICES; each result names its PCI bus id). `power-sweep` measures throughput, power, \
energy per unit of work and perf/W at each power cap (set through the daemon, in its events) and \
finds the knee and the best perf/W cap, putting the cap back at the end and on Ctrl-C or SIGHUP; \
`burn` holds the load for --duration and says when each GPU reached thermal or power slowdown, its \
steady temperature and clock, and which GPU is 15 % below its siblings and why. With --source sim \
those two run on the simulator, every figure labelled simulated. Without CUDA: one line saying \
what is missing, exit status 2. See docs/cuda.md (gemm, memory) and docs/bench.md.";

const POWER_ABOUT: &str = "Without a subcommand: every GPU's power limit (current, enforced, \
default, allowed range), its SM clock range and lock, the driver's target temperature, and the \
values recorded before gpupilot's first change. `power cap WATTS [--gpu I,J]` sets a cap (all GPUs \
unless --gpu); a value outside a GPU's range is refused with the range. `power reset` restores the \
recorded limits; `power gpu-max CELSIUS|reset` sets or restores the driver's target temperature \
where the GPU has one (what `nvidia-smi -gtt` sets).

Changes go through the daemon (started in the background when none answers) and are recorded in \
the node's events with who, old → new and why. NVML's setters need root: without it the daemon says \
so and changes nothing; run `sudo gpupilot daemon --system` and use it: `gpupilot --system power cap \
300` (or GPUPILOT_SYSTEM=1), as root or a member of its group. See docs/operations.md.";

const THERMAL_ABOUT: &str = "The thermal governor holds each GPU at a target temperature by \
moving its power cap: `thermal target 78 [--gpu I,J]` (degrees Celsius), or `thermal target \
--margin 8` (degrees below each GPU's slowdown temperature). It never sets a cap outside the GPU's \
range or above the cap that was set when it started (your cap), and it holds still when telemetry \
goes stale. `thermal off` turns it off and puts your cap back. Without a subcommand: each \
governor's target, cap and last decision, the node budget, and active alerts (--json for scripts). \
Decisions are recorded in the node's events. See docs/operations.md.";

const BUDGET_ABOUT: &str = "Keep the sum of every GPU's power cap within WATTS: the caps follow \
demand (a GPU held back by its cap gets more, an idle one less), each within its own range. When \
the GPUs' minimum caps alone exceed the budget, every cap goes to its minimum and the daemon says \
so. `budget off` clears it and puts the caps back. A run's profile may set one too ([power] \
node_budget_w), for as long as the run lives.";

const CLOCKS_ABOUT: &str = "Lock the SM clocks of the GPUs (all unless --gpu) within MIN..MAX MHz \
(NVML locked clocks; the range is each GPU's supported clocks), or unlock the clocks gpupilot \
locked. `gpupilot power` shows the range and the locks. Needs root, like power caps: use the system \
daemon (`gpupilot --system clocks lock …`).";

const RUN_ABOUT: &str =
    "Start a supervised run from a profile (PROFILE.toml, see docs/profiles.md) or from a \
command line after `--`. The run starts in its own session with its output written to files, so it \
outlives this terminal, the console and the daemon.

Without --detach it then opens the console on the run's Run view (its state and the end of its \
log, followed live); quitting the console (q), or a dropped SSH session, only detaches: the run \
goes on, and `gpupilot attach` shows it again. With --detach it prints the run's id and returns. \
When stdout is not a terminal it follows the run's output instead (like `gpupilot logs -f`) until \
the run ends, and exits with the run's exit code; Ctrl-C detaches.

`run -- CMD…` sets PYTHONUNBUFFERED=1 unless you have set it, so that Python's output reaches the \
log as it is printed. A daemon is started in the background when none answers.";

const ATTACH_ABOUT: &str = "Open the console on a run's Run view: its state, how each attempt \
ended, and the end of its log, followed live. Quitting (q) detaches and leaves the run running. RUN \
is an id, a unique id prefix, a run name (name:NAME for a name that reads as an id or `last`), or \
`last`; without it, the newest live run (else the newest). When stdout is not a terminal it \
prints the run's last lines and then everything new until the run ends; Ctrl-C detaches. A \
daemon is started in the background when none answers.";

const SET_ABOUT: &str = "Change a knob of a run while it trains: `gpupilot set RUN batch-size N` \
or `gpupilot set RUN prefetch N`. The value must lie in the knob's range (the profile's [knobs] \
section, else the range the trainer declared); outside it nothing changes.

A run whose script uses the gpupilot SDK gets the change over the trainer channel and applies it \
from its next batch on; this command waits for the trainer's answer and prints the round trip. A \
run without an attached trainer whose command takes {batch_size} or {prefetch} is restarted with \
the new value (resuming from its checkpoint when the profile has resume_args): this asks first, \
or give --restart.";

/// Options of `gpupilot synthetic-train`.
#[derive(Debug, Args, Clone)]
pub struct SyntheticTrainArgs {
    /// gpusim model: resnet50, bert-large, gpt-1.3b.
    #[arg(long = "train-model", value_name = "NAME", default_value = "resnet50")]
    pub train_model: String,
    /// gpusim GPU model (for memory and compute speed).
    #[arg(long = "gpu-model", value_name = "NAME", default_value = "h100-sxm")]
    pub gpu_model: String,
    /// The GPU whose SM clock (from the daemon's telemetry) paces the steps; for a job of
    /// several ranks, the GPU of local rank 0 (rank l trains on INDEX + l). Default: 0.
    #[arg(long = "gpu", value_name = "INDEX")]
    pub gpu: Option<u32>,
    /// This process's rank in a data-parallel job (default: $RANK, else 0).
    #[arg(long, value_name = "N")]
    pub rank: Option<u32>,
    /// How many ranks the job has (default: $WORLD_SIZE, else 1: a single process).
    #[arg(long = "world-size", value_name = "N")]
    pub world_size: Option<u32>,
    /// The rank on this node (default: $LOCAL_RANK, else the rank).
    #[arg(long = "local-rank", value_name = "N")]
    pub local_rank: Option<u32>,
    /// Stop after this many steps (0: run until stopped).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub steps: u64,
    /// Batch size to start with (default: $GPUPILOT_BATCH_SIZE, else 256).
    #[arg(long = "batch-size", value_name = "N")]
    pub batch_size: Option<i64>,
    /// Prefetch depth to start with (default: $GPUPILOT_PREFETCH, else 2).
    #[arg(long, value_name = "N")]
    pub prefetch: Option<i64>,
    /// Data-loader workers.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub workers: u32,
    /// Simulated seconds per wall-clock second.
    #[arg(long, value_name = "X", default_value_t = 1.0, value_parser = parse_speed)]
    pub speed: f64,
    /// Pace the steps by a measured power-limit curve instead of the model's clock: a CSV of
    /// `limit_w,seconds,power_w`; each step takes the model's time at full clock times the
    /// curve's slowdown at the GPU's power limit, read through NVML (--nvml-lib) at every step.
    #[arg(long, value_name = "CSV")]
    pub curve: Option<PathBuf>,
    /// Each step's time off by up to this fraction either way (with --curve).
    #[arg(long = "curve-noise", value_name = "X", default_value_t = 0.02, value_parser = parse_curve_noise)]
    pub curve_noise: f64,
}

fn parse_curve_noise(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if (0.0..0.5).contains(&x) => Ok(x),
        _ => Err(format!("`{s}`: the noise is a fraction in 0..0.5")),
    }
}

/// Options of `gpupilot ranks`.
#[derive(Debug, Args, Clone)]
pub struct RanksArgs {
    /// Ranks to start on this node (WORLD_SIZE).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=256))]
    pub nproc: u32,
    /// MASTER_ADDR: where rank 0 serves the rendezvous store.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1")]
    pub master_addr: String,
    /// MASTER_PORT (0: a free port, picked at start).
    #[arg(long, value_name = "PORT", default_value_t = 0)]
    pub master_port: u16,
    /// Once a rank has failed, seconds the others get between SIGTERM and SIGKILL.
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0, value_parser = parse_grace)]
    pub grace: f64,
    /// The program every rank runs, and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// Options of `gpupilot set`.
#[derive(Debug, Args, Clone)]
pub struct SetArgs {
    /// An id, a unique id prefix, a run name (or name:NAME), or `last`.
    #[arg(value_name = "RUN")]
    pub run: String,
    /// batch-size or prefetch.
    #[arg(value_name = "KNOB", value_parser = parse_knob)]
    pub knob: crate::protocol::KnobName,
    /// The new value.
    #[arg(value_name = "N", allow_negative_numbers = true)]
    pub value: i64,
    /// Allow a restart with the new value when no trainer is attached (no question asked).
    #[arg(long)]
    pub restart: bool,
    /// Return once the daemon has taken the change, without waiting for the trainer.
    #[arg(long)]
    pub no_wait: bool,
    /// Seconds to wait for the trainer's answer.
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0, value_parser = parse_wait_s)]
    pub timeout: f64,
}

fn parse_knob(s: &str) -> Result<crate::protocol::KnobName, String> {
    crate::protocol::KnobName::parse(s)
        .ok_or_else(|| format!("unknown knob `{s}`: use batch-size or prefetch"))
}

/// Options of `gpupilot daemon`.
#[derive(Debug, Args, Clone)]
pub struct DaemonArgs {
    /// Start in the background (own session, output to $STATE/daemon.log), print its pid once it
    /// answers, and return.
    #[arg(long)]
    pub detach: bool,
    /// Refuse every change: starting, stopping or signalling runs (watching still works).
    #[arg(long)]
    pub readonly: bool,
    /// GPU samples per second kept in history and pushed to clients.
    #[arg(long, value_name = "HZ", default_value_t = 1.0, value_parser = parse_rate)]
    pub rate: f64,
    /// When the daemon stops, restore the GPU settings recorded before its first change (power
    /// limits, clock locks, target temperatures).
    #[arg(long)]
    pub restore_on_exit: bool,
    /// With --system: the group whose members may change GPU settings (default `gpupilot`);
    /// root always may.
    #[arg(long, value_name = "NAME")]
    pub allow_group: Option<String>,
    /// Internal: started by --detach; call setsid(2) and log to the file only.
    #[arg(long, hide = true)]
    pub new_session: bool,
    /// Serve Prometheus `/metrics` here (`ADDR:PORT`), or `off`; default from
    /// `$CONFIG/prometheus.toml`, else 127.0.0.1:9400 (loopback).
    #[arg(long, value_name = "ADDR:PORT|off", value_parser = parse_metrics_addr)]
    pub metrics_addr: Option<String>,
    #[command(subcommand)]
    pub action: Option<DaemonCommand>,
}

/// What `gpupilot daemon` does instead of being the daemon.
#[derive(Debug, Subcommand, Clone)]
pub enum DaemonCommand {
    /// Stop the daemon of this GPUPILOT_HOME (SIGTERM, as a clean exit); its runs go on and the
    /// next daemon adopts them. Fails, saying so, when none runs.
    #[command(long_about = DAEMON_STOP_ABOUT)]
    Stop {
        /// Seconds to wait for it to exit.
        #[arg(long, value_name = "SECONDS", default_value_t = 10.0, value_parser = parse_wait_s)]
        wait: f64,
    },
}

const DAEMON_STOP_ABOUT: &str = "Stop the daemon of this GPUPILOT_HOME (or, with --system, the \
system daemon, as root): SIGTERM to the process that holds its lock, once it is known to be a \
gpupilot daemon of yours, then wait until it has gone (--wait). It stops serving, tells its \
clients, removes its socket and exits; with --restore-on-exit it also restores the GPU settings it \
changed. Runs are not stopped: they go on in their own sessions, writing their logs, and the next \
daemon (`gpupilot daemon --detach`, or any command that starts one) adopts them and records how \
they ended. Stop runs first with `gpupilot stop RUN`. Exit status 1 when no daemon runs.";

fn parse_metrics_addr(s: &str) -> Result<String, String> {
    crate::config::prometheus::parse_metrics_addr(s).map(|_| s.trim().to_string())
}

/// Options of `gpupilot power`.
#[derive(Debug, Args, Clone)]
pub struct PowerArgs {
    /// Print JSON instead of the table (or the list of changes).
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub action: Option<PowerCommand>,
}

/// Options of `gpupilot thermal`.
#[derive(Debug, Args, Clone)]
pub struct ThermalArgs {
    /// Print JSON instead of words.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub action: Option<ThermalCommand>,
}

#[derive(Debug, Subcommand, Clone)]
pub enum ThermalCommand {
    /// Hold CELSIUS, or --margin C below each GPU's slowdown temperature.
    Target {
        #[arg(value_name = "CELSIUS", required_unless_present = "margin",
              value_parser = parse_celsius)]
        celsius: Option<f64>,
        /// Degrees below each GPU's slowdown temperature instead of an absolute target.
        #[arg(long, value_name = "C", conflicts_with = "celsius", value_parser = parse_margin)]
        margin: Option<f64>,
        #[command(flatten)]
        gpus: GpuList,
    },
    /// Turn the governor off; the caps go back to what they were.
    Off {
        #[command(flatten)]
        gpus: GpuList,
    },
}

/// Options of `gpupilot budget`.
#[derive(Debug, Args, Clone)]
pub struct BudgetArgs {
    /// Watts, or `off`; without it, the budget as it stands.
    #[arg(value_name = "WATTS|off", value_parser = parse_budget)]
    pub value: Option<String>,
    /// Why, for the event log (default: the command line).
    #[arg(long, value_name = "TEXT")]
    pub why: Option<String>,
    /// Print JSON instead of words.
    #[arg(long)]
    pub json: bool,
}

/// GPUs named on the command line: `--gpu 0,2` (absent: all).
#[derive(Debug, Args, Clone, Default)]
pub struct GpuList {
    /// The GPUs to change, by index (`--gpu 0,2`); every GPU when left out.
    #[arg(long = "gpu", value_name = "I,J", value_delimiter = ',')]
    pub gpu: Vec<u32>,
    /// Why, for the event log (default: the command line).
    #[arg(long, value_name = "TEXT")]
    pub why: Option<String>,
}

#[derive(Debug, Subcommand, Clone)]
pub enum PowerCommand {
    /// Set the power cap to WATTS (within each GPU's range).
    Cap {
        #[arg(value_name = "WATTS", value_parser = parse_cap_w)]
        watts: f64,
        #[command(flatten)]
        gpus: GpuList,
    },
    /// Restore the power limits recorded before gpupilot's first cap.
    Reset {
        #[command(flatten)]
        gpus: GpuList,
    },
    /// Set the driver's target temperature to CELSIUS, or `reset` to restore the recorded one.
    GpuMax {
        #[arg(value_name = "CELSIUS|reset", value_parser = parse_gpu_max)]
        value: String,
        #[command(flatten)]
        gpus: GpuList,
    },
}

#[derive(Debug, Subcommand, Clone)]
pub enum ClocksCommand {
    /// Lock the SM clocks within MIN..MAX MHz.
    Lock {
        #[arg(value_name = "MIN")]
        min_mhz: u32,
        #[arg(value_name = "MAX")]
        max_mhz: u32,
        #[command(flatten)]
        gpus: GpuList,
    },
    /// Unlock the SM clocks gpupilot locked.
    Reset {
        #[command(flatten)]
        gpus: GpuList,
    },
}

/// Options of `gpupilot run`.
#[derive(Debug, Args, Clone)]
pub struct RunArgs {
    /// The profile to run (a TOML file; `extends` looks in its directory, then
    /// $CONFIG/profiles, then the shipped profiles).
    #[arg(value_name = "PROFILE.toml", required_unless_present = "command")]
    pub profile: Option<PathBuf>,
    /// The command to run instead of a profile, after `--`: `gpupilot run -- python3 train.py`.
    #[arg(last = true, value_name = "CMD", conflicts_with = "profile")]
    pub command: Vec<String>,
    /// Print the run's id and return at once instead of opening the console on it.
    #[arg(long, short = 'd')]
    pub detach: bool,
    /// The run's name (part of its id) instead of the profile's or the command's: up to 64
    /// letters, digits, '.', '_' and '-'.
    #[arg(long, value_name = "NAME", value_parser = parse_run_name)]
    pub name: Option<String>,
    /// With `-- CMD`: a knob the command takes as `{batch_size}` or `{prefetch}`, its starting
    /// value and range (`--knob batch_size=64:8..512`); a profile has `[knobs]` instead.
    #[arg(long = "knob", value_name = "NAME=N:MIN..MAX", requires = "command",
          value_parser = crate::profile::KnobDecl::parse)]
    pub knobs: Vec<crate::profile::KnobDecl>,
    /// The GPUs the run sees, instead of the profile's `gpus`: indices (`0,2`), `GPU-…` UUIDs,
    /// or one MIG instance by its `MIG-…` UUID or `GPU:GI` (`0:7`, as `gpupilot status` lists
    /// it). The run's child gets it as CUDA_VISIBLE_DEVICES (a MIG instance as its MIG UUID).
    #[arg(long, value_name = "SPEC")]
    pub gpu: Option<String>,
}

const RECORD_ABOUT: &str = "Record what the console would show of this node: every telemetry \
snapshot the daemon (which must be running) pushes, the runs, the trainer metrics and knobs of \
live runs, the control loops and the node's events, as they happen, into one zstd-compressed \
file (about 0.2 MB per GPU-hour at 1 Hz; see BENCHMARKS.md). It ends on Ctrl-C, SIGTERM, SIGHUP \
or after --for, and a file cut off (the recorder killed, a full disk) still plays up to its last \
two seconds. `gpupilot replay FILE` plays it. See docs/recording.md.";

/// Options of `gpupilot record`.
#[derive(Debug, Args, Clone)]
pub struct RecordArgs {
    /// The file to write (never replaced: an existing file is refused). Default:
    /// $STATE/recordings/YYYYMMDD-HHMMSS.gprec, printed when the recording starts.
    #[arg(long, short = 'o', value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Stop after this long: seconds, or with a unit (`90s`, `15m`, `2h`).
    #[arg(long = "for", value_name = "DURATION", value_parser = parse_duration)]
    pub duration: Option<std::time::Duration>,
}

/// Options of `gpupilot replay`.
#[derive(Debug, Args, Clone)]
pub struct ReplayArgs {
    /// A recording made by `gpupilot record`.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// How fast the recording's time moves: 1 as recorded, 10 ten times as fast.
    #[arg(long, value_name = "N", default_value_t = 1.0,
          value_parser = |s: &str| finite_in(s, "speed", 0.1, 1000.0, "×"))]
    pub speed: f64,
}

/// `90`, `90s`, `15m`, `2h`: a duration above zero and at most a week.
fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let t = s.trim();
    let (num, unit) = match t.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => t.split_at(i),
        None => (t, "s"),
    };
    let scale = match unit {
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => {
            return Err(format!(
                "`{}`: expected seconds or a number with s, m or h",
                brief(s)
            ));
        }
    };
    match num.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v * scale <= 7.0 * 86400.0 => {
            Ok(std::time::Duration::from_secs_f64(v * scale))
        }
        _ => Err(format!(
            "`{}`: expected a duration above 0 and at most 7 days (`90s`, `15m`, `2h`)",
            brief(s)
        )),
    }
}

/// Options of `gpupilot report`.
#[derive(Debug, Args, Clone)]
pub struct ReportArgs {
    /// An id, a unique id prefix, a run name (or name:NAME), or `last`.
    #[arg(value_name = "RUN")]
    pub run: String,
    /// Write the HTML report to FILE instead of the run directory's report.html.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["md", "json"])]
    pub html: Option<std::path::PathBuf>,
    /// Print the report as Markdown.
    #[arg(long, conflicts_with = "json")]
    pub md: bool,
    /// Print the report's figures as JSON.
    #[arg(long)]
    pub json: bool,
}

const EXPORT_ABOUT: &str = "Write the node's GPU history (from the daemon, which must be running) \
or a run's trainer metrics (from its metrics.jsonl, with the rank) as a table: CSV or JSON lines \
to stdout or --out FILE, Parquet to --out FILE. Columns carry their units (power_w, \
temperature_c, memory_used_bytes, …); `time` is RFC 3339 UTC (a timestamp in Parquet); a value \
the GPU or the trainer did not report is an empty cell or null, never 0. GPU rows are the mean \
of each --step (default: the history's own resolution for the window's age). Times are RFC \
3339 (`2026-11-30T03:15:00Z`), `now`, or a length back from now (`90s`, `15m`, `2h`, `1d`). \
See docs/operations.md, \"Exporting history and metrics\".";

/// Options of `gpupilot export`.
#[derive(Debug, Args, Clone)]
pub struct ExportArgs {
    /// From this time: RFC 3339, `now`, or a length back from now (`2h`). Default: an hour
    /// ago for the GPU history, the run's start for its metrics.
    #[arg(long, value_name = "T", value_parser = parse_when)]
    pub since: Option<When>,
    /// Up to this time (same forms). Default: now, or the run's end.
    #[arg(long, value_name = "T", value_parser = parse_when)]
    pub until: Option<When>,
    /// Only these GPUs (`--gpu 0,2`) of the GPU history.
    #[arg(long = "gpu", value_name = "I,J", value_delimiter = ',')]
    pub gpu: Vec<u32>,
    /// A run (id, unique id prefix, name, name:NAME or `last`): its trainer metrics, or with
    /// `--table gpus` the history of its GPUs over its span.
    #[arg(long, value_name = "ID")]
    pub run: Option<String>,
    /// What to export: `gpus` (the GPU history) or `metrics` (a run's trainer reports).
    /// Default: `metrics` with --run, else `gpus`.
    #[arg(long, value_enum, value_name = "TABLE")]
    pub table: Option<ExportTable>,
    /// The file format.
    #[arg(long, value_enum, default_value_t = ExportFormat::Csv)]
    pub format: ExportFormat,
    /// Seconds per GPU row (each row the mean over its step); default 1 s back to an hour
    /// ago, 15 s to a day, 120 s beyond (the history's own resolutions).
    #[arg(long, value_name = "SECONDS", value_parser = parse_step)]
    pub step: Option<f64>,
    /// Write to FILE (replaced whole) instead of stdout; Parquet needs it unless stdout is a
    /// pipe or a file.
    #[arg(long, short = 'o', value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// `gpupilot export --format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    Csv,
    Jsonl,
    Parquet,
}

/// `gpupilot export --table`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportTable {
    Gpus,
    Metrics,
}

/// A time on the command line: absolute, or a length back from when the command runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum When {
    /// Unix seconds.
    At(f64),
    /// Seconds before now (`now` is 0).
    Ago(f64),
}

impl When {
    /// Unix seconds, with `now` for the relative forms.
    pub fn resolve(self, now: f64) -> f64 {
        match self {
            When::At(t) => t,
            When::Ago(s) => now - s,
        }
    }
}

fn parse_when(s: &str) -> Result<When, String> {
    if s.trim() == "now" {
        return Ok(When::Ago(0.0));
    }
    if let Some(t) = crate::time::parse_rfc3339(s.trim()) {
        let secs = t
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|_| format!("`{s}` is before 1970"))?;
        return Ok(When::At(secs.as_secs_f64()));
    }
    crate::time::parse_span(s)
        .map(|d| When::Ago(d.as_secs_f64()))
        .ok_or_else(|| {
            format!(
                "`{s}` is not a time: give RFC 3339 with an offset (2026-11-30T03:15:00Z), `now`, \
                 or a length back from now (90s, 15m, 2h, 1d)"
            )
        })
}

fn parse_step(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.01..=86400.0).contains(&v) => Ok(v),
        _ => Err(format!("`{s}`: expected seconds from 0.01 to 86400")),
    }
}

#[derive(Debug, Args, Clone)]
pub struct PsArgs {
    /// Print JSON (an array of runs) instead of the table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args, Clone)]
pub struct AttachArgs {
    /// An id, a unique id prefix, a run name (or name:NAME), or `last`.
    #[arg(value_name = "RUN")]
    pub run: Option<String>,
    /// Another node: speak to its daemon through `ssh NODE gpupilot bridge` (SSH's own
    /// authentication; `GPUPILOT_SSH` replaces `ssh`, e.g. "ssh -p 2222 -i KEY").
    #[arg(long, value_name = "NODE")]
    pub host: Option<String>,
}

#[derive(Debug, Args, Clone)]
pub struct LogsArgs {
    /// An id, a unique id prefix, a run name (or name:NAME), or `last`.
    #[arg(value_name = "RUN")]
    pub run: String,
    /// Keep printing new output until the run ends (Ctrl-C stops following).
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// The run's stderr instead of its stdout.
    #[arg(long)]
    pub stderr: bool,
    /// Only rank N's lines, of a job whose ranks gpupilot starts (`launcher = "ranks"`),
    /// whose every line starts with the rank that wrote it: `[rank1]: …`.
    #[arg(long, value_name = "N")]
    pub rank: Option<u32>,
}

const EVENTS_ABOUT: &str = "Print the node's event log, oldest first, one event a line in the \
words of the console's Events view: the time (UTC), who made the change (a user, the energy \
tuner, the thermal governor, the power budget, an alert, the daemon), what it is about, what \
changed (old → new, with units) and why. Power caps, clock locks, knob changes, runs starting \
and ending, alerts raised and cleared, the tuner's and the governor's steps are all there. The \
daemon must be running; it keeps the newest 4096 events (the rest are in $STATE/events.jsonl). \
--json prints one JSON object a line: the event's fields as events.jsonl has them, plus `text` \
(the line's words) and `undo` (the command that undoes it, or null). --follow keeps printing \
new events until Ctrl-C, or until the daemon goes away. --since takes RFC 3339 \
(`2026-11-30T03:15:00Z`) or a length back from now (`90s`, `15m`, `2h`, `1d`).";

/// Options of `gpupilot events`.
#[derive(Debug, Args, Clone)]
pub struct EventsArgs {
    /// Only events from this time on: RFC 3339, or a length back from now (`15m`, `2h`, `1d`).
    #[arg(long, value_name = "DURATION|TIME", value_parser = parse_when)]
    pub since: Option<When>,
    /// Keep printing new events as they happen (Ctrl-C stops).
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// One JSON object a line: the event's fields, its words (`text`) and its `undo`.
    #[arg(long)]
    pub json: bool,
    /// Only the events of this run: an id, a unique id prefix, a run name, or `last`.
    #[arg(long, value_name = "RUN")]
    pub run: Option<String>,
    /// Only the events about these GPUs (`--gpu 1` or `--gpu 0,2`).
    #[arg(long = "gpu", value_name = "I,J", value_delimiter = ',')]
    pub gpu: Vec<u32>,
}

#[derive(Debug, Args, Clone)]
pub struct StopArgs {
    /// An id, a unique id prefix, a run name (or name:NAME), or `last`.
    #[arg(value_name = "RUN")]
    pub run: String,
    /// SIGKILL now instead of SIGTERM and a grace period.
    #[arg(long)]
    pub kill: bool,
    /// Seconds between SIGTERM and SIGKILL.
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0, value_parser = parse_wait_s)]
    pub grace: f64,
}

#[derive(Debug, Subcommand, Clone)]
pub enum ProfileCommand {
    /// Load a profile, follow `extends`, and print what would run, or every problem as
    /// FILE:LINE:COL (exit status 1).
    Check {
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
}

#[derive(Debug, Args, Clone)]
pub struct StatusArgs {
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Wait at most this many seconds for a GPU that does not answer.
    #[arg(long, value_name = "SECONDS", default_value_t = 3.0, value_parser = parse_wait_s)]
    pub timeout: f64,
}

#[derive(Debug, Subcommand, Clone)]
pub enum TuneCommand {
    /// Find the power cap with the lowest energy-and-time cost per sample on a live run.
    #[command(long_about = TUNE_ENERGY_ABOUT)]
    Energy(TuneEnergyArgs),
    /// The daemon's tuning jobs: where each stands, or how it ended.
    Status(TuneStatusArgs),
    /// Stop a tuning job; its GPUs' starting caps come back.
    Stop(TuneStopArgs),
}

/// Options of `gpupilot tune status`.
#[derive(Debug, Args, Clone)]
pub struct TuneStatusArgs {
    /// A job id (`tune-RUN`) or its run; every job when left out.
    #[arg(value_name = "JOB")]
    pub job: Option<String>,
    /// Print the jobs as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Options of `gpupilot tune stop`.
#[derive(Debug, Args, Clone)]
pub struct TuneStopArgs {
    /// A job id (`tune-RUN`) or its run.
    #[arg(value_name = "JOB")]
    pub job: String,
}

const TUNE_ENERGY_ABOUT: &str = "While RUN trains, try power caps on a grid of --step-w steps, each \
for a warm-up and a measured window of training steps (the run must report metrics: the gpupilot \
SDK, or lines the daemon parses), and score each by Zeus's cost per sample, \
eta·energy + (1−eta)·max_power·time (eta 1: energy only; 0: time only). The default search starts \
at the default cap, narrows a golden-section bracket over the caps and ends each window once the \
cost is known well enough (--search descend: from the maximum down until the cost has clearly \
risen for two caps in a row; sweep: every cap). It sets the best cap on the run's GPUs, prints the \
curve and the saving in energy and time against the default cap, and writes the result to the \
run's directory (tune-energy.json). The search is a job of the daemon: this command starts it and \
follows it; closing the terminal, a dropped SSH session or killing this command leaves it running \
(`gpupilot tune status`, `gpupilot tune stop RUN`), and it survives a daemon restart. Ctrl-C \
stops it; a stop, or the run ending mid-way, puts every GPU's starting cap back. Caps go through \
the daemon, so they need the rights any cap needs (a root daemon; a user's daemon asks the system \
daemon when one answers). With `--with batch-size` it searches the batch size too: a line \
search over batches doubled and halved from the run's (within its [knobs.batch_size] range and \
the memory headroom), each with a golden cap search started around the best cap so far; the \
trainer changes the batch live (every rank at one step), an out-of-memory ends that batch's \
probe and puts the last good batch back. A stop puts the starting batch back with the caps. \
Changing the batch size changes training dynamics (learning-rate scaling, convergence, the \
effective epoch): the batch part is opt-in.";

/// Options of `gpupilot tune energy`.
#[derive(Debug, Args, Clone)]
pub struct TuneEnergyArgs {
    /// An id, a unique id prefix, a run name (or name:NAME), or `last`.
    #[arg(value_name = "RUN")]
    pub run: String,
    /// Weight of energy against time, 0..=1.
    #[arg(long, value_name = "ETA", default_value_t = TuneSettings::default().eta, value_parser = parse_eta)]
    pub eta: f64,
    /// Watts between the caps tried.
    #[arg(
        long = "step-w",
        value_name = "WATTS",
        default_value_t = TuneSettings::default().step_w,
        value_parser = parse_step_w
    )]
    pub step_w: f64,
    /// How caps are chosen: golden (a golden-section search from the default cap), descend
    /// (from the maximum down, early stop) or sweep (every cap).
    #[arg(long, value_name = "HOW", default_value = "golden", value_parser = parse_strategy)]
    pub search: Strategy,
    /// Warm-up per cap, in steps (in seconds with --seconds); default 5 steps or 3 s (golden),
    /// 10 steps or 5 s (descend, sweep); 0 for none.
    #[arg(long, value_name = "N", value_parser = parse_warmup)]
    pub warmup: Option<f64>,
    /// Measured window per cap, in steps (the most, for golden); default 40.
    #[arg(long, value_name = "STEPS", conflicts_with = "seconds", value_parser = parse_window)]
    pub measure: Option<f64>,
    /// Measure each cap for this many seconds instead of steps (runs that report no steps).
    #[arg(long, value_name = "SECONDS", value_parser = parse_window)]
    pub seconds: Option<f64>,
    /// Print the result as JSON (progress is not printed).
    #[arg(long)]
    pub json: bool,
    /// Start the job and return (its id on stdout) instead of following it.
    #[arg(long)]
    pub detach: bool,
    /// Search another knob with the cap: `batch-size` (within the profile's [knobs.batch_size]
    /// range and the memory the advisor predicts). Changing the batch size changes training
    /// dynamics (learning-rate scaling, convergence, what an epoch is): opt in knowingly.
    #[arg(long = "with", value_name = "KNOB", value_parser = parse_tune_with)]
    pub with: Option<TuneWith>,
    /// The setting searched: `cap` (the power cap), `clocks` (the top of a locked SM clock
    /// range, from the highest clock down to half of it; for kernels that draw less than the
    /// cap) or `both` (the cap, then the clocks, keeping the one that saves more).
    #[arg(long, value_name = "KNOB", default_value = "cap", value_parser = parse_tune_knob)]
    pub knob: Knob,
    /// MHz between the clocks tried (--knob clocks|both); default: the searched range over
    /// twelve, on the 15 MHz grid.
    #[arg(long = "step-mhz", value_name = "MHZ", value_parser = parse_step_mhz)]
    pub step_mhz: Option<f64>,
}

/// What `tune energy --with` searches beside the cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TuneWith {
    BatchSize,
}

fn parse_tune_with(s: &str) -> Result<TuneWith, String> {
    match s {
        "batch-size" | "batch_size" => Ok(TuneWith::BatchSize),
        _ => Err(format!(
            "`{s}` is not a knob the tuner searches: use `batch-size`"
        )),
    }
}

/// Options of `gpupilot advise`.
#[derive(Debug, Args, Clone)]
pub struct AdviseArgs {
    /// Print the hints as JSON.
    #[arg(long)]
    pub json: bool,
    /// How far back the evidence may come from, seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 300.0, value_parser = parse_window)]
    pub window: f64,
}

/// `gpupilot bench …`.
#[derive(Debug, Subcommand, Clone)]
pub enum BenchCommand {
    /// GEMM throughput (TFLOP/s) through cuBLAS, per GPU and precision.
    Gemm(BenchGemmArgs),
    /// Device-to-device copy bandwidth (GB/s, bytes read and written) against the memory's peak.
    Memory(BenchMemoryArgs),
    /// Sustained full load for a while: when each GPU reached thermal or power slowdown, its
    /// steady temperature and clock, and the GPU slower than its siblings, named with the cause.
    Burn(BurnArgs),
    /// Throughput, power, energy per unit of work and perf/W at each power cap from MAX down to
    /// MIN; the knee and the best perf/W cap; the cap put back at the end and on a stop.
    PowerSweep(PowerSweepArgs),
}

/// Options of `gpupilot bench gemm`.
#[derive(Debug, Args, Clone)]
pub struct BenchGemmArgs {
    /// The GPUs to measure (`--gpu 0,2`); every GPU CUDA sees when left out.
    #[arg(long = "gpu", value_name = "I,J", value_delimiter = ',')]
    pub gpu: Vec<u32>,
    /// How long each measurement is timed, warm-up not counted (`10s`, `1m`).
    #[arg(long, value_name = "D", default_value = "10s", value_parser = parse_duration)]
    pub duration: std::time::Duration,
    /// fp32 (cublasSgemm, no TF32), bf16 or fp16 (cublasGemmEx on tensor cores), or all three.
    #[arg(long, value_enum, default_value_t = BenchPrecision::All)]
    pub precision: BenchPrecision,
    /// The results as JSON (schema in docs/cuda.md).
    #[arg(long)]
    pub json: bool,
}

/// `bench gemm --precision`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchPrecision {
    Fp32,
    Bf16,
    Fp16,
    All,
}

/// Options of `gpupilot bench memory`.
#[derive(Debug, Args, Clone)]
pub struct BenchMemoryArgs {
    /// The GPUs to measure (`--gpu 0,2`); every GPU CUDA sees when left out.
    #[arg(long = "gpu", value_name = "I,J", value_delimiter = ',')]
    pub gpu: Vec<u32>,
    /// How long each measurement is timed, warm-up not counted (`10s`, `1m`).
    #[arg(long, value_name = "D", default_value = "10s", value_parser = parse_duration)]
    pub duration: std::time::Duration,
    /// The results as JSON (schema in docs/cuda.md).
    #[arg(long)]
    pub json: bool,
}

/// Options of `gpupilot doctor`.
#[derive(Debug, Args, Clone)]
pub struct DoctorArgs {
    /// Print JSON (the checks and the facts behind them) instead of the report.
    #[arg(long)]
    pub json: bool,
    /// Seconds to wait for Python to say which PyTorch it has (importing torch is slow).
    #[arg(long, value_name = "SECONDS", default_value_t = 30.0, value_parser = parse_wait_s)]
    pub python_timeout: f64,
    /// The Python interpreter your runs use (a virtualenv's), asked which PyTorch it has.
    #[arg(
        long,
        value_name = "PATH",
        env = "GPUPILOT_PYTHON",
        default_value = "python3"
    )]
    pub python: String,
    /// Skip the CUDA checks (a context, a kernel and a memory round trip on every GPU): a
    /// context takes a few hundred MiB of a GPU's memory while doctor runs.
    #[arg(long)]
    pub no_cuda: bool,
}

/// A run's name, checked as a profile's `name` is (clap says which option it was).
fn parse_run_name(s: &str) -> Result<String, String> {
    crate::profile::check_name(s)
        .map(|()| s.to_string())
        .map_err(|why| format!("`{}`: {why}", brief(s)))
}

// Numbers on the command line. Every one goes through [`finite_in`]: NaN, the infinities and
// absurd magnitudes are refused here, before anything is sent or changed (a NaN budget used to
// travel as JSON `null` and clear the budget), each with the range a plausible value lies in.

/// A finite number within `lo..=hi` (`unit` after the bounds), or a message that shows the text
/// as typed (cut short) and the range.
pub fn finite_in(s: &str, what: &str, lo: f64, hi: f64, unit: &str) -> Result<f64, String> {
    let range = format!("between {lo} and {hi}{unit}");
    let typed = brief(s);
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && (lo..=hi).contains(&v) => Ok(v),
        Ok(v) if v.is_finite() => Err(format!("{what} must be {range}, not `{typed}`")),
        _ => Err(format!("`{typed}` is not a {what}: give a number {range}")),
    }
}

// The values the daemon also checks (budget, cap, temperatures) take their bounds from
// `protocol::bounds`, so a raw request and the command line accept the same values.

/// A power cap of one GPU.
fn parse_cap_w(s: &str) -> Result<f64, String> {
    bounds::CAP_W.parse(s.trim_end_matches(['W', 'w']))
}

/// The node budget: watts (the sum of every cap), or `off`; the number as text for the command.
fn parse_budget(s: &str) -> Result<String, String> {
    if s.trim() == "off" {
        return Ok("off".into());
    }
    let w = bounds::BUDGET_W
        .named("budget in watts (or `off`)")
        .parse(s.trim_end_matches(['W', 'w']))?;
    Ok(w.to_string())
}

/// A temperature the governor holds the GPUs at.
fn parse_celsius(s: &str) -> Result<f64, String> {
    bounds::TARGET_C.parse(s.trim_end_matches("°C"))
}

/// Degrees below each GPU's slowdown temperature.
fn parse_margin(s: &str) -> Result<f64, String> {
    bounds::MARGIN_C.parse(s.trim_end_matches("°C"))
}

/// The driver's target temperature, or `reset`; the number as text for the command.
fn parse_gpu_max(s: &str) -> Result<String, String> {
    if s.trim() == "reset" {
        return Ok("reset".into());
    }
    bounds::GPU_MAX_C
        .parse(s.trim_end_matches("°C"))
        .map(|c| c.to_string())
}

/// A wait or a timeout.
fn parse_wait_s(s: &str) -> Result<f64, String> {
    finite_in(s, "number of seconds", 0.0, 86_400.0, " s")
}

/// A window of steps or seconds (a tuner's warm-up and measure, advise's look back).
fn parse_window(s: &str) -> Result<f64, String> {
    bounds::WINDOW.parse(s)
}

fn parse_warmup(s: &str) -> Result<f64, String> {
    bounds::WARMUP.parse(s)
}

/// The tuner's step between caps.
fn parse_strategy(s: &str) -> Result<Strategy, String> {
    [Strategy::Golden, Strategy::Descend, Strategy::Sweep]
        .into_iter()
        .find(|k| k.name() == s)
        .ok_or_else(|| format!("`{s}`: the search is golden, descend or sweep"))
}

fn parse_tune_knob(s: &str) -> Result<Knob, String> {
    [Knob::Cap, Knob::Clocks, Knob::Both]
        .into_iter()
        .find(|k| k.name() == s)
        .ok_or_else(|| format!("`{s}`: the knob is cap, clocks or both"))
}

fn parse_step_mhz(s: &str) -> Result<f64, String> {
    bounds::STEP_MHZ.parse(s.trim_end_matches(['M', 'H', 'z', 'm', 'h', 'Z']))
}

fn parse_step_w(s: &str) -> Result<f64, String> {
    bounds::STEP_W.parse(s.trim_end_matches(['W', 'w']))
}

/// Simulated seconds per wall-clock second.
fn parse_speed(s: &str) -> Result<f64, String> {
    finite_in(s, "speed", 0.01, 1_000.0, "×")
}

fn parse_eta(s: &str) -> Result<f64, String> {
    bounds::ETA.parse(s)
}

fn parse_rate(s: &str) -> Result<f64, String> {
    finite_in(s, "number of samples per second", 0.01, 100.0, " Hz")
}

fn parse_refresh(s: &str) -> Result<f64, String> {
    finite_in(s, "number of seconds", 0.05, 3600.0, " s")
}

fn parse_grace(s: &str) -> Result<f64, String> {
    let v = finite_in(s, "number of seconds", 0.0, 3600.0, " s")?;
    if v == 0.0 {
        return Err("grace must be more than 0 seconds".into());
    }
    Ok(v)
}

/// Options of `gpupilot bench power-sweep`.
#[derive(Debug, Args, Clone)]
pub struct PowerSweepArgs {
    /// The GPU to sweep, by index.
    #[arg(long = "gpu", value_name = "I", default_value_t = 0)]
    pub gpu: u32,
    /// The caps to try, in watts, from MAX down to MIN by STEP (default: the GPU's whole
    /// range in 8 steps).
    #[arg(long, value_name = "MAX:MIN:STEP", value_parser = |s: &str| CapSteps::parse(s))]
    pub caps: Option<CapSteps>,
    /// The load: `gemm` (compute-bound, FLOP/s) or `memory` (a device-to-device copy, B/s).
    /// (`--workload` is the simulated node's training workload, a global option.)
    #[arg(long = "load", value_name = "KIND", default_value = "gemm",
          value_parser = bench_load_parser())]
    pub load: BenchWorkload,
    /// How long each cap is measured (`30s`, `2m`).
    #[arg(long, value_name = "D", default_value = "30s", value_parser = parse_duration)]
    pub window: std::time::Duration,
    /// How long each cap is held before it is measured, for the clock and the temperature to
    /// settle.
    #[arg(long, value_name = "D", default_value = "10s", value_parser = parse_duration)]
    pub warmup: std::time::Duration,
    /// The result as JSON (schema in docs/bench.md).
    #[arg(long)]
    pub json: bool,
}

/// Options of `gpupilot bench burn`.
#[derive(Debug, Args, Clone)]
pub struct BurnArgs {
    /// The GPUs to burn, by index (`--gpu 0,2`); every GPU when left out.
    #[arg(long = "gpu", value_name = "I,J", value_delimiter = ',')]
    pub gpu: Vec<u32>,
    /// How long the load is held (`90s`, `10m`, `1h`).
    #[arg(long, value_name = "D", default_value = "10m", value_parser = parse_duration)]
    pub duration: std::time::Duration,
    /// The verdict as JSON (schema in docs/bench.md), and no live chart.
    #[arg(long)]
    pub json: bool,
}

fn bench_load_parser() -> impl clap::builder::TypedValueParser<Value = BenchWorkload> {
    clap::builder::PossibleValuesParser::new(["gemm", "memory"]).map(|s| match s.as_str() {
        "memory" => BenchWorkload::Memory,
        _ => BenchWorkload::Gemm,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn numbers_are_finite_and_plausible() {
        for bad in [
            "nan", "NaN", "inf", "-inf", "infinity", "1e308", "0", "-5", "x", "",
        ] {
            let e = parse_cap_w(bad).unwrap_err();
            assert!(e.contains("between 1 and 10000 W"), "{bad}: {e}");
            assert!(parse_budget(bad).is_err(), "budget {bad}");
        }
        assert_eq!(parse_cap_w("300"), Ok(300.0));
        assert_eq!(parse_cap_w("300W"), Ok(300.0));
        assert_eq!(parse_budget("2800"), Ok("2800".into()));
        assert_eq!(parse_budget("2800.5W"), Ok("2800.5".into()));
        assert_eq!(parse_budget("off"), Ok("off".into()));
        assert_eq!(parse_celsius("78"), Ok(78.0));
        assert_eq!(parse_celsius("78°C"), Ok(78.0));
        assert!(parse_celsius("nan").is_err() && parse_celsius("151").is_err());
        assert!(parse_celsius("-1").is_err());
        // The governor's bounds, as the daemon's: 20–120 °C.
        assert!(parse_celsius("19.5").is_err() && parse_celsius("120.5").is_err());
        assert_eq!(parse_celsius("120"), Ok(120.0));
        assert_eq!(parse_gpu_max("5"), Ok("5".into()));
        assert_eq!(parse_gpu_max("reset"), Ok("reset".into()));
        assert_eq!(parse_gpu_max("85"), Ok("85".into()));
        assert!(parse_gpu_max("inf").is_err());
        assert!(parse_margin("inf").is_err() && parse_margin("8") == Ok(8.0));
        assert!(parse_wait_s("nan").is_err() && parse_wait_s("-1").is_err());
        assert!(parse_window("0").is_err() && parse_step_w("nan").is_err());
        assert!(parse_grace("0").is_err() && parse_grace("5") == Ok(5.0));
        // The message quotes the text as typed, cut short, never a number of 300 digits.
        let huge = format!("1{}", "0".repeat(300));
        let e = parse_cap_w(&huge).unwrap_err();
        assert!(e.len() < 120 && e.contains("`1000000000"), "{e}");
        let e = parse_eta("nan").unwrap_err();
        assert!(e.starts_with("`nan` is not a weight eta"), "{e}");
        let e = parse_eta("2").unwrap_err();
        assert!(e.contains("between 0 and 1") && e.contains("`2`"), "{e}");
        // Through clap, as typed.
        assert!(Cli::try_parse_from(["gpupilot", "budget", "nan"]).is_err());
        assert!(Cli::try_parse_from(["gpupilot", "power", "cap", "inf"]).is_err());
        assert!(Cli::try_parse_from(["gpupilot", "thermal", "target", "nan"]).is_err());
        assert!(Cli::try_parse_from(["gpupilot", "stop", "x", "--grace", "nan"]).is_err());
        assert!(Cli::try_parse_from(["gpupilot", "thermal", "target", "78"]).is_ok());
    }

    #[test]
    fn refresh_bounds() {
        assert!(Cli::try_parse_from(["gpupilot", "demo", "--refresh", "0.01"]).is_err());
        assert!(Cli::try_parse_from(["gpupilot", "demo", "--refresh", "x"]).is_err());
        let cli =
            Cli::try_parse_from(["gpupilot", "demo", "--refresh", "2", "--gpus", "8"]).unwrap();
        assert_eq!(cli.global.sim.gpus, 8);
        assert!(matches!(cli.command, Some(Command::Demo(_))));
        assert_eq!(cli.global.refresh, 2.0);
        // `top` is the console, and `daemon stop` stops the daemon.
        let cli = Cli::try_parse_from(["gpupilot", "top", "--refresh", "2"]).unwrap();
        assert!(matches!(cli.command, Some(Command::Top)));
        let cli = Cli::try_parse_from(["gpupilot", "daemon", "stop", "--wait", "3"]).unwrap();
        let Some(Command::Daemon(d)) = cli.command else {
            panic!("not daemon")
        };
        assert!(matches!(d.action, Some(DaemonCommand::Stop { wait }) if wait == 3.0));
        let cli = Cli::try_parse_from(["gpupilot", "demo", "--home", "/x"]).unwrap();
        let Some(Command::Demo(demo)) = cli.command else {
            panic!("not demo")
        };
        assert_eq!(demo.home, Some(PathBuf::from("/x")));
        // The console's other ways in take it too.
        let cli = Cli::try_parse_from(["gpupilot", "--refresh", "0.5"]).unwrap();
        assert!(cli.command.is_none() && cli.global.refresh == 0.5);
        let cli = Cli::try_parse_from(["gpupilot", "attach", "--refresh", "3", "last"]).unwrap();
        assert!(matches!(cli.command, Some(Command::Attach(_))) && cli.global.refresh == 3.0);
        let cli = Cli::try_parse_from(["gpupilot", "run", "--refresh", "3", "--", "x"]).unwrap();
        assert!(matches!(cli.command, Some(Command::Run(_))) && cli.global.refresh == 3.0);
        assert_eq!(
            Cli::try_parse_from(["gpupilot"]).unwrap().global.refresh,
            1.0
        );
        assert!(Cli::try_parse_from(["gpupilot", "status", "--gpus", "0"]).is_err());
    }

    #[test]
    fn run_takes_a_profile_or_a_command() {
        let cli =
            Cli::try_parse_from(["gpupilot", "run", "--detach", "--", "python3", "-u", "t.py"])
                .unwrap();
        let Some(Command::Run(r)) = cli.command else {
            panic!("not run")
        };
        assert_eq!(r.command, ["python3", "-u", "t.py"]);
        assert!(r.detach && r.profile.is_none());
        let cli = Cli::try_parse_from(["gpupilot", "run", "p.toml"]).unwrap();
        assert!(matches!(
            cli.command,
            Some(Command::Run(RunArgs {
                profile: Some(_),
                ..
            }))
        ));
        assert!(
            Cli::try_parse_from(["gpupilot", "run"]).is_err(),
            "nothing to run"
        );
        assert!(Cli::try_parse_from(["gpupilot", "run", "p.toml", "--", "x"]).is_err());
        let cli =
            Cli::try_parse_from(["gpupilot", "--source", "sim", "daemon", "--readonly"]).unwrap();
        assert!(matches!(
            cli.command,
            Some(Command::Daemon(DaemonArgs {
                readonly: true,
                detach: false,
                ..
            }))
        ));
        assert!(Cli::try_parse_from(["gpupilot", "daemon", "--rate", "0"]).is_err());
        let cli = Cli::try_parse_from(["gpupilot", "logs", "last", "-f", "--stderr"]).unwrap();
        assert!(matches!(
            cli.command,
            Some(Command::Logs(LogsArgs {
                follow: true,
                stderr: true,
                ..
            }))
        ));
        let cli = Cli::try_parse_from(["gpupilot", "logs", "last", "--rank", "3"]).unwrap();
        assert!(matches!(
            cli.command,
            Some(Command::Logs(LogsArgs {
                rank: Some(3),
                follow: false,
                ..
            }))
        ));
        for bad in ["x", "-1", "1.5", ""] {
            assert!(
                Cli::try_parse_from(["gpupilot", "logs", "last", "--rank", bad]).is_err(),
                "{bad}"
            );
        }
        let cli =
            Cli::try_parse_from(["gpupilot", "daemon", "--system", "--allow-group", "gpu-ops"])
                .unwrap();
        assert!(cli.global.system);
        let Some(Command::Daemon(d)) = cli.command else {
            panic!("not daemon")
        };
        assert_eq!(d.allow_group.as_deref(), Some("gpu-ops"));
        let cli = Cli::try_parse_from(["gpupilot", "power", "cap", "300", "--system"]).unwrap();
        assert!(cli.global.system, "--system is global");
        let cli = Cli::try_parse_from([
            "gpupilot",
            "ranks",
            "--nproc",
            "3",
            "--",
            "sh",
            "-c",
            "echo $RANK",
            "--nproc",
        ])
        .unwrap();
        let Some(Command::Ranks(r)) = cli.command else {
            panic!("not ranks")
        };
        assert_eq!(
            (r.nproc, r.master_addr.as_str(), r.master_port, r.grace),
            (3, "127.0.0.1", 0, 10.0)
        );
        assert_eq!(r.command, ["sh", "-c", "echo $RANK", "--nproc"]);
        assert!(Cli::try_parse_from(["gpupilot", "ranks", "--nproc", "2"]).is_err());
        assert!(Cli::try_parse_from(["gpupilot", "ranks", "--nproc", "0", "--", "t"]).is_err());
        assert!(Cli::try_parse_from(["gpupilot", "ranks", "--nproc", "257", "--", "t"]).is_err());
        assert!(
            Cli::try_parse_from([
                "gpupilot", "ranks", "--nproc", "2", "--grace", "0", "--", "t"
            ])
            .is_err()
        );
        let cli = Cli::try_parse_from(["gpupilot", "profile", "check", "x.toml"]).unwrap();
        assert!(matches!(
            cli.command,
            Some(Command::Profile(ProfileCommand::Check { .. }))
        ));
    }
}
