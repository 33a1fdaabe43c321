//! The daemon's control settings: `$CONFIG/control.toml` (`GPUPILOT_HOME=DIR`:
//! `DIR/config/control.toml`), read when the daemon starts.
//!
//! ```toml
//! [energy]
//! price_per_kwh = 0.21       # money per kWh, for the cost of runs
//! currency = "EUR"           # shown after the figure
//! grid_co2_g_per_kwh = 350   # the grid's carbon intensity, g CO2 per kWh
//! pue = 1.4                  # the facility's energy over its IT energy (cooling, delivery)
//!
//! [power]
//! node_budget_w = 2800       # the node's budget: the sum of all caps stays within it
//! job_caps = "together"      # a job of several ranks: all its GPUs at one cap (or "per-gpu")
//!
//! [thermal]
//! margin_c = 8               # every GPU held 8 °C below its slowdown (or target_c = 78)
//!
//! [alerts]
//! temp_c = 85
//! power_w = 650
//! hook = ["/usr/local/bin/page-oncall"]
//! hook_user = "nobody"       # who hooks run as; a root daemon runs none without it
//! ```
//!
//! Every section is optional; a missing file is no settings. Unknown keys are errors, as in
//! profiles. A run's profile adds its own `[thermal]`, `[power] node_budget_w` and `[alerts]`
//! while the run lives, and its `[energy]` rates replace these for its figures (see
//! `docs/profiles.md`).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::energy::{EnergyRates, Price, check_grid_co2, check_pue};
use super::governor::Target;
use super::jobs::JobCaps;

/// Alert thresholds from one source (this file, or a run's profile).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AlertRules {
    pub temp_c: Option<f64>,
    pub power_w: Option<f64>,
    pub stalled_after_s: Option<f64>,
    pub hook: Option<Vec<String>>,
}

impl From<&crate::profile::AlertSettings> for AlertRules {
    fn from(a: &crate::profile::AlertSettings) -> AlertRules {
        AlertRules {
            temp_c: a.temp_c,
            power_w: a.power_w,
            stalled_after_s: a.stalled_after_s,
            hook: a.hook.clone(),
        }
    }
}

impl AlertRules {
    /// Whether any rule is set (ECC and lost-GPU alerts come with any `[alerts]` table).
    pub fn any(&self) -> bool {
        self.temp_c.is_some()
            || self.power_w.is_some()
            || self.stalled_after_s.is_some()
            || self.hook.is_some()
    }
}

