//! What the control loops show their clients: the `thermal` answer, the `control` field of
//! `status`, and the console's governor, budget and alert lines. Values only; the daemon's
//! control loop (`daemon::control::loops`) fills them in.

use serde::{Deserialize, Serialize};

use super::alerts::Alert;
use super::energy::{GpuEnergy, Price};
use super::governor::{Decision, Mode, Target};

/// The control loops at one moment.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ControlStatus {
    /// One per governed GPU, by index.
    #[serde(default)]
    pub governors: Vec<GovernorStatus>,
    #[serde(default)]
    pub budget: Option<BudgetStatus>,
    /// Alerts active now.
    #[serde(default)]
    pub alerts: Vec<Alert>,
    /// Energy per GPU since the daemon started.
    #[serde(default)]
    pub energy: Vec<GpuEnergy>,
    /// The configured price of energy (`$CONFIG/control.toml`).
    #[serde(default)]
    pub price: Option<Price>,
    /// Why the loops cannot act, when they cannot (no control handle, read-only daemon, …).
    #[serde(default)]
    pub notes: Vec<String>,
}

/// One GPU's governor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GovernorStatus {
    pub gpu: u32,
    pub target: Target,
    /// The target in °C for this GPU (a margin resolved against its slowdown threshold).
    pub target_c: Option<f64>,
    pub mode: Mode,
    /// The cap the governor asks for now, watts.
    pub cap_w: Option<f64>,
    /// The user's cap: the governor never goes above it.
    pub user_cap_w: Option<f64>,
    /// The newest decision.
    pub last: Option<Decision>,
    /// Who turned it on: a person (`alice (uid 1000) via …`), `run ID` or `control.toml`.
    pub by: String,
}

impl GovernorStatus {
    /// `governor 78 °C: cap 540 W (−20 W, 81.3 °C > target)`, for the console.
    pub fn line(&self) -> String {
        let target = self
            .target_c
            .map_or_else(|| self.target.describe(), |c| format!("{c:.0} °C"));
        let cap = self
            .cap_w
            .map_or_else(|| "cap ?".to_string(), |c| format!("cap {c:.0} W"));
        let detail = match &self.last {
            _ if self.mode == Mode::Stale => "holding: telemetry stale".to_string(),
            _ if self.mode == Mode::Refused => {
                "not acting: the GPU's power limits are implausible".to_string()
            }
            Some(d) => {
                let temp = d
                    .temperature_c
                    .map(|t| {
                        let rel = match d.target_c {
                            Some(tc) if t > tc => " > target",
                            Some(tc) if t < tc => " < target",
                            Some(_) => " at target",
                            None => "",
                        };
                        format!("{t:.1} °C{rel}")
                    })
                    .unwrap_or_default();
                match d.action {
                    super::governor::CapMove::Set { from_w, to_w } => {
                        format!("{:+.0} W, {temp}", to_w - from_w).replace('-', "−")
                    }
                    super::governor::CapMove::Hold => match self.mode {
                        Mode::Settled => format!("settled, {temp}"),
                        Mode::AtCeiling => format!("at its ceiling, {temp}"),
                        Mode::AtFloor => format!("at the minimum, {temp}"),
                        _ => format!("holding, {temp}"),
                    },
                }
            }
            None => "starting".to_string(),
        };
        format!("governor {target}: {cap} ({detail})")
    }
}

/// One cap the budget (or the governor, on its way out) moved.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CapChange {
    pub gpu: u32,
    pub old_w: f64,
    pub new_w: f64,
}

/// The node power budget.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BudgetStatus {
    pub budget_w: f64,
    /// Sum of the caps set now, watts.
    pub total_w: f64,
    /// What the GPUs would take, watts.
    pub demand_w: f64,
    /// `(gpu, cap watts)`.
    pub caps: Vec<(u32, f64)>,
    /// Why the budget cannot be met, when it cannot.
    pub infeasible: Option<String>,
    /// Who set it.
    pub by: String,
}

impl BudgetStatus {
    /// `budget 2400/2800 W`, for the console.
    pub fn line(&self) -> String {
        let mut s = format!("budget {:.0}/{:.0} W", self.total_w, self.budget_w);
        if self.infeasible.is_some() {
            s.push_str(" (cannot be met: every cap at its minimum)");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::governor::CapMove;

    #[test]
    fn console_lines() {
        let g = GovernorStatus {
            gpu: 0,
            target: Target::Celsius(78.0),
            target_c: Some(78.0),
            mode: Mode::Tracking,
            cap_w: Some(540.0),
            user_cap_w: None,
            last: Some(Decision {
                action: CapMove::Set {
                    from_w: 560.0,
                    to_w: 540.0,
                },
                mode: Mode::Tracking,
                temperature_c: Some(81.3),
                target_c: Some(78.0),
                why: String::new(),
            }),
            by: "daemon".into(),
        };
        assert_eq!(
            g.line(),
            "governor 78 °C: cap 540 W (−20 W, 81.3 °C > target)"
        );
        let b = BudgetStatus {
            budget_w: 2800.0,
            total_w: 2400.0,
            demand_w: 2300.0,
            caps: vec![],
            infeasible: None,
            by: "x".into(),
        };
        assert_eq!(b.line(), "budget 2400/2800 W");
    }
}
