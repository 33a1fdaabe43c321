//! From the TOML tables (`Raw*`, every value with its position) to a resolved [`Scenario`],
//! checking each value against gpusim's catalog and the node's size as it goes.

use std::ops::Range;

use gpusim::{NodeConfig, TrainingConfig};
use serde::Deserialize;
use toml::Spanned;

use super::{
    DEFAULT_CUDA_DRIVER_VERSION, DEFAULT_DRIVER_VERSION, DEFAULT_MEASURED_NOISE, DEFAULT_PID_BASE,
    EccErrors, Health, MAX_GPUS, ProcessKind, Scenario, ScenarioProcess, fnv1a,
};
use crate::faults::{Fault, Faults};
use crate::symbols;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawScenario {
    gpus: Option<Spanned<Vec<Spanned<String>>>>,
    count: Option<Spanned<usize>>,
    model: Option<Spanned<String>>,
    ambient_c: Option<Spanned<f64>>,
    seed: Option<u64>,
    step_s: Option<Spanned<f64>>,
    driver_version: Option<String>,
    cuda_driver_version: Option<i32>,
    training: Option<RawTraining>,
    #[serde(default)]
    per_gpu: Vec<RawPerGpu>,
    processes: Option<Vec<RawProcess>>,
    /// `[[mig]]`: GPUs in MIG mode and their instances.
    #[serde(default)]
    mig: Vec<super::mig::RawMig>,
    #[serde(default)]
    faults: Vec<RawFault>,
    /// `[activity]`: a busy node's per-second movement (gpusim's `Activity`; every key
    /// optional, defaulting to its busy node).
    activity: Option<Spanned<RawActivity>>,
    /// `[topology]`: NVLink through NVSwitch, PCIe switches, NUMA (`crate::topology`).
    topology: Option<Spanned<crate::topology::RawTopology>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawActivity {
    intensity_sigma: Option<f64>,
    intensity_tau_s: Option<f64>,
    stalls_per_min: Option<f64>,
    eval_every_s: Option<f64>,
    eval_s: Option<f64>,
    eval_busy: Option<f64>,
}

/// The `[activity]` table over gpusim's busy-node defaults, checked by gpusim.
fn resolve_activity(raw: Spanned<RawActivity>) -> Result<gpusim::Activity, Located> {
    let span = raw.span();
    let r = raw.into_inner();
    let d = gpusim::Activity::default();
    let a = gpusim::Activity {
        intensity_sigma: r.intensity_sigma.unwrap_or(d.intensity_sigma),
        intensity_tau_s: r.intensity_tau_s.unwrap_or(d.intensity_tau_s),
        stalls_per_min: r.stalls_per_min.unwrap_or(d.stalls_per_min),
        eval_every_s: r.eval_every_s.unwrap_or(d.eval_every_s),
        eval_s: r.eval_s.unwrap_or(d.eval_s),
        eval_busy: r.eval_busy.unwrap_or(d.eval_busy),
    };
    a.validate()
        .map_err(|e| (span, format!("[activity]: {e}")))?;
    Ok(a)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTraining {
    model: Spanned<String>,
    #[serde(default = "default_batch")]
    batch_size: u32,
    #[serde(default = "default_prefetch")]
    prefetch_depth: u32,
    #[serde(default = "default_workers")]
    workers: u32,
}

fn default_batch() -> u32 {
    256
}
fn default_prefetch() -> u32 {
    2
}
fn default_workers() -> u32 {
    8
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPerGpu {
    gpu: Spanned<usize>,
    #[serde(default)]
    idle: Option<Spanned<bool>>,
    training: Option<RawTraining>,
    power_limit_w: Option<Spanned<f64>>,
    /// A measured power-limit curve this GPU draws while it trains: `[limit W, seconds per
    /// unit of work, average W]` rows (gpusim's `MeasuredCurve`), and each second's noise.
    measured_curve: Option<Spanned<Vec<[f64; 3]>>>,
    measured_noise: Option<Spanned<f64>>,
    persistence: Option<bool>,
    /// Volatile ECC error counts this GPU reports (data-centre parts only).
    #[serde(default)]
    ecc_corrected: u64,
    #[serde(default)]
    ecc_uncorrected: u64,
    /// Rows remapped after correctable / uncorrectable errors (parts with row remapping).
    #[serde(default)]
    remapped_correctable: u64,
    #[serde(default)]
    remapped_uncorrectable: u64,
    #[serde(default)]
    remap_pending: bool,
    #[serde(default)]
    remap_failure: bool,
    /// A degraded link: the generation and width it trained at (at most the board's).
    pcie_link_gen: Option<Spanned<u32>>,
    pcie_link_width: Option<Spanned<u32>>,
    /// How fast the PCIe replay counter climbs.
    pcie_replays_per_min: Option<Spanned<f64>>,
    /// Retired pages (parts that retire pages: data-centre GPUs before Ampere).
    #[serde(default)]
    retired_pages_sbe: u32,
    #[serde(default)]
    retired_pages_dbe: u32,
    #[serde(default)]
    retired_pages_pending: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProcess {
    gpu: Spanned<usize>,
    pid: u32,
    #[serde(default = "default_process_name")]
    name: String,
    used_memory_mib: Option<u64>,
    #[serde(default)]
    kind: Option<Spanned<String>>,
}

fn default_process_name() -> String {
    "python3".to_string()
}

/// One `[[faults]]` table. Flat (not a tagged enum) so every field keeps its position for
/// error messages; which fields a kind accepts is checked in [`resolve_fault`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFault {
    kind: Spanned<String>,
    gpu: Option<Spanned<usize>>,
    at_s: Option<Spanned<f64>>,
    functions: Option<Vec<Spanned<String>>>,
    delay_ms: Option<Spanned<u64>>,
    /// `cooling` only: what the GPU's thermal resistance is multiplied by.
    thermal_resistance_scale: Option<Spanned<f64>>,
    /// `xid` only: the XID number, and the period it repeats with.
    xid: Option<Spanned<u64>>,
    every_s: Option<Spanned<f64>>,
    /// `nvlink_down` only: the link that did not train.
    link: Option<Spanned<u32>>,
    /// `wild_readings` only: what the energy counter reads off by, millijoules (wrapping: a
    /// negative offset larger than the counter wraps it round 2^64)…
    energy_offset_mj: Option<Spanned<i64>>,
    /// … and what the power limit reads, milliwatts.
    power_limit_mw: Option<Spanned<i64>>,
}

/// An error message and the byte range it is about.
pub(super) type Located = (Range<usize>, String);

pub(super) fn resolve(raw: RawScenario, text: &str) -> Result<Scenario, Located> {
    let defaults = NodeConfig::default();
    let whole = 0..0;

    // GPUs: an explicit list, or `count` copies of `model`, or the default node's.
    let gpus: Vec<String> = match (&raw.gpus, &raw.count, &raw.model) {
        (Some(list), None, None) => {
            let mut ids = Vec::new();
            for id in list.get_ref() {
                ids.push(spec_id(id)?);
            }
            ids
        }
        (Some(list), _, _) => {
            return Err((
                list.span(),
                "`gpus` cannot be combined with `count`/`model`".into(),
            ));
        }
        (None, count, model) => {
            let id = match model {
                Some(m) => spec_id(m)?,
                None => defaults.gpus.first().cloned().unwrap_or_default(),
            };
            let n = count.as_ref().map_or(defaults.gpus.len(), |c| *c.get_ref());
            vec![id; n]
        }
    };
    if gpus.is_empty() || gpus.len() > MAX_GPUS {
        let span = raw
            .gpus
            .as_ref()
            .map(|g| g.span())
            .or(raw.count.as_ref().map(|c| c.span()))
            .unwrap_or(whole);
        return Err((
            span,
            format!("a node needs 1 to {MAX_GPUS} GPUs, got {}", gpus.len()),
        ));
    }
    let n = gpus.len();

    let ambient_c = match &raw.ambient_c {
        Some(a) if !(-40.0..=80.0).contains(a.get_ref()) => {
            return Err((a.span(), "`ambient_c` must be within -40..=80 °C".into()));
        }
        Some(a) => *a.get_ref(),
        None => defaults.ambient_c,
    };
    let step_s = match &raw.step_s {
        Some(s) if !(*s.get_ref() > 0.0 && *s.get_ref() <= 10.0) => {
            return Err((s.span(), "`step_s` must be > 0 and <= 10 seconds".into()));
        }
        Some(s) => *s.get_ref(),
        None => defaults.step_s,
    };
    // No `[training]` table: the GPUs start idle.
    let global_training = raw.training.map(training).transpose()?;

    let mut training_per_gpu = vec![global_training.clone(); n];
    let mut power_limit_w = vec![None; n];
    let mut measured = vec![None; n];
    let mut persistence = vec![None; n];
    let mut ecc_errors = vec![EccErrors::default(); n];
    let mut health = vec![Health::default(); n];
    for p in raw.per_gpu {
        let i = gpu_index(&p.gpu, n)?;
        let idle = p.idle.as_ref().is_some_and(|s| *s.get_ref());
        match (idle, p.training) {
            (true, Some(t)) => {
                return Err((
                    t.model.span(),
                    "a GPU cannot be both `idle` and `training`".into(),
                ));
            }
            (true, None) => training_per_gpu[i] = None,
            (false, Some(t)) => training_per_gpu[i] = Some(training(t)?),
            (false, None) => {}
        }
        if let Some(w) = p.power_limit_w {
            let spec = gpusim::find(&gpus[i]).ok_or((w.span(), "unknown GPU".to_string()))?;
            let v = *w.get_ref();
            if !(spec.power_min_w..=spec.power_max_w).contains(&v) {
                return Err((
                    w.span(),
                    format!(
                        "power_limit_w {v} is outside {}'s range {}..={} W",
                        spec.id, spec.power_min_w, spec.power_max_w
                    ),
                ));
            }
            power_limit_w[i] = Some(v);
        }
        match (p.measured_curve, p.measured_noise) {
            (Some(c), noise) => {
                let spec = gpusim::find(&gpus[i]).ok_or((c.span(), "unknown GPU".to_string()))?;
                let span = c.span();
                let curve = gpusim::MeasuredCurve::new(c.get_ref())
                    .map_err(|e| (span.clone(), format!("measured_curve: {e}")))?;
                let (lo, hi) = curve.range_w();
                if lo > spec.power_min_w || hi < spec.power_max_w {
                    return Err((
                        span,
                        format!(
                            "measured_curve covers {lo}..={hi} W, not {}'s whole range {}..={} W",
                            spec.id, spec.power_min_w, spec.power_max_w
                        ),
                    ));
                }
                let noise = match noise {
                    Some(n) if !(0.0..0.5).contains(n.get_ref()) => {
                        return Err((n.span(), "measured_noise must be in 0..0.5".into()));
                    }
                    Some(n) => *n.get_ref(),
                    None => DEFAULT_MEASURED_NOISE,
                };
                measured[i] = Some((curve, noise));
            }
            (None, Some(n)) => {
                return Err((n.span(), "measured_noise needs a measured_curve".into()));
            }
            (None, None) => {}
        }
        persistence[i] = p.persistence.or(persistence[i]);
        if p.ecc_corrected > 0 || p.ecc_uncorrected > 0 {
            ecc_errors[i] = EccErrors {
                corrected: p.ecc_corrected,
                uncorrected: p.ecc_uncorrected,
            };
        }
        let spec = gpusim::find(&gpus[i]).ok_or((p.gpu.span(), "unknown GPU".to_string()))?;
        let pcie_link_gen = match p.pcie_link_gen {
            Some(g) if !(1..=spec.pcie_gen).contains(g.get_ref()) => {
                return Err((
                    g.span(),
                    format!(
                        "pcie_link_gen {} is outside {}'s 1..={}",
                        g.get_ref(),
                        spec.id,
                        spec.pcie_gen
                    ),
                ));
            }
            g => g.map(|g| *g.get_ref()),
        };
        let pcie_link_width = match p.pcie_link_width {
            Some(w)
                if !matches!(w.get_ref(), 1 | 2 | 4 | 8 | 16 | 32)
                    || *w.get_ref() > spec.pcie_width =>
            {
                return Err((
                    w.span(),
                    format!(
                        "pcie_link_width {} is not a PCIe width up to {}'s x{}",
                        w.get_ref(),
                        spec.id,
                        spec.pcie_width
                    ),
                ));
            }
            w => w.map(|w| *w.get_ref()),
        };
        let pcie_replays_per_min = match p.pcie_replays_per_min {
            Some(r) if !(r.get_ref().is_finite() && *r.get_ref() >= 0.0) => {
                return Err((r.span(), "pcie_replays_per_min must be 0 or more".into()));
            }
            r => r.map_or(0.0, |r| *r.get_ref()),
        };
        health[i] = Health {
            remapped_correctable: p.remapped_correctable,
            remapped_uncorrectable: p.remapped_uncorrectable,
            remap_pending: p.remap_pending,
            remap_failure: p.remap_failure,
            pcie_link_gen,
            pcie_link_width,
            pcie_replays_per_min,
            retired_pages_sbe: p.retired_pages_sbe,
            retired_pages_dbe: p.retired_pages_dbe,
            retired_pages_pending: p.retired_pages_pending,
        };
    }

    let processes = match raw.processes {
        None => None,
        Some(list) => {
            let mut out = Vec::new();
            for p in list {
                let gpu = gpu_index(&p.gpu, n)?;
                let kind = match p.kind.as_ref().map(|k| (k.get_ref().as_str(), k.span())) {
                    None | Some(("compute", _)) => ProcessKind::Compute,
                    Some(("graphics", _)) => ProcessKind::Graphics,
                    Some((other, span)) => {
                        return Err((
                            span,
                            format!(
                                "unknown process kind `{other}`, expected `compute` or `graphics`"
                            ),
                        ));
                    }
                };
                out.push(ScenarioProcess {
                    gpu,
                    pid: p.pid,
                    name: p.name,
                    used_memory_bytes: p.used_memory_mib.map(|m| m * 1024 * 1024),
                    kind,
                });
            }
            Some(out)
        }
    };

    let pids: Vec<(usize, u32)> = match &processes {
        Some(list) => list.iter().map(|p| (p.gpu, p.pid)).collect(),
        None => (0..n)
            .filter(|i| training_per_gpu[*i].is_some())
            .map(|i| (i, DEFAULT_PID_BASE + i as u32))
            .collect(),
    };
    let mig = super::mig::resolve_mig(raw.mig, &gpus, &pids)?;
    let activity = raw.activity.map(resolve_activity).transpose()?;
    let mut topology = match raw.topology {
        Some(t) => {
            let span = t.span();
            Some(crate::topology::Topology::new(t.into_inner()).map_err(|e| (span, e))?)
        }
        None => None,
    };
    let mut faults = Vec::new();
    let mut cooling = Vec::new();
    for f in raw.faults {
        if f.kind.get_ref() == "nvlink_down" {
            let down = resolve_nvlink_down(&f, &gpus, topology.as_ref())?;
            if let Some(t) = topology.as_mut() {
                t.down.push(down);
            }
        } else if let Some(link) = &f.link {
            return Err((link.span(), "only `nvlink_down` takes `link`".into()));
        } else if f.kind.get_ref() == "cooling" {
            cooling.push(resolve_cooling(f, n)?);
        } else {
            faults.push(resolve_fault(f, n)?);
        }
    }

    Ok(Scenario {
        source: None,
        node: NodeConfig {
            gpus,
            ambient_c,
            seed: raw.seed.unwrap_or(defaults.seed),
            step_s,
            training: global_training,
        },
        training: training_per_gpu,
        power_limit_w,
        measured,
        persistence,
        ecc_errors,
        health,
        driver_version: raw
            .driver_version
            .unwrap_or_else(|| DEFAULT_DRIVER_VERSION.to_string()),
        cuda_driver_version: raw
            .cuda_driver_version
            .unwrap_or(DEFAULT_CUDA_DRIVER_VERSION),
        processes,
        mig,
        faults: Faults::new(faults),
        cooling,
        activity,
        topology,
        hash: fnv1a(text.as_bytes()),
    })
}

/// An `nvlink_down` fault: `link` of `gpu` did not train at boot (needs `[topology]`).
fn resolve_nvlink_down(
    f: &RawFault,
    gpus: &[String],
    topology: Option<&crate::topology::Topology>,
) -> Result<(usize, u32), Located> {
    let kind_span = f.kind.span();
    if f.functions.is_some() || f.delay_ms.is_some() || f.at_s.is_some() || f.xid.is_some() {
        return Err((
            kind_span,
            "fault kind `nvlink_down` takes `gpu` and `link` only (a link that did not train at boot)".into(),
        ));
    }
    let Some(topology) = topology else {
        return Err((
            kind_span,
            "fault kind `nvlink_down` needs a `[topology]` table".into(),
        ));
    };
    let (Some(gpu), Some(link)) = (&f.gpu, &f.link) else {
        return Err((
            kind_span,
            "fault kind `nvlink_down` needs `gpu` and `link`".into(),
        ));
    };
    let i = gpu_index(gpu, gpus.len())?;
    let spec = gpusim::find(&gpus[i]).ok_or((gpu.span(), "unknown GPU".to_string()))?;
    let links = topology.links(spec);
    if *link.get_ref() >= links {
        return Err((
            link.span(),
            format!(
                "link {} does not exist: GPU {i} ({}) has {links} NVLinks",
                link.get_ref(),
                spec.id
            ),
        ));
    }
    Ok((i, *link.get_ref()))
}

/// A `cooling` fault: physics (gpusim's [`gpusim::CoolingFault`]), not an NVML error — from
/// `at_s` the GPU's thermal resistance is multiplied by `thermal_resistance_scale`.
fn resolve_cooling(f: RawFault, n: usize) -> Result<gpusim::CoolingFault, Located> {
    let kind_span = f.kind.span();
    for (field, present) in [
        ("functions", f.functions.is_some()),
        ("delay_ms", f.delay_ms.is_some()),
    ] {
        if present {
            return Err((
                kind_span,
                format!("fault kind `cooling` takes no `{field}`"),
            ));
        }
    }
    let gpu = match &f.gpu {
        Some(g) => gpu_index(g, n)?,
        None => return Err((kind_span, "fault kind `cooling` needs `gpu`".into())),
    };
    let scale = f.thermal_resistance_scale.ok_or_else(|| {
        (
            kind_span.clone(),
            "fault kind `cooling` needs `thermal_resistance_scale`".to_string(),
        )
    })?;
    let (min, max) = gpusim::gpu::COOLING_SCALE_RANGE;
    if !(min..=max).contains(scale.get_ref()) {
        return Err((
            scale.span(),
            format!("`thermal_resistance_scale` must be within {min}..={max}"),
        ));
    }
    let at_s = match &f.at_s {
        Some(a) if !(*a.get_ref() >= 0.0 && a.get_ref().is_finite()) => {
            return Err((a.span(), "`at_s` must be 0 or more seconds".into()));
        }
        Some(a) => *a.get_ref(),
        None => 0.0,
    };
    Ok(gpusim::CoolingFault {
        gpu,
        at_s,
        thermal_resistance_scale: *scale.get_ref(),
    })
}

fn spec_id(id: &Spanned<String>) -> Result<String, Located> {
    match gpusim::find(id.get_ref()) {
        Some(spec) => Ok(spec.id.to_string()),
        None => {
            let known: Vec<&str> = gpusim::CATALOG.iter().map(|s| s.id).collect();
            Err((
                id.span(),
                format!(
                    "unknown GPU `{}`; known: {}",
                    id.get_ref(),
                    known.join(", ")
                ),
            ))
        }
    }
}

fn training(t: RawTraining) -> Result<TrainingConfig, Located> {
    if gpusim::find_model(t.model.get_ref()).is_none() {
        let known: Vec<&str> = gpusim::MODELS.iter().map(|m| m.id).collect();
        return Err((
            t.model.span(),
            format!(
                "unknown training model `{}`; known: {}",
                t.model.get_ref(),
                known.join(", ")
            ),
        ));
    }
    Ok(TrainingConfig {
        model: t.model.into_inner(),
        batch_size: t.batch_size,
        prefetch_depth: t.prefetch_depth,
        workers: t.workers,
    })
}

fn gpu_index(gpu: &Spanned<usize>, n: usize) -> Result<usize, Located> {
    let i = *gpu.get_ref();
    if i >= n {
        return Err((
            gpu.span(),
            format!("gpu {i} does not exist: the node has {n} GPUs (0..{n})"),
        ));
    }
    Ok(i)
}

fn resolve_fault(f: RawFault, n: usize) -> Result<Fault, Located> {
    let kind_span = f.kind.span();
    let gpu = match &f.gpu {
        Some(g) => Some(gpu_index(g, n)?),
        None => None,
    };
    let functions = match f.functions {
        None => None,
        Some(list) => {
            let mut names = Vec::new();
            for name in list {
                if !symbols::is_exported_family(name.get_ref()) {
                    return Err((
                        name.span(),
                        format!("`{}` is not a function fake-nvml exports", name.get_ref()),
                    ));
                }
                names.push(name.into_inner());
            }
            Some(names)
        }
    };
    // Which optional fields each kind takes; anything else is a mistake worth reporting.
    let reject = |field: &str, present: bool| -> Result<(), Located> {
        if present {
            Err((
                kind_span.clone(),
                format!("fault kind `{}` takes no `{field}`", f.kind.get_ref()),
            ))
        } else {
            Ok(())
        }
    };
    let need = |field: &str| -> Located {
        (
            kind_span.clone(),
            format!("fault kind `{}` needs `{field}`", f.kind.get_ref()),
        )
    };
    reject(
        "thermal_resistance_scale",
        f.thermal_resistance_scale.is_some(),
    )?;
    if f.kind.get_ref() == "wild_readings" {
        reject("functions", functions.is_some())?;
        reject("delay_ms", f.delay_ms.is_some())?;
        reject("xid", f.xid.is_some())?;
        reject("every_s", f.every_s.is_some())?;
        let power_limit_mw = match f.power_limit_mw {
            None => None,
            Some(mw) => Some(u32::try_from(*mw.get_ref()).map_err(|_| {
                (
                    mw.span(),
                    format!(
                        "power_limit_mw {} does not fit NVML's unsigned 32 bits (0..=4294967295)",
                        mw.get_ref()
                    ),
                )
            })?),
        };
        let energy_offset_mj = f.energy_offset_mj.map(|o| *o.get_ref());
        if energy_offset_mj.is_none() && power_limit_mw.is_none() {
            return Err(need("energy_offset_mj or power_limit_mw"));
        }
        return Ok(Fault::WildReadings {
            gpu,
            at_s: f.at_s.map_or(0.0, |a| *a.get_ref()),
            energy_offset_mj,
            power_limit_mw,
        });
    }
    reject("energy_offset_mj", f.energy_offset_mj.is_some())?;
    reject("power_limit_mw", f.power_limit_mw.is_some())?;
    if f.kind.get_ref() == "xid" {
        return resolve_xid(
            f.xid, f.at_s, f.every_s, functions, f.delay_ms, gpu, need, reject,
        );
    }
    reject("xid", f.xid.is_some())?;
    reject("every_s", f.every_s.is_some())?;
    match f.kind.get_ref().as_str() {
        "gpu_lost" => {
            reject("functions", functions.is_some())?;
            reject("delay_ms", f.delay_ms.is_some())?;
            let at_s = f.at_s.map_or(0.0, |a| *a.get_ref());
            Ok(Fault::GpuLost { gpu: gpu.ok_or_else(|| need("gpu"))?, at_s })
        }
        "not_supported" => {
            reject("at_s", f.at_s.is_some())?;
            reject("delay_ms", f.delay_ms.is_some())?;
            Ok(Fault::NotSupported { functions: functions.ok_or_else(|| need("functions"))?, gpu })
        }
        "slow" => {
            reject("at_s", f.at_s.is_some())?;
            let delay_ms = *f.delay_ms.ok_or_else(|| need("delay_ms"))?.get_ref();
            Ok(Fault::Slow { functions: functions.ok_or_else(|| need("functions"))?, delay_ms, gpu })
        }
        "no_permission" => {
            reject("at_s", f.at_s.is_some())?;
            reject("delay_ms", f.delay_ms.is_some())?;
            if let Some(fs) = &functions {
                if let Some(bad) = fs.iter().find(|f| !symbols::is_setter_family(f)) {
                    return Err((kind_span, format!("`{bad}` is not a setter; no_permission applies to setters only")));
                }
            }
            Ok(Fault::NoPermission { functions, gpu })
        }
        "power_limit_zero" => {
            reject("at_s", f.at_s.is_some())?;
            reject("delay_ms", f.delay_ms.is_some())?;
            reject("functions", functions.is_some())?;
            Ok(Fault::PowerLimitZero { gpu })
        }
        "missing_symbol" => Err((
            kind_span,
            "`missing_symbol` cannot be simulated: a shared library's symbols are fixed at build time".into(),
        )),
        other => Err((
            kind_span,
            format!(
                "unknown fault kind `{other}`; known: gpu_lost, not_supported, slow, no_permission, power_limit_zero, wild_readings, xid, cooling, nvlink_down"
            ),
        )),
    }
}

/// An `xid` fault: `xid` at `at_s` (default 0), repeating every `every_s` when set.
#[allow(clippy::too_many_arguments)]
fn resolve_xid(
    xid: Option<Spanned<u64>>,
    at_s: Option<Spanned<f64>>,
    every_s: Option<Spanned<f64>>,
    functions: Option<Vec<String>>,
    delay_ms: Option<Spanned<u64>>,
    gpu: Option<usize>,
    need: impl Fn(&str) -> Located,
    reject: impl Fn(&str, bool) -> Result<(), Located>,
) -> Result<Fault, Located> {
    reject("functions", functions.is_some())?;
    reject("delay_ms", delay_ms.is_some())?;
    let xid = xid.ok_or_else(|| need("xid"))?;
    if *xid.get_ref() == 0 {
        return Err((xid.span(), "`xid` 0 is no XID".into()));
    }
    let at = match at_s {
        Some(a) if !(a.get_ref().is_finite() && *a.get_ref() >= 0.0) => {
            return Err((
                a.span(),
                "`at_s` is seconds from the node's start, 0 or more".into(),
            ));
        }
        Some(a) => *a.get_ref(),
        None => 0.0,
    };
    let every = match every_s {
        Some(e) if !(e.get_ref().is_finite() && *e.get_ref() >= 0.1) => {
            return Err((e.span(), "`every_s` must be at least 0.1 seconds".into()));
        }
        Some(e) => Some(*e.get_ref()),
        None => None,
    };
    Ok(Fault::Xid {
        gpu,
        xid: *xid.get_ref(),
        at_s: at,
        every_s: every,
    })
}