/// `control.toml`, checked.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ControlSettings {
    pub price: Option<Price>,
    /// Grid carbon intensity, g CO2 per kWh.
    pub grid_co2_g_per_kwh: Option<f64>,
    /// The facility's power usage effectiveness (≥ 1).
    pub pue: Option<f64>,
    pub node_budget_w: Option<f64>,
    /// How the governor and the budget cap the GPUs of a job of several ranks.
    pub job_caps: JobCaps,
    pub thermal: Option<Target>,
    pub alerts: AlertRules,
    /// `[alerts] hook_user`: the user alert hooks run as. A root daemon runs hooks (its own and
    /// runs' profiles') only as this user, never as root, and none without it.
    pub hook_user: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    #[serde(default)]
    energy: RawEnergy,
    #[serde(default)]
    power: RawPower,
    #[serde(default)]
    thermal: RawThermal,
    #[serde(default)]
    alerts: RawAlerts,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEnergy {
    price_per_kwh: Option<f64>,
    currency: Option<String>,
    grid_co2_g_per_kwh: Option<f64>,
    pue: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPower {
    node_budget_w: Option<f64>,
    job_caps: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawThermal {
    target_c: Option<f64>,
    margin_c: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAlerts {
    temp_c: Option<f64>,
    power_w: Option<f64>,
    stalled_after_s: Option<f64>,
    hook: Option<Vec<String>>,
    hook_user: Option<String>,
}

impl ControlSettings {
    /// The node's `[energy]` rates.
    pub fn rates(&self) -> EnergyRates {
        EnergyRates {
            price: self.price.clone(),
            grid_co2_g_per_kwh: self.grid_co2_g_per_kwh,
            pue: self.pue,
        }
    }
}

/// The most of `control.toml` read: a settings file is a few lines.
const MAX_FILE: u64 = 1 << 20;

/// Where the file is for a config directory.
pub fn path_in(config_dir: &Path) -> PathBuf {
    config_dir.join("control.toml")
}

/// Read `control.toml` from `config_dir`: no file is no settings; a bad file is an error that
/// names the file and the problem.
pub fn load(config_dir: &Path) -> Result<ControlSettings, String> {
    let path = path_in(config_dir);
    // Settings a root daemon acts on as root: read only from a file root owns, that no one
    // else may write (see `safe_fs::read_config`).
    match crate::config::safe_fs::read_config(&path, MAX_FILE) {
        Ok(text) => parse(&text).map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ControlSettings::default()),
        Err(e) if crate::config::safe_fs::refusal(&e).is_some() => Err(e.to_string()),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// Parse the file's text.
pub fn parse(text: &str) -> Result<ControlSettings, String> {
    let raw: Raw = toml::from_str(text).map_err(|e| e.to_string())?;
    let positive = |v: Option<f64>, what: &str| -> Result<Option<f64>, String> {
        match v {
            Some(x) if !(x.is_finite() && x > 0.0) => {
                Err(format!("{what} = {x}: expected a number above 0"))
            }
            v => Ok(v),
        }
    };
    let price = match positive(raw.energy.price_per_kwh, "energy.price_per_kwh")? {
        Some(p) => Some(Price {
            per_kwh: p,
            currency: raw.energy.currency.unwrap_or_default(),
        }),
        None if raw.energy.currency.is_some() => {
            return Err("energy.currency is set but energy.price_per_kwh is not".into());
        }
        None => None,
    };
    let thermal = match (raw.thermal.target_c, raw.thermal.margin_c) {
        (Some(_), Some(_)) => {
            return Err(
                "thermal: set target_c (degrees) or margin_c (degrees below slowdown), not both"
                    .into(),
            );
        }
        (Some(c), None) if (0.0..=120.0).contains(&c) => Some(Target::Celsius(c)),
        (Some(c), None) => {
            return Err(format!(
                "thermal.target_c = {c}: expected degrees Celsius between 0 and 120"
            ));
        }
        (None, Some(m)) if (0.0..=100.0).contains(&m) => Some(Target::BelowSlowdown(m)),
        (None, Some(m)) => {
            return Err(format!(
                "thermal.margin_c = {m}: expected degrees between 0 and 100"
            ));
        }
        (None, None) => None,
    };
    let job_caps = match raw.power.job_caps.as_deref() {
        None => JobCaps::default(),
        Some(s) => JobCaps::parse(s).ok_or_else(|| {
            format!("power.job_caps = \"{s}\": expected \"together\" or \"per-gpu\"")
        })?,
    };
    if let Some(u) = &raw.alerts.hook_user {
        if u.is_empty() || u == "root" || !u.chars().all(|c| c.is_ascii_graphic() && c != ':') {
            return Err(format!(
                "alerts.hook_user = {u:?}: name an unprivileged user (e.g. \"nobody\")"
            ));
        }
    }
    if raw.alerts.hook.as_ref().is_some_and(Vec::is_empty) {
        return Err("alerts.hook = []: give the program to run, e.g. [\"notify-send\"]".into());
    }
    let grid_co2_g_per_kwh = raw
        .energy
        .grid_co2_g_per_kwh
        .map(|v| check_grid_co2(v).map_err(|e| format!("energy.{e}")))
        .transpose()?;
    let pue = raw
        .energy
        .pue
        .map(|v| check_pue(v).map_err(|e| format!("energy.{e}")))
        .transpose()?;
    Ok(ControlSettings {
        price,
        grid_co2_g_per_kwh,
        pue,
        node_budget_w: positive(raw.power.node_budget_w, "power.node_budget_w")?,
        job_caps,
        thermal,
        alerts: AlertRules {
            temp_c: positive(raw.alerts.temp_c, "alerts.temp_c")?,
            power_w: positive(raw.alerts.power_w, "alerts.power_w")?,
            stalled_after_s: positive(raw.alerts.stalled_after_s, "alerts.stalled_after_s")?,
            hook: raw.alerts.hook,
        },
        hook_user: raw.alerts.hook_user,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_example_parses() {
        let doc = include_str!("settings.rs");
        let start = doc.find("//! ```toml\n").unwrap() + "//! ```toml\n".len();
        let end = start + doc[start..].find("//! ```\n").unwrap();
        let text: String = doc[start..end]
            .lines()
            .map(|l| l.strip_prefix("//!").unwrap_or(l).trim_start())
            .collect::<Vec<_>>()
            .join("\n");
        let s = parse(&text).unwrap();
        assert_eq!(
            s.price,
            Some(Price {
                per_kwh: 0.21,
                currency: "EUR".into()
            })
        );
        assert_eq!(s.node_budget_w, Some(2800.0));
        assert_eq!((s.grid_co2_g_per_kwh, s.pue), (Some(350.0), Some(1.4)));
        assert_eq!(s.rates().pue, Some(1.4));
        assert_eq!(s.job_caps, JobCaps::Together);
        assert_eq!(s.thermal, Some(Target::BelowSlowdown(8.0)));
        assert_eq!(s.alerts.temp_c, Some(85.0));
        assert!(s.alerts.any());
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        assert!(
            parse("[power]\nbudget = 3")
                .unwrap_err()
                .contains("unknown field")
        );
        assert!(
            parse("[thermal]\ntarget_c = 80\nmargin_c = 5")
                .unwrap_err()
                .contains("not both")
        );
        assert!(
            parse("[power]\nnode_budget_w = -1")
                .unwrap_err()
                .contains("above 0")
        );
        assert_eq!(
            parse("[power]\njob_caps = \"per-gpu\"").unwrap().job_caps,
            JobCaps::PerGpu
        );
        let e = parse("[power]\njob_caps = \"each\"").unwrap_err();
        assert!(e.contains("\"together\" or \"per-gpu\""), "{e}");
        assert_eq!(parse("").unwrap(), ControlSettings::default());
        let e = parse("[energy]\npue = 0.8").unwrap_err();
        assert!(
            e.contains("energy.pue = 0.8") && e.contains("from 1 to 5"),
            "{e}"
        );
        assert!(parse("[energy]\npue = nan").is_err());
        let e = parse("[energy]\ngrid_co2_g_per_kwh = -3").unwrap_err();
        assert!(e.contains("energy.grid_co2_g_per_kwh = -3"), "{e}");
        assert_eq!(
            parse("[energy]\ngrid_co2_g_per_kwh = 0")
                .unwrap()
                .grid_co2_g_per_kwh,
            Some(0.0),
            "a carbon-free supply is 0"
        );
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(load(tmp.path()).unwrap(), ControlSettings::default());
        std::fs::write(path_in(tmp.path()), "[energy]\ncurrency = \"EUR\"").unwrap();
        let e = load(tmp.path()).unwrap_err();
        assert!(
            e.contains("control.toml") && e.contains("price_per_kwh"),
            "{e}"
        );
    }
}
