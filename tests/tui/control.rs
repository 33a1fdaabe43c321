//! The control loops in the console: the selected GPU's governor and the node budget on the
//! tabs line, active alerts in the footer, a run's energy in the Run view; and nothing of the
//! sort while nothing is on.

use crate::support::tui::{app, app_with_runs, render, text};
use gpupilot::control::alerts::{Alert, AlertKind};
use gpupilot::control::energy::{GpuEnergy, Price, RunEnergy};
use gpupilot::control::governor::{CapMove as GovAction, Decision, Mode, Target};
use gpupilot::control::status::{BudgetStatus, ControlStatus, GovernorStatus};
use gpupilot::tui::{Action, ViewId};

fn control() -> ControlStatus {
    ControlStatus {
        governors: vec![GovernorStatus {
            gpu: 1,
            target: Target::Celsius(78.0),
            target_c: Some(78.0),
            mode: Mode::Tracking,
            cap_w: Some(540.0),
            user_cap_w: Some(700.0),
            last: Some(Decision {
                action: GovAction::Set {
                    from_w: 560.0,
                    to_w: 540.0,
                },
                mode: Mode::Tracking,
                temperature_c: Some(81.3),
                target_c: Some(78.0),
                why: "81.3 °C > target 78 °C: cap 560 → 540 W (-20 W)".into(),
            }),
            by: "alice".into(),
        }],
        budget: Some(BudgetStatus {
            budget_w: 2800.0,
            total_w: 2400.0,
            demand_w: 2300.0,
            caps: vec![],
            infeasible: None,
            by: "control.toml".into(),
        }),
        alerts: vec![Alert {
            key: "temperature:gpu2".into(),
            kind: AlertKind::Temperature,
            gpu: Some(2),
            run: None,
            value: Some(86.0),
            threshold: Some(85.0),
            message: "GPU 2 at 86 °C (alert at 85 °C)".into(),
            since_s: 0.0,
        }],
        ..ControlStatus::default()
    }
}

#[test]
fn governor_budget_and_alerts_show_when_on() {
    let mut a = app(4);
    a.apply(Action::SelectGpu(1));
    let before = text(&render(&mut a, 200, 50));
    assert!(before.contains("selected: GPU 1") && !before.contains("governor"));
    a.data.control = Some(control());
    let screen = text(&render(&mut a, 200, 50));
    assert!(
        screen.contains(
            "GPU 1: governor 78 °C: cap 540 W (−20 W, 81.3 °C > target) · budget 2400/2800 W"
        ),
        "{screen}"
    );
    assert!(
        screen.contains("⚠ GPU 2 at 86 °C (alert at 85 °C)"),
        "{screen}"
    );
    // Another GPU: no governor there, the budget still.
    a.apply(Action::SelectGpu(0));
    let screen = text(&render(&mut a, 200, 50));
    assert!(screen.contains("GPU 0: budget 2400/2800 W"), "{screen}");
    // A tiny terminal must not panic.
    render(&mut a, 20, 5);
}

#[test]
fn a_runs_energy_is_one_line_of_the_run_view() {
    let mut a = app_with_runs();
    a.apply(Action::ShowView(ViewId::Run));
    let before = text(&render(&mut a, 200, 50));
    assert!(!before.contains("kWh"));
    let runs = a.data.runs.as_mut().unwrap();
    for r in runs.iter_mut() {
        r.energy = Some(RunEnergy::new(
            vec![GpuEnergy {
                gpu: 0,
                energy_j: 1.8e6,
            }],
            Some(600_000),
            Some(&Price {
                per_kwh: 0.3,
                currency: "EUR".into(),
            }),
            None,
        ));
    }
    let screen = text(&render(&mut a, 200, 50));
    assert!(
        screen.contains("energy 0.500 kWh · 3.00 J/sample · 0.15 EUR"),
        "{screen}"
    );
    // Narrower, whole figures or none: a cut `3.00 J/sample` would read `3.00 J/s`.
    for width in [80, 90, 100] {
        let screen = text(&render(&mut a, width, 30));
        let line = screen
            .lines()
            .find(|l| l.contains("restarts"))
            .unwrap_or_else(|| panic!("{screen}"));
        if let Some(at) = line.find("energy ") {
            let shown = line[at..].trim_end_matches(['│', ' ']);
            assert!(
                "energy 0.500 kWh · 3.00 J/sample · 0.15 EUR".starts_with(shown)
                    && ["kWh", "J/sample", "EUR"]
                        .iter()
                        .any(|u| shown.ends_with(u)),
                "{width} columns: {line}"
            );
        }
    }
}
