//! The profile file as written: every field optional, every value remembering where it came
//! from, so that validation after `extends` merging can still point at the right file, line and
//! column. Nothing here judges values; `validate` does.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

thread_local! {
    /// Index of the file being deserialized on this thread. `At<T>` records it so that values
    /// merged from several files keep their origin. Set only by [`parse_file`].
    static CURRENT_FILE: Cell<usize> = const { Cell::new(0) };
}

/// A value with its byte span and the index of the file it was read from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct At<T> {
    pub value: T,
    pub span: Range<usize>,
    pub file: usize,
}

impl<T> At<T> {
    /// A value that comes from no file (a built profile being written out).
    pub fn bare(value: T) -> Self {
        At {
            value,
            span: 0..0,
            file: usize::MAX,
        }
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for At<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let spanned = toml::Spanned::<T>::deserialize(d)?;
        Ok(At {
            span: spanned.span(),
            value: spanned.into_inner(),
            file: CURRENT_FILE.with(Cell::get),
        })
    }
}

impl<T: Serialize> Serialize for At<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.value.serialize(s)
    }
}

/// Parse one file's text; `file` is its index in the loader's file list.
pub(crate) fn parse_file(text: &str, file: usize) -> Result<RawProfile, toml::de::Error> {
    let previous = CURRENT_FILE.with(|c| c.replace(file));
    let result = toml::from_str(text);
    CURRENT_FILE.with(|c| c.set(previous));
    result
}

/// `command` (and `alerts.hook`): an argv array, or one string.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum CommandValue {
    Argv(Vec<String>),
    Line(String),
}

