//! The control loops in the console: the governor of the selected GPU and the node budget (on
//! the tabs line of the GPU views), active alerts (in the footer), and a run's energy (in the
//! Run view). Text only; the views place it. Nothing shows while nothing is on, so a node
//! without governors, budget or alerts looks as it always did.

use crate::control::energy::RunEnergy;
use crate::control::status::ControlStatus;

/// `governor 78 °C: cap 540 W (−20 W, 81.3 °C > target) · budget 2400/2800 W` for GPU `gpu`,
/// or None when neither is on.
pub fn gpu_line(c: &ControlStatus, gpu: u32) -> Option<String> {
    let parts: Vec<String> = c
        .governors
        .iter()
        .filter(|g| g.gpu == gpu)
        .map(|g| g.line())
        .chain(c.budget.as_ref().map(|b| b.line()))
        .collect();
    (!parts.is_empty()).then(|| parts.join(" · "))
}

/// `⚠ GPU 0 at 91 °C (alert at 85 °C)` and, with more, `(+2 more alerts)`; None without alerts.
pub fn alert_line(c: &ControlStatus) -> Option<String> {
    let first = c.alerts.first()?;
    let more = c.alerts.len() - 1;
    Some(match more {
        0 => format!("⚠ {}", first.message),
        1 => format!("⚠ {} (+1 more alert)", first.message),
        n => format!("⚠ {} (+{n} more alerts)", first.message),
    })
}

/// `0.042 kWh · 1.23 J/sample · 0.01 EUR · 15 g CO2 · facility 0.059 kWh (PUE 1.40)` for the
/// Run view: what of cost, CO2 and PUE is configured.
pub fn energy_line(e: &RunEnergy) -> String {
    let mut s = crate::control::energy::kwh_text(e.kwh);
    if let Some(j) = e.j_per_sample {
        s.push_str(&format!(" · {j:.2} J/sample"));
    }
    for part in e.rated() {
        s.push_str(" · ");
        s.push_str(&part);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::alerts::{Alert, AlertKind};
    use crate::control::energy::{GpuEnergy, Price};
    use crate::control::status::BudgetStatus;

    #[test]
    fn lines_show_only_what_is_on() {
        let mut c = ControlStatus::default();
        assert_eq!(gpu_line(&c, 0), None);
        assert_eq!(alert_line(&c), None);
        c.budget = Some(BudgetStatus {
            budget_w: 2800.0,
            total_w: 2400.0,
            demand_w: 2000.0,
            caps: vec![],
            infeasible: None,
            by: "x".into(),
        });
        assert_eq!(gpu_line(&c, 0).as_deref(), Some("budget 2400/2800 W"));
        let alert = |m: &str| Alert {
            key: m.into(),
            kind: AlertKind::Temperature,
            gpu: Some(0),
            run: None,
            value: None,
            threshold: None,
            message: m.into(),
            since_s: 0.0,
        };
        c.alerts = vec![
            alert("GPU 0 at 91 °C (alert at 85 °C)"),
            alert("b"),
            alert("c"),
        ];
        assert_eq!(
            alert_line(&c).as_deref(),
            Some("⚠ GPU 0 at 91 °C (alert at 85 °C) (+2 more alerts)")
        );
        let e = RunEnergy::new(
            vec![GpuEnergy {
                gpu: 0,
                energy_j: 3.6e6,
            }],
            Some(1_000_000),
            Some(&Price {
                per_kwh: 0.2,
                currency: "EUR".into(),
            }),
            None,
        );
        assert_eq!(energy_line(&e), "1.000 kWh · 3.60 J/sample · 0.20 EUR");
        let e = e.with_rates(&crate::control::energy::EnergyRates {
            grid_co2_g_per_kwh: Some(250.0),
            pue: Some(1.5),
            ..Default::default()
        });
        assert_eq!(
            energy_line(&e),
            "1.000 kWh · 3.60 J/sample · 0.20 EUR · 250 g CO2 · facility 1.500 kWh (PUE 1.50)"
        );
    }
}
