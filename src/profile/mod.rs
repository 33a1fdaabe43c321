//! Profiles: what to run and how (`profiles/*.toml`, format in `docs/profiles.md`).
//!
//! A profile file says the command, its working directory and environment, the GPUs it sees, the
//! launcher (local, N local ranks, torchrun or Slurm), the restart policy, the knobs a trainer may have changed live
//! (batch size, prefetch depth) with their ranges, `[power]`, `[thermal]` and `[alerts]` for the
//! control loops, and `[energy]` (price, grid intensity, PUE) for the run's cost and CO2. `extends = "other"` layers one profile over another.
//!
//! Loading is strict: an unknown key, a value of the wrong type or a value that makes no sense is
//! an error naming `FILE:LINE:COL`. This module only reads and checks files; it starts nothing
//! (that is [`crate::supervisor`]) and reads no environment.
//!
//! - `raw`: the file as written (serde structs that remember spans), and `extends` merging.
//! - `load`: finding files, following `extends`, detecting cycles, the shipped profiles.
//! - `validate`: raw → [`Profile`], with every problem reported at once.
//! - `write`: [`Profile`] → TOML (a run's `run.toml`, itself a valid profile).
//! - `error`: [`ProfileError`] and [`Diagnostic`].
//! - `energy`: [`EnergySettings`] (`[energy]`) and the bounds of a PUE and a grid intensity,
//!   which control.toml's `[energy]` shares.
//! - `command_line`: the profile of `run -- CMD…`, its knobs declared with `--knob`.
//! - `visible`: [`VisibleGpus`], the one parser of `CUDA_VISIBLE_DEVICES` (an empty list is no
//!   GPU, never every GPU).

mod command_line;
mod energy;
mod error;
mod load;
mod raw;
mod validate;
mod visible;
mod write;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use command_line::KnobDecl;
pub use energy::{EnergySettings, MAX_GRID_CO2_G_PER_KWH, MAX_PUE, check_grid_co2, check_pue};
pub use error::{Diagnostic, ProfileError};
pub use load::{Loader, SHIPPED};
pub use visible::{GpuName, UnknownGpu, VisibleGpus};

/// Load and check the profile at `path`, following `extends` (the file's own directory first,
/// then the shipped profiles). This is `gpupilot profile check FILE`.
pub fn check(path: impl AsRef<Path>) -> Result<Profile, ProfileError> {
    Loader::new().load(path.as_ref())
}

/// Parse profile text that has no file (tests, a profile sent over the socket). `extends` is
/// resolved against the shipped profiles only; `display` names it in messages.
pub fn parse_str(display: &str, text: &str) -> Result<Profile, ProfileError> {
    Loader::new().load_str(display, text)
}

/// A checked profile with `extends` resolved: everything a run needs, defaults filled in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// `name` from the file, else the file's stem; used in run ids. `[A-Za-z0-9._-]+`.
    pub name: String,
    /// The file it was loaded from (absent for a profile built from `-- CMD…`).
    pub source: Option<PathBuf>,
    pub description: Option<String>,
    pub run: RunSpec,
    pub knobs: Knobs,
    pub power: PowerSettings,
    pub thermal: ThermalSettings,
    pub alerts: AlertSettings,
    #[serde(default)]
    pub metrics: MetricsSettings,
    #[serde(default)]
    pub energy: EnergySettings,
}

/// `[metrics]`: how training metrics are read from a run's output (for scripts that do not
/// use the SDK).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetricsSettings {
    /// Lines of stdout that are JSON objects are read as metrics reports (default true).
    pub json: bool,
    /// Regular expressions whose named groups (`loss`, `step`, `samples_per_s`, … or any name,
    /// kept as an extra) are read from each line of stdout: `loss=(?P<loss>[0-9.]+)`.
    pub patterns: Vec<String>,
    /// The training framework whose log lines are read for metrics (`auto`: whichever one's
    /// lines the run prints first; `none`: no framework's).
    #[serde(default)]
    pub preset: MetricsPreset,
}

impl Default for MetricsSettings {
    fn default() -> Self {
        MetricsSettings {
            json: true,
            patterns: Vec::new(),
            preset: MetricsPreset::Auto,
        }
    }
}

/// `[metrics] preset`: a training framework whose own log lines gpupilot reads without a
/// pattern (the daemon's `metric_presets` holds the readers).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetricsPreset {
    /// Any framework below, the first whose lines the run prints.
    #[default]
    Auto,
    /// None: only JSON lines and patterns.
    None,
    /// Hugging Face `transformers.Trainer`'s log dicts.
    Transformers,
    /// PyTorch Lightning's progress bar lines.
    Lightning,
    /// torchtitan's step lines.
    Torchtitan,
}

