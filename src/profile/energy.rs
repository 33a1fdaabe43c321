//! `[energy]` of a profile, and the bounds a PUE and a grid intensity are held to here and in
//! control.toml (`control::settings`), so that a run and its node refuse the same values.

use serde::{Deserialize, Serialize};

/// Highest PUE accepted: the worst data centres surveyed are near 2.5; beyond 5 the figure is a
/// typo.
pub const MAX_PUE: f64 = 5.0;

/// Highest grid intensity accepted, g CO2/kWh: lignite-fired power is about 1,100–1,200.
pub const MAX_GRID_CO2_G_PER_KWH: f64 = 2000.0;

/// `[energy]`: the run's own price, grid intensity and PUE, over the node's (control.toml)
/// field by field, for its cost, CO2 and facility energy.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EnergySettings {
    /// Money per kWh.
    pub price_per_kwh: Option<f64>,
    /// Shown after the figure (`EUR`, `$`).
    pub currency: Option<String>,
    /// Grid carbon intensity, g CO2 per kWh.
    pub grid_co2_g_per_kwh: Option<f64>,
    /// The facility's power usage effectiveness (≥ 1).
    pub pue: Option<f64>,
}

/// A PUE as configured: finite, from 1 to [`MAX_PUE`].
pub fn check_pue(v: f64) -> Result<f64, String> {
    if v.is_finite() && (1.0..=MAX_PUE).contains(&v) {
        Ok(v)
    } else {
        Err(format!(
            "pue = {v}: expected the facility's energy over its IT energy, from 1 to {MAX_PUE} \
             (1.1–1.6 is typical)"
        ))
    }
}

/// A grid intensity as configured: finite, from 0 to [`MAX_GRID_CO2_G_PER_KWH`] g/kWh.
pub fn check_grid_co2(v: f64) -> Result<f64, String> {
    if v.is_finite() && (0.0..=MAX_GRID_CO2_G_PER_KWH).contains(&v) {
        Ok(v)
    } else {
        Err(format!(
            "grid_co2_g_per_kwh = {v}: expected grams of CO2 per kWh, from 0 to \
             {MAX_GRID_CO2_G_PER_KWH} (a grid mix is typically 20–900)"
        ))
    }
}
