//! [`Profile`] back to TOML in the profile format, `extends` resolved and defaults spelled out,
//! so a run's `run.toml` says exactly what ran and `gpupilot profile check` accepts it.

use super::raw::{
    At, CommandValue, GpusValue, LauncherKind, RawAlerts, RawEnergy, RawKnob, RawKnobs, RawMetrics,
    RawOnOom, RawPower, RawProfile, RawRanks, RawRestart, RawRestartMode, RawRun, RawSlurm,
    RawThermal, RawTorchrun,
};
use super::{
    CommandSpec, GpuSelection, Knob, Launcher, OnOom, Profile, RestartMode, ThermalTarget,
};

pub(crate) fn to_toml(p: &Profile) -> String {
    let r = &p.run;
    let (command, shell) = match &r.command {
        CommandSpec::Argv(argv) => (CommandValue::Argv(argv.clone()), None),
        CommandSpec::Shell(script) => (CommandValue::Line(script.clone()), Some(At::bare(true))),
    };
    let gpus = match &r.gpus {
        GpuSelection::Inherit => None,
        GpuSelection::All => Some(GpusValue::All),
        GpuSelection::List(l) => Some(GpusValue::List(l.iter().map(|&i| i64::from(i)).collect())),
    };
    let slurm = match &r.launcher {
        Launcher::Slurm(s) => Some(At::bare(RawSlurm {
            nodes: Some(At::bare(i64::from(s.nodes))),
            gpus_per_node: Some(At::bare(i64::from(s.gpus_per_node))),
            nproc_per_node: Some(At::bare(i64::from(s.nproc_per_node))),
            partition: s.partition.clone().map(At::bare),
            time_limit: s.time_limit.clone().map(At::bare),
            account: s.account.clone().map(At::bare),
            sbatch_args: Some(At::bare(s.sbatch_args.clone())),
            rdzv_port: Some(At::bare(i64::from(s.rdzv_port))),
            program: Some(At::bare(CommandValue::Argv(s.program.clone()))),
            args: Some(s.args.clone()),
        })),
        _ => None,
    };
    let ranks = match &r.launcher {
        Launcher::Ranks(k) => Some(At::bare(RawRanks {
            nproc: Some(At::bare(i64::from(k.nproc))),
            master_addr: Some(At::bare(k.master_addr.clone())),
            // 0: a free port at each start.
            master_port: Some(At::bare(k.master_port.map_or(0, i64::from))),
            grace_s: Some(At::bare(k.grace_s)),
        })),
        _ => None,
    };
    let (launcher, torchrun) = match &r.launcher {
        Launcher::Local => (LauncherKind::Local, None),
        Launcher::Slurm(_) => (LauncherKind::Slurm, None),
        Launcher::Ranks(_) => (LauncherKind::Ranks, None),
        Launcher::Torchrun(t) => (
            LauncherKind::Torchrun,
            Some(At::bare(RawTorchrun {
                nproc_per_node: Some(At::bare(i64::from(t.nproc_per_node))),
                nnodes: Some(At::bare(i64::from(t.nnodes))),
                standalone: Some(At::bare(t.standalone)),
                rdzv_backend: t.rdzv_backend.clone(),
                rdzv_endpoint: t.rdzv_endpoint.clone(),
                rdzv_id: t.rdzv_id.clone(),
                max_restarts: t.max_restarts.map(|m| At::bare(i64::from(m))),
                module: Some(t.module),
                no_python: Some(t.no_python),
                program: Some(At::bare(CommandValue::Argv(t.program.clone()))),
                args: Some(t.args.clone()),
            })),
        ),
    };
    let policy = match r.restart.mode {
        RestartMode::Never => RawRestartMode::Never,
        RestartMode::OnFailure => RawRestartMode::OnFailure,
        RestartMode::Always => RawRestartMode::Always,
    };
    let knob = |k: &Knob| {
        At::bare(RawKnob {
            initial: Some(At::bare(k.initial)),
            min: Some(At::bare(k.min)),
            max: k.max.map(At::bare),
        })
    };
    let (target_c, margin_c) = match p.thermal.target {
        Some(ThermalTarget::Celsius(c)) => (Some(At::bare(c)), None),
        Some(ThermalTarget::BelowSlowdown(m)) => (None, Some(At::bare(m))),
        None => (None, None),
    };
    let raw = RawProfile {
        extends: None,
        name: Some(At::bare(p.name.clone())),
        description: p.description.clone(),
        run: Some(RawRun {
            command: Some(At::bare(command)),
            shell,
            cwd: r
                .cwd
                .as_ref()
                .map(|c| At::bare(c.to_string_lossy().into_owned())),
            gpus: gpus.map(At::bare),
            launcher: Some(At::bare(launcher)),
            env: Some(
                r.env
                    .iter()
                    .map(|(k, v)| (k.clone(), At::bare(v.clone())))
                    .collect(),
            ),
            torchrun,
            slurm,
            ranks,
            restart: Some(RawRestart {
                policy: Some(At::bare(policy)),
                max_restarts: Some(At::bare(i64::from(r.restart.max_restarts))),
                backoff_s: Some(At::bare(r.restart.backoff_s)),
                backoff_factor: Some(At::bare(r.restart.backoff_factor)),
                backoff_max_s: Some(At::bare(r.restart.backoff_max_s)),
                on_oom: Some(At::bare(match r.restart.on_oom {
                    OnOom::Fail => RawOnOom::Fail,
                    OnOom::HalveBatch => RawOnOom::HalveBatch,
                })),
            }),
            resume_args: (!r.resume_args.is_empty()).then(|| r.resume_args.clone()),
        }),
        knobs: Some(RawKnobs {
            batch_size: p.knobs.batch_size.as_ref().map(knob),
            prefetch: p.knobs.prefetch.as_ref().map(knob),
        }),
        power: Some(RawPower {
            cap_w: p.power.cap_w.map(At::bare),
            restore_on_exit: Some(p.power.restore_on_exit),
            node_budget_w: p.power.node_budget_w.map(At::bare),
        }),
        thermal: Some(RawThermal { target_c, margin_c }),
        alerts: Some(RawAlerts {
            temp_c: p.alerts.temp_c.map(At::bare),
            power_w: p.alerts.power_w.map(At::bare),
            stalled_after_s: p.alerts.stalled_after_s.map(At::bare),
            hook: p
                .alerts
                .hook
                .clone()
                .map(|h| At::bare(CommandValue::Argv(h))),
        }),
        metrics: Some(RawMetrics {
            json: Some(p.metrics.json),
            patterns: Some(p.metrics.patterns.iter().cloned().map(At::bare).collect()),
            preset: Some(At::bare(p.metrics.preset.as_str().to_string())),
        }),
        energy: Some(RawEnergy {
            price_per_kwh: p.energy.price_per_kwh.map(At::bare),
            currency: p.energy.currency.clone().map(At::bare),
            grid_co2_g_per_kwh: p.energy.grid_co2_g_per_kwh.map(At::bare),
            pue: p.energy.pue.map(At::bare),
        }),
    };
    let body = toml::to_string(&raw).expect("a profile always serializes to TOML");
    format!("# The resolved profile of this run (extends applied, defaults spelled out).\n{body}")
}