impl MetricsPreset {
    /// Every preset, as a profile names it.
    pub const ALL: [MetricsPreset; 5] = [
        MetricsPreset::Auto,
        MetricsPreset::None,
        MetricsPreset::Transformers,
        MetricsPreset::Lightning,
        MetricsPreset::Torchtitan,
    ];

    /// The profile's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            MetricsPreset::Auto => "auto",
            MetricsPreset::None => "none",
            MetricsPreset::Transformers => "transformers",
            MetricsPreset::Lightning => "lightning",
            MetricsPreset::Torchtitan => "torchtitan",
        }
    }

    /// The preset a profile names, if any.
    pub fn parse(name: &str) -> Option<MetricsPreset> {
        MetricsPreset::ALL.into_iter().find(|p| p.as_str() == name)
    }
}

/// `[run]`: what to start and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSpec {
    pub command: CommandSpec,
    /// Absent: the caller's working directory. A relative path in a file is made absolute
    /// against that file's directory at load time; relative in a shipped profile, it is taken
    /// against the caller's directory at launch.
    pub cwd: Option<PathBuf>,
    /// Added over the caller's environment (values are literal; no `$VAR` expansion).
    pub env: BTreeMap<String, String>,
    pub gpus: GpuSelection,
    pub launcher: Launcher,
    pub restart: RestartPolicy,
    /// Arguments added to the command on every restart (`--resume {run_dir}/last.ckpt`), so a
    /// restarted run continues from its checkpoint. Placeholders as in the command.
    #[serde(default)]
    pub resume_args: Vec<String>,
}

/// The command: an argv (run directly, no shell), or a script for `sh -c` (`shell = true`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CommandSpec {
    Argv(Vec<String>),
    Shell(String),
}

impl CommandSpec {
    /// The words to show a person (the script for a shell command).
    pub fn display(&self) -> String {
        match self {
            CommandSpec::Argv(argv) => shell_words::join(argv),
            CommandSpec::Shell(script) => format!("sh -c {}", shell_words::quote(script)),
        }
    }
}

/// Which GPUs the run sees, through `CUDA_VISIBLE_DEVICES`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuSelection {
    /// `gpus` not set: the caller's `CUDA_VISIBLE_DEVICES`, if any, passes through.
    Inherit,
    /// `gpus = "all"`: `CUDA_VISIBLE_DEVICES` is removed, so every GPU is visible.
    All,
    /// `gpus = [0, 2]`: `CUDA_VISIBLE_DEVICES=0,2` (`[]` hides every GPU).
    List(Vec<u32>),
}

/// How the command is started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Launcher {
    /// The command itself is the run.
    Local,
    /// `torchrun … COMMAND…`: the command is the training script and its arguments.
    Torchrun(TorchrunSpec),
    /// A Slurm batch job running `srun torchrun … COMMAND…` (see `supervisor::slurm`).
    Slurm(SlurmSpec),
    /// `gpupilot ranks … -- COMMAND…`: N copies of the command on this node, each with
    /// torchrun's environment (see `supervisor::ranks`); for where torchrun is missing or broken.
    Ranks(RanksSpec),
}

/// `[run.ranks]`: N local ranks started by gpupilot itself with the environment torchrun gives
/// its workers (`RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, …).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RanksSpec {
    /// Ranks on this node (1..=256): `WORLD_SIZE` and `LOCAL_WORLD_SIZE`.
    pub nproc: u32,
    /// `MASTER_ADDR` (default `127.0.0.1`).
    pub master_addr: String,
    /// `MASTER_PORT`; absent: a free loopback port picked at each start.
    pub master_port: Option<u16>,
    /// Seconds the other ranks get between SIGTERM and SIGKILL once one rank has failed.
    pub grace_s: f64,
}

impl RanksSpec {
    /// The most ranks one node may start.
    pub const MAX_NPROC: u32 = 256;
    /// `MASTER_ADDR` when the profile does not say.
    pub const DEFAULT_MASTER_ADDR: &str = "127.0.0.1";
    /// `grace_s` when the profile does not say.
    pub const DEFAULT_GRACE_S: f64 = 10.0;
}