impl<'de> Deserialize<'de> for CommandValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = CommandValue;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    r#"a command: an array of strings like ["python3", "train.py"], or one string"#,
                )
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<CommandValue, E> {
                Ok(CommandValue::Line(v.to_string()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<CommandValue, A::Error> {
                let mut argv = Vec::new();
                while let Some(arg) = seq.next_element::<String>()? {
                    argv.push(arg);
                }
                Ok(CommandValue::Argv(argv))
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for CommandValue {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            CommandValue::Argv(v) => v.serialize(s),
            CommandValue::Line(l) => l.serialize(s),
        }
    }
}

/// `gpus`: `"all"` or a list of indices (kept signed so a negative index gets a clear message).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum GpusValue {
    All,
    List(Vec<i64>),
}

impl<'de> Deserialize<'de> for GpusValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = GpusValue;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(r#"GPU indices like [0, 1], or "all""#)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<GpusValue, E> {
                if v == "all" {
                    Ok(GpusValue::All)
                } else {
                    Err(E::invalid_value(de::Unexpected::Str(v), &self))
                }
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<GpusValue, A::Error> {
                let mut list = Vec::new();
                while let Some(i) = seq.next_element::<i64>()? {
                    list.push(i);
                }
                Ok(GpusValue::List(list))
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for GpusValue {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            GpusValue::All => "all".serialize(s),
            GpusValue::List(l) => l.serialize(s),
        }
    }
}

/// The whole file.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawProfile {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extends: Option<At<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<At<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run: Option<RawRun>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub knobs: Option<RawKnobs>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub power: Option<RawPower>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thermal: Option<RawThermal>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alerts: Option<RawAlerts>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<RawMetrics>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub energy: Option<RawEnergy>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawEnergy {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub price_per_kwh: Option<At<f64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub currency: Option<At<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grid_co2_g_per_kwh: Option<At<f64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pue: Option<At<f64>>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMetrics {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub json: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patterns: Option<Vec<At<String>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preset: Option<At<String>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawOnOom {
    Fail,
    HalveBatch,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum LauncherKind {
    Local,
    Torchrun,
    Slurm,
    Ranks,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum RawRestartMode {
    Never,
    OnFailure,
    Always,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRun {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<At<CommandValue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shell: Option<At<bool>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<At<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpus: Option<At<GpusValue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub launcher: Option<At<LauncherKind>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub env: Option<BTreeMap<String, At<String>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub torchrun: Option<At<RawTorchrun>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slurm: Option<At<RawSlurm>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ranks: Option<At<RawRanks>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restart: Option<RawRestart>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resume_args: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTorchrun {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nproc_per_node: Option<At<i64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nnodes: Option<At<i64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub standalone: Option<At<bool>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rdzv_backend: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rdzv_endpoint: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rdzv_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_restarts: Option<At<i64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub module: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_python: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub program: Option<At<CommandValue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,
}

/// `[run.slurm]`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSlurm {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodes: Option<At<i64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpus_per_node: Option<At<i64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nproc_per_node: Option<At<i64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<At<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_limit: Option<At<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub account: Option<At<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sbatch_args: Option<At<Vec<String>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rdzv_port: Option<At<i64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub program: Option<At<CommandValue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,
}

/// `[run.ranks]`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRanks {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nproc: Option<At<i64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub master_addr: Option<At<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub master_port: Option<At<i64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grace_s: Option<At<f64>>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRestart {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<At<RawRestartMode>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_restarts: Option<At<i64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backoff_s: Option<At<f64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backoff_factor: Option<At<f64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backoff_max_s: Option<At<f64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_oom: Option<At<RawOnOom>>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawKnobs {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_size: Option<At<RawKnob>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefetch: Option<At<RawKnob>>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawKnob {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub initial: Option<At<i64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min: Option<At<i64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max: Option<At<i64>>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPower {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cap_w: Option<At<f64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restore_on_exit: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_budget_w: Option<At<f64>>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawThermal {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_c: Option<At<f64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub margin_c: Option<At<f64>>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAlerts {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temp_c: Option<At<f64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub power_w: Option<At<f64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stalled_after_s: Option<At<f64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hook: Option<At<CommandValue>>,
}

// ---- merging: the child (`self`) wins field by field over the profile it extends ----

fn pick<T>(child: Option<T>, parent: Option<T>) -> Option<T> {
    child.or(parent)
}

fn nested<T>(child: Option<T>, parent: Option<T>, merge: impl FnOnce(T, T) -> T) -> Option<T> {
    match (child, parent) {
        (Some(c), Some(p)) => Some(merge(c, p)),
        (c, p) => c.or(p),
    }
}

fn nested_at<T>(
    child: Option<At<T>>,
    parent: Option<At<T>>,
    merge: impl FnOnce(T, T) -> T,
) -> Option<At<T>> {
    nested(child, parent, |c, p| At {
        value: merge(c.value, p.value),
        span: c.span,
        file: c.file,
    })
}

impl RawProfile {
    /// Merge `parent` under `self`. `name` and `extends` are not inherited: they belong to the
    /// file that says them.
    pub fn merge_over(self, parent: RawProfile) -> RawProfile {
        RawProfile {
            extends: None,
            name: self.name,
            description: pick(self.description, parent.description),
            run: nested(self.run, parent.run, RawRun::merge_over),
            knobs: nested(self.knobs, parent.knobs, RawKnobs::merge_over),
            power: nested(self.power, parent.power, |c, p| RawPower {
                cap_w: pick(c.cap_w, p.cap_w),
                restore_on_exit: pick(c.restore_on_exit, p.restore_on_exit),
                node_budget_w: pick(c.node_budget_w, p.node_budget_w),
            }),
            // target_c and margin_c are two ways to say one thing: a child that says either
            // replaces the parent's choice instead of ending up with both.
            thermal: nested(self.thermal, parent.thermal, |c, p| {
                if c.target_c.is_some() || c.margin_c.is_some() {
                    c
                } else {
                    p
                }
            }),
            alerts: nested(self.alerts, parent.alerts, |c, p| RawAlerts {
                temp_c: pick(c.temp_c, p.temp_c),
                power_w: pick(c.power_w, p.power_w),
                stalled_after_s: pick(c.stalled_after_s, p.stalled_after_s),
                hook: pick(c.hook, p.hook),
            }),
            metrics: nested(self.metrics, parent.metrics, |c, p| RawMetrics {
                json: pick(c.json, p.json),
                patterns: pick(c.patterns, p.patterns),
                preset: pick(c.preset, p.preset),
            }),
            energy: nested(self.energy, parent.energy, |c, p| RawEnergy {
                price_per_kwh: pick(c.price_per_kwh, p.price_per_kwh),
                currency: pick(c.currency, p.currency),
                grid_co2_g_per_kwh: pick(c.grid_co2_g_per_kwh, p.grid_co2_g_per_kwh),
                pue: pick(c.pue, p.pue),
            }),
        }
    }
}

impl RawRun {
    fn merge_over(self, p: RawRun) -> RawRun {
        RawRun {
            command: pick(self.command, p.command),
            shell: pick(self.shell, p.shell),
            cwd: pick(self.cwd, p.cwd),
            gpus: pick(self.gpus, p.gpus),
            launcher: pick(self.launcher, p.launcher),
            env: nested(self.env, p.env, |c, mut p| {
                p.extend(c);
                p
            }),
            torchrun: nested_at(self.torchrun, p.torchrun, |c, p| RawTorchrun {
                nproc_per_node: pick(c.nproc_per_node, p.nproc_per_node),
                nnodes: pick(c.nnodes, p.nnodes),
                standalone: pick(c.standalone, p.standalone),
                rdzv_backend: pick(c.rdzv_backend, p.rdzv_backend),
                rdzv_endpoint: pick(c.rdzv_endpoint, p.rdzv_endpoint),
                rdzv_id: pick(c.rdzv_id, p.rdzv_id),
                max_restarts: pick(c.max_restarts, p.max_restarts),
                module: pick(c.module, p.module),
                no_python: pick(c.no_python, p.no_python),
                program: pick(c.program, p.program),
                args: pick(c.args, p.args),
            }),
            slurm: nested_at(self.slurm, p.slurm, |c, p| RawSlurm {
                nodes: pick(c.nodes, p.nodes),
                gpus_per_node: pick(c.gpus_per_node, p.gpus_per_node),
                nproc_per_node: pick(c.nproc_per_node, p.nproc_per_node),
                partition: pick(c.partition, p.partition),
                time_limit: pick(c.time_limit, p.time_limit),
                account: pick(c.account, p.account),
                sbatch_args: pick(c.sbatch_args, p.sbatch_args),
                rdzv_port: pick(c.rdzv_port, p.rdzv_port),
                program: pick(c.program, p.program),
                args: pick(c.args, p.args),
            }),
            ranks: nested_at(self.ranks, p.ranks, |c, p| RawRanks {
                nproc: pick(c.nproc, p.nproc),
                master_addr: pick(c.master_addr, p.master_addr),
                master_port: pick(c.master_port, p.master_port),
                grace_s: pick(c.grace_s, p.grace_s),
            }),
            restart: nested(self.restart, p.restart, |c, p| RawRestart {
                policy: pick(c.policy, p.policy),
                max_restarts: pick(c.max_restarts, p.max_restarts),
                backoff_s: pick(c.backoff_s, p.backoff_s),
                backoff_factor: pick(c.backoff_factor, p.backoff_factor),
                backoff_max_s: pick(c.backoff_max_s, p.backoff_max_s),
                on_oom: pick(c.on_oom, p.on_oom),
            }),
            resume_args: pick(self.resume_args, p.resume_args),
        }
    }
}

impl RawKnobs {
    fn merge_over(self, p: RawKnobs) -> RawKnobs {
        let knob = |c: RawKnob, p: RawKnob| RawKnob {
            initial: pick(c.initial, p.initial),
            min: pick(c.min, p.min),
            max: pick(c.max, p.max),
        };
        RawKnobs {
            batch_size: nested_at(self.batch_size, p.batch_size, knob),
            prefetch: nested_at(self.prefetch, p.prefetch, knob),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_and_file_index_are_recorded() {
        let text = "[run]\ncommand = [\"a\", \"b\"]\n";
        let raw = parse_file(text, 7).unwrap();
        let cmd = raw.run.unwrap().command.unwrap();
        assert_eq!(cmd.file, 7);
        assert_eq!(&text[cmd.span.clone()], "[\"a\", \"b\"]");
        assert_eq!(cmd.value, CommandValue::Argv(vec!["a".into(), "b".into()]));
    }

    #[test]
    fn unknown_key_error_has_a_span_on_the_key() {
        let text = "[run]\ncomand = \"x\"\n";
        let err = parse_file(text, 0).unwrap_err();
        let span = err.span().unwrap();
        assert_eq!(&text[span], "comand");
        assert!(
            err.message().contains("unknown field `comand`"),
            "{}",
            err.message()
        );
    }

    #[test]
    fn child_overrides_field_by_field_and_env_merges() {
        let parent = parse_file(
            "[run]\ncommand = \"p\"\ncwd = \"/p\"\nenv = { A = \"1\", B = \"2\" }\n\
             [knobs.batch_size]\ninitial = 8\nmax = 64\n",
            0,
        )
        .unwrap();
        let child = parse_file(
            "[run]\ncwd = \"/c\"\nenv = { B = \"3\" }\n[knobs.batch_size]\ninitial = 16\n",
            1,
        )
        .unwrap();
        let m = child.merge_over(parent);
        let run = m.run.unwrap();
        assert_eq!(run.command.unwrap().value, CommandValue::Line("p".into()));
        let cwd = run.cwd.unwrap();
        assert_eq!((cwd.value.as_str(), cwd.file), ("/c", 1));
        let env: Vec<_> = run
            .env
            .unwrap()
            .into_iter()
            .map(|(k, v)| (k, v.value))
            .collect();
        assert_eq!(env, [("A".into(), "1".into()), ("B".into(), "3".into())]);
        let bs = m.knobs.unwrap().batch_size.unwrap().value;
        assert_eq!(bs.initial.unwrap().value, 16);
        assert_eq!(bs.max.unwrap().value, 64);
    }
}
