//! Checks of `[run.restart]`, `[knobs]`, `[power]`, `[thermal]`, `[alerts]` and `[energy]`.

use super::{Ctx, argv_value};
use crate::profile::raw::{
    At, RawAlerts, RawEnergy, RawKnob, RawKnobs, RawMetrics, RawOnOom, RawPower, RawRestart,
    RawRestartMode, RawThermal,
};
use crate::profile::{
    AlertSettings, CommandSpec, EnergySettings, Knob, Knobs, MetricsSettings, OnOom, PowerSettings,
    RestartMode, RestartPolicy, ThermalSettings, ThermalTarget,
};

/// Knobs a command may mention as `{batch_size}` / `{prefetch}`, and the other placeholders.
const KNOB_PLACEHOLDERS: [(&str, &str); 2] =
    [("{batch_size}", "batch_size"), ("{prefetch}", "prefetch")];

pub(super) fn restart(cx: &mut Ctx, r: RawRestart) -> RestartPolicy {
    let mut p = RestartPolicy::default();
    if let Some(m) = &r.policy {
        p.mode = match m.value {
            RawRestartMode::Never => RestartMode::Never,
            RawRestartMode::OnFailure => RestartMode::OnFailure,
            RawRestartMode::Always => RestartMode::Always,
        };
    }
    if let Some(m) = &r.max_restarts {
        match u32::try_from(m.value) {
            Ok(v) => p.max_restarts = v,
            Err(_) if m.value < 0 => cx.err(
                m,
                format!(
                    "max_restarts = {} is negative: use 0 for no restarts, or a count like 3",
                    m.value
                ),
            ),
            Err(_) => cx.err(m, format!("max_restarts = {} is too large", m.value)),
        }
    }
    let mut seconds = |at: &Option<At<f64>>, what: &str, slot: &mut f64| {
        if let Some(at) = at {
            if !at.value.is_finite() || at.value < 0.0 {
                cx.err(
                    at,
                    format!("{what} = {}: must be 0 or more seconds", at.value),
                );
            } else {
                *slot = at.value;
            }
        }
    };
    seconds(&r.backoff_s, "backoff_s", &mut p.backoff_s);
    seconds(&r.backoff_max_s, "backoff_max_s", &mut p.backoff_max_s);
    if let Some(f) = &r.backoff_factor {
        if !f.value.is_finite() || f.value < 1.0 {
            cx.err(
                f,
                format!(
                    "backoff_factor = {}: must be 1 (the same wait every time) or more",
                    f.value
                ),
            );
        } else {
            p.backoff_factor = f.value;
        }
    }
    if let Some(o) = &r.on_oom {
        p.on_oom = match o.value {
            RawOnOom::Fail => OnOom::Fail,
            RawOnOom::HalveBatch => OnOom::HalveBatch,
        };
    }
    if r.backoff_max_s.is_none() {
        // The default ceiling never undercuts a first wait that was asked for.
        p.backoff_max_s = p.backoff_max_s.max(p.backoff_s);
    }
    if p.backoff_max_s < p.backoff_s {
        let at = r.backoff_max_s.as_ref().or(r.backoff_s.as_ref());
        let message = format!(
            "backoff_max_s = {} is below backoff_s = {}",
            p.backoff_max_s, p.backoff_s
        );
        match at {
            Some(at) => cx.err(at, message),
            None => cx.err_root(message),
        }
    }
    p
}

pub(super) fn knobs(cx: &mut Ctx, k: &RawKnobs) -> Knobs {
    Knobs {
        batch_size: k
            .batch_size
            .as_ref()
            .and_then(|at| knob(cx, at, "batch_size", 1)),
        prefetch: k
            .prefetch
            .as_ref()
            .and_then(|at| knob(cx, at, "prefetch", 0)),
    }
}

pub(super) fn knob(cx: &mut Ctx, at: &At<RawKnob>, name: &str, floor: i64) -> Option<Knob> {
    let k = &at.value;
    let min = match &k.min {
        Some(m) if m.value < floor => {
            cx.err(
                m,
                format!("knobs.{name}: min = {} is below {floor}", m.value),
            );
            floor
        }
        Some(m) => m.value,
        None => floor,
    };
    let max = k.max.as_ref().map(|m| {
        if m.value < min {
            cx.err(
                m,
                format!("knobs.{name}: max = {} is below min = {min}", m.value),
            );
        }
        m.value
    });
    let Some(initial) = &k.initial else {
        cx.err(
            at,
            format!("knobs.{name} needs initial = N (the value the run starts with)"),
        );
        return None;
    };
    let knob = Knob {
        initial: initial.value,
        min,
        max,
    };
    if !knob.allows(initial.value) {
        let range = match max {
            Some(max) => format!("{min}..={max}"),
            None => format!("{min} or more"),
        };
        cx.err(
            initial,
            format!(
                "knobs.{name}: initial = {} is outside the allowed range {range}",
                initial.value
            ),
        );
        return None;
    }
    Some(knob)
}