/// `[run.slurm]`: the job gpupilot submits with `sbatch` (see `docs/slurm.md`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlurmSpec {
    /// `--nodes`.
    pub nodes: u32,
    /// `--gpus-per-node` (left out when 0: a CPU-only partition).
    pub gpus_per_node: u32,
    /// torchrun's `--nproc-per-node`; defaults to `gpus_per_node` (1 when that is 0).
    pub nproc_per_node: u32,
    /// `--partition`; absent: the cluster's default partition.
    pub partition: Option<String>,
    /// `--time` (`"01:00:00"`, `"2-00:00:00"`, minutes); absent: the partition's default.
    pub time_limit: Option<String>,
    /// `--account`.
    pub account: Option<String>,
    /// More `#SBATCH` options, one a line (`"--constraint=h100"`, `"--exclusive"`).
    pub sbatch_args: Vec<String>,
    /// The port of the c10d rendezvous on the job's first node (default 29500).
    pub rdzv_port: u16,
    /// How to call torchrun inside the job; default `["torchrun"]`.
    pub program: Vec<String>,
    /// More torchrun flags, placed before the script.
    pub args: Vec<String>,
}

/// `[run.torchrun]`: the torchrun options gpupilot passes (see `supervisor::launch`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TorchrunSpec {
    pub nproc_per_node: u32,
    pub nnodes: u32,
    /// `--standalone` (a local rendezvous); the default when `nnodes = 1` and no endpoint.
    pub standalone: bool,
    pub rdzv_backend: Option<String>,
    pub rdzv_endpoint: Option<String>,
    pub rdzv_id: Option<String>,
    /// torchrun's own worker restarts (`--max-restarts`); gpupilot's are `[run.restart]`.
    pub max_restarts: Option<u32>,
    /// `-m`: the command's first word is a module, not a script.
    pub module: bool,
    /// `--no-python`: the command's first word is a program, not a Python script.
    pub no_python: bool,
    /// How to call torchrun; default `["torchrun"]`.
    pub program: Vec<String>,
    /// More torchrun flags, placed before the script.
    pub args: Vec<String>,
}

/// When a run that ended is started again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RestartMode {
    Never,
    /// After a non-zero exit or death by a signal that gpupilot did not send.
    OnFailure,
    /// After every end that was not a stop the user asked for.
    Always,
}

/// `[run.restart]`: the policy `supervisor::restart::next_action` applies.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RestartPolicy {
    pub mode: RestartMode,
    /// Restarts allowed over the run's life (0: none).
    pub max_restarts: u32,
    /// Wait before the first restart; each further one waits `backoff_factor` times longer,
    /// up to `backoff_max_s`.
    pub backoff_s: f64,
    pub backoff_factor: f64,
    pub backoff_max_s: f64,
    /// What an out-of-memory end does (the trainer said `oom`, or the output says so).
    #[serde(default)]
    pub on_oom: OnOom,
}

/// `[run.restart] on_oom`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnOom {
    /// Treated like any other failure (the restart policy decides).
    #[default]
    Fail,
    /// Restart at once with half the batch size (not below the knob's min), whatever the
    /// policy's mode; counts against `max_restarts`.
    HalveBatch,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        RestartPolicy {
            mode: RestartMode::Never,
            max_restarts: 3,
            backoff_s: 1.0,
            backoff_factor: 2.0,
            backoff_max_s: 300.0,
            on_oom: OnOom::Fail,
        }
    }
}

/// `[knobs]`: values the trainer may be asked to change while it runs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Knobs {
    pub batch_size: Option<Knob>,
    pub prefetch: Option<Knob>,
}

/// One knob: its starting value and the range a change must stay in (inclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Knob {
    pub initial: i64,
    pub min: i64,
    /// Absent: no upper bound.
    pub max: Option<i64>,
}

impl Knob {
    /// Whether `v` is an allowed value.
    pub fn allows(&self, v: i64) -> bool {
        v >= self.min && self.max.is_none_or(|m| v <= m)
    }
}

/// `[power]`: `cap_w` is set on the run's GPUs while it lives (`daemon::run_power`);
/// `node_budget_w` is the control loops' budget while it lives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PowerSettings {
    /// Power cap for the run's GPUs, in watts.
    pub cap_w: Option<f64>,
    /// Put the original caps back when the run ends (default true).
    pub restore_on_exit: bool,
    /// The node's power budget in watts (sum of all caps).
    pub node_budget_w: Option<f64>,
}

impl Default for PowerSettings {
    fn default() -> Self {
        PowerSettings {
            cap_w: None,
            restore_on_exit: true,
            node_budget_w: None,
        }
    }
}

/// `[thermal]` (placeholder for the governor).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ThermalSettings {
    pub target: Option<ThermalTarget>,
}

/// The temperature the governor holds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ThermalTarget {
    /// `target_c`: degrees Celsius.
    Celsius(f64),
    /// `margin_c`: degrees below each GPU's slowdown threshold.
    BelowSlowdown(f64),
}

/// `[alerts]` (placeholder for alerting).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AlertSettings {
    pub temp_c: Option<f64>,
    pub power_w: Option<f64>,
    /// No progress (output or metrics) for this long.
    pub stalled_after_s: Option<f64>,
    /// A program to run on an alert (argv, never through a shell).
    pub hook: Option<Vec<String>>,
}

impl Profile {
    /// The profile behind `gpupilot run -- CMD…`: the argv as given, every default.
    pub fn from_command(argv: Vec<String>) -> Profile {
        Profile {
            name: name_for_command(&argv),
            source: None,
            description: None,
            run: RunSpec {
                command: CommandSpec::Argv(argv),
                cwd: None,
                env: BTreeMap::new(),
                gpus: GpuSelection::Inherit,
                launcher: Launcher::Local,
                restart: RestartPolicy::default(),
                resume_args: Vec::new(),
            },
            knobs: Knobs::default(),
            power: PowerSettings::default(),
            thermal: ThermalSettings::default(),
            alerts: AlertSettings::default(),
            metrics: MetricsSettings::default(),
            energy: EnergySettings::default(),
        }
    }

    /// The profile as TOML in the profile format, `extends` resolved: a run's `run.toml`.
    /// Loading it again gives back an equal profile (except `source`).
    pub fn to_toml(&self) -> String {
        write::to_toml(self)
    }
}

/// A name for a command-line run: the script's stem (`train.py` → `train`) when the command
/// runs one, else the program's file name; cleaned to `[A-Za-z0-9._-]`.
pub fn name_for_command(argv: &[String]) -> String {
    let script = argv
        .iter()
        .find(|a| !a.starts_with('-') && [".py", ".sh"].iter().any(|ext| a.ends_with(ext)));
    let word = script.or(argv.first()).map(String::as_str).unwrap_or("run");
    let file = Path::new(word)
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_else(|| "run".into());
    let stem = file
        .strip_suffix(".py")
        .or_else(|| file.strip_suffix(".sh"))
        .unwrap_or(&file);
    let clean: String = stem
        .chars()
        .take(MAX_NAME_LEN)
        .map(|c| if is_name_char(c) { c } else { '-' })
        .collect();
    let clean = clean.trim_matches('-').to_string();
    if clean.is_empty() {
        "run".into()
    } else {
        clean
    }
}

pub(crate) fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// The longest run name: it becomes part of a run's id and of its directory's name.
pub const MAX_NAME_LEN: usize = 64;

/// Whether `name` may name runs: 1 to [`MAX_NAME_LEN`] letters, digits, `.`, `_` and `-`;
/// else what a name must be.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("give a name of letters, digits, '.', '_' and '-'".into());
    }
    let len = name.chars().count();
    if len > MAX_NAME_LEN {
        return Err(format!(
            "at most {MAX_NAME_LEN} characters, not {len} (it becomes part of run ids)"
        ));
    }
    if !name.chars().all(is_name_char) {
        return Err(
            "use letters, digits, '.', '_' and '-' only (it becomes part of run ids)".into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(words: &[&str]) -> Vec<String> {
        words.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn command_names() {
        assert_eq!(
            name_for_command(&v(&["python3", "examples/train_simple.py", "--x"])),
            "train_simple"
        );
        assert_eq!(name_for_command(&v(&["sleep", "10"])), "sleep");
        assert_eq!(name_for_command(&v(&["/usr/bin/my prog"])), "my-prog");
        assert_eq!(name_for_command(&[]), "run");
    }

    #[test]
    fn a_metrics_preset_is_named_or_refused_with_the_names() {
        let p = parse_str("p", "[run]\ncommand = \"x\"\n").unwrap();
        assert_eq!(p.metrics.preset, MetricsPreset::Auto);
        let p = parse_str(
            "p",
            "[run]\ncommand = \"x\"\n[metrics]\npreset = \"transformers\"\n",
        )
        .unwrap();
        assert_eq!(p.metrics.preset, MetricsPreset::Transformers);
        let err = parse_str(
            "p",
            "[run]\ncommand = \"x\"\n[metrics]\npreset = \"keras\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("unknown metrics preset \"keras\""), "{err}");
        assert!(err.contains("transformers, lightning, torchtitan"), "{err}");
        assert!(err.contains("p:4:"), "where: {err}");
    }

    #[test]
    fn knob_range() {
        let k = Knob {
            initial: 4,
            min: 1,
            max: Some(8),
        };
        assert!(k.allows(1) && k.allows(8) && !k.allows(0) && !k.allows(9));
        let k = Knob {
            initial: 4,
            min: 0,
            max: None,
        };
        assert!(k.allows(i64::MAX));
    }
}