/// `{batch_size}` / `{prefetch}` in the command need the knob they name written. A knob
/// written but invalid has its own error where it is written, and none here.
pub(super) fn placeholders(cx: &mut Ctx, command: &CommandSpec, at: &At<()>, written: &RawKnobs) {
    let words: Vec<&str> = match command {
        CommandSpec::Argv(argv) => argv.iter().map(String::as_str).collect(),
        CommandSpec::Shell(script) => vec![script.as_str()],
    };
    for (placeholder, knob) in KNOB_PLACEHOLDERS {
        let defined = match knob {
            "batch_size" => written.batch_size.is_some(),
            _ => written.prefetch.is_some(),
        };
        if !defined && words.iter().any(|w| w.contains(placeholder)) {
            cx.err(at, format!(
                "command uses {placeholder} but [knobs.{knob}] is not set: add it with an initial value"
            ));
        }
    }
}

pub(super) fn positive(cx: &mut Ctx, at: &Option<At<f64>>, what: &str, unit: &str) -> Option<f64> {
    let at = at.as_ref()?;
    if !at.value.is_finite() || at.value <= 0.0 {
        cx.err(
            at,
            format!("{what} = {}: must be more than 0 {unit}", at.value),
        );
        return None;
    }
    Some(at.value)
}

pub(super) fn power(cx: &mut Ctx, p: RawPower) -> PowerSettings {
    PowerSettings {
        cap_w: positive(cx, &p.cap_w, "power.cap_w", "watts"),
        restore_on_exit: p.restore_on_exit.unwrap_or(true),
        node_budget_w: positive(cx, &p.node_budget_w, "power.node_budget_w", "watts"),
    }
}

pub(super) fn thermal(cx: &mut Ctx, t: RawThermal) -> ThermalSettings {
    let target = match (&t.target_c, &t.margin_c) {
        (Some(_), Some(m)) => {
            cx.err(
                m,
                "thermal: set target_c (degrees) or margin_c (degrees below slowdown), not both",
            );
            None
        }
        (Some(c), None) if !c.value.is_finite() || c.value <= 0.0 || c.value >= 120.0 => {
            cx.err(
                c,
                format!(
                    "thermal.target_c = {}: expected degrees Celsius between 0 and 120",
                    c.value
                ),
            );
            None
        }
        (Some(c), None) => Some(ThermalTarget::Celsius(c.value)),
        (None, Some(m)) if !m.value.is_finite() || m.value < 0.0 || m.value >= 100.0 => {
            cx.err(
                m,
                format!(
                    "thermal.margin_c = {}: expected degrees between 0 and 100",
                    m.value
                ),
            );
            None
        }
        (None, Some(m)) => Some(ThermalTarget::BelowSlowdown(m.value)),
        (None, None) => None,
    };
    ThermalSettings { target }
}

pub(super) fn alerts(cx: &mut Ctx, a: RawAlerts) -> AlertSettings {
    AlertSettings {
        temp_c: positive(cx, &a.temp_c, "alerts.temp_c", "degrees"),
        power_w: positive(cx, &a.power_w, "alerts.power_w", "watts"),
        stalled_after_s: positive(cx, &a.stalled_after_s, "alerts.stalled_after_s", "seconds"),
        hook: a
            .hook
            .as_ref()
            .and_then(|h| argv_value(cx, h, "alerts.hook")),
    }
}

/// `[energy]`: a price above 0 (a currency only with a price), a grid intensity and a PUE
/// within the bounds control.toml has too.
pub(super) fn energy(cx: &mut Ctx, e: RawEnergy) -> EnergySettings {
    let price_per_kwh = positive(cx, &e.price_per_kwh, "energy.price_per_kwh", "per kWh");
    if let (Some(c), None) = (&e.currency, &e.price_per_kwh) {
        cx.err(c, "energy.currency is set but energy.price_per_kwh is not");
    }
    let mut bounded = |at: &Option<At<f64>>, check: fn(f64) -> Result<f64, String>| {
        let at = at.as_ref()?;
        check(at.value)
            .map_err(|e| cx.err(at, format!("energy.{e}")))
            .ok()
    };
    EnergySettings {
        price_per_kwh,
        currency: e.currency.map(|c| c.value),
        grid_co2_g_per_kwh: bounded(&e.grid_co2_g_per_kwh, crate::profile::check_grid_co2),
        pue: bounded(&e.pue, crate::profile::check_pue),
    }
}

/// `[metrics]`: each pattern must compile and name at least one group.
pub(super) fn metrics(cx: &mut Ctx, m: RawMetrics) -> MetricsSettings {
    let mut out = MetricsSettings::default();
    if let Some(j) = m.json {
        out.json = j;
    }
    for at in m.patterns.iter().flatten() {
        match regex::Regex::new(&at.value) {
            Err(e) => cx.err(at, format!("metrics pattern does not compile: {e}")),
            Ok(re) if re.capture_names().flatten().next().is_none() => cx.err(
                at,
                "metrics pattern has no named group: write it like loss=(?P<loss>[0-9.]+)",
            ),
            Ok(_) => out.patterns.push(at.value.clone()),
        }
    }
    if let Some(at) = &m.preset {
        match crate::profile::MetricsPreset::parse(&at.value) {
            Some(p) => out.preset = p,
            None => {
                let names: Vec<&str> = crate::profile::MetricsPreset::ALL
                    .iter()
                    .map(|p| p.as_str())
                    .collect();
                cx.err(
                    at,
                    format!(
                        "unknown metrics preset {:?}: one of {}",
                        at.value,
                        names.join(", ")
                    ),
                );
            }
        }
    }
    out
}
