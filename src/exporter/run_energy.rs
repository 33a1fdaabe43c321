//! What each live run has cost so far on `/metrics`: its GPUs' energy and, where configured
//! (control.toml's `[energy]`, or the run's profile), the money, the CO2 and the facility's
//! energy through its PUE. Counters, since each only grows while the run lives; a figure that
//! is not configured is no series, never 0.

use super::{Input, Node, family, labels};
use crate::control::energy::RunEnergy;
use crate::protocol::RunInfo;

/// The run-energy families, one series per live run that has a figure.
pub(super) fn families(out: &mut String, input: &Input<'_>) {
    let host = Node::of(input);
    let run_labels = |r: &RunInfo, extra: Option<(&str, &str)>| -> String {
        let mut pairs = vec![("run", r.id.as_str()), ("name", r.name.as_str())];
        pairs.extend(extra);
        pairs.extend([("gpus", r.gpus.as_str()), (host.key, host.host)]);
        labels(&pairs)
    };
    type Pick = fn(&RunEnergy) -> Option<f64>;
    let fields: [(&str, &str, Pick); 4] = [
        (
            "gpupilot_run_energy_joules_total",
            "Energy of the run's GPUs since it started (joules).",
            |e| Some(e.energy_j),
        ),
        (
            "gpupilot_run_co2_grams_total",
            "The run's GPU energy times the configured grid intensity (grams of CO2).",
            |e| e.co2_g,
        ),
        (
            "gpupilot_run_facility_energy_joules_total",
            "The run's GPU energy times the configured PUE: with the facility's share (joules).",
            |e| {
                e.facility_kwh
                    .map(|k| k * crate::control::energy::J_PER_KWH)
            },
        ),
        (
            "gpupilot_run_facility_co2_grams_total",
            "The run's facility energy times the configured grid intensity (grams of CO2).",
            |e| e.facility_co2_g,
        ),
    ];
    for (name, help, pick) in fields {
        let samples: Vec<(String, f64)> = input
            .runs
            .iter()
            .filter_map(|(r, _)| {
                let v = pick(r.energy.as_ref()?)?;
                Some((run_labels(r, None), v))
            })
            .collect();
        family(out, name, help, "counter", &samples);
    }
    // Money carries its currency as a label (empty when none is configured).
    let money = |pick: Pick| -> Vec<(String, f64)> {
        input
            .runs
            .iter()
            .filter_map(|(r, _)| {
                let e = r.energy.as_ref()?;
                let v = pick(e)?;
                let cur = e.currency.as_deref().unwrap_or("");
                Some((run_labels(r, Some(("currency", cur))), v))
            })
            .collect()
    };
    family(
        out,
        "gpupilot_run_energy_cost_total",
        "The run's GPU energy at the configured price per kWh (in `currency`).",
        "counter",
        &money(|e| e.cost),
    );
    family(
        out,
        "gpupilot_run_facility_energy_cost_total",
        "The run's facility energy (× PUE) at the configured price per kWh (in `currency`).",
        "counter",
        &money(|e| e.facility_cost),
    );
    let pue: Vec<(String, f64)> = input
        .runs
        .iter()
        .filter_map(|(r, _)| Some((run_labels(r, None), r.energy.as_ref()?.pue?)))
        .collect();
    family(
        out,
        "gpupilot_run_pue",
        "The facility's power usage effectiveness the run's figures use.",
        "gauge",
        &pue,
    );
}

#[cfg(test)]
mod tests {
    use super::super::{HostnameLabel, Input, render};
    use crate::control::energy::{EnergyRates, GpuEnergy, J_PER_KWH, Price, RunEnergy};
    use crate::protocol::{RunInfo, TrainerInfo};
    use crate::telemetry::Snapshot;

    fn run(id: &str, energy: Option<RunEnergy>) -> (RunInfo, TrainerInfo) {
        let mut info: RunInfo = serde_json::from_value(serde_json::json!({
            "id": id, "name": "rn50", "status": "running", "pid": 1,
            "attempt": 0, "restarts": 0, "started_at": "2025-01-01T00:00:00Z", "ended_at": null,
            "uptime_s": 1.0, "exit_code": null, "signal_name": null, "description": null,
            "command": ["x"], "cwd": "/", "gpus": "0", "adopted": false, "dir": "/tmp/x"
        }))
        .unwrap();
        info.energy = energy;
        (info, TrainerInfo::default())
    }

    fn page(runs: &[(RunInfo, TrainerInfo)]) -> String {
        render(&Input {
            hostname: "n",
            hostname_label: HostnameLabel::Hostname,
            snapshot: Some(&Snapshot::default()),
            runs,
            control: None,
        })
    }

    #[test]
    fn a_runs_cost_co2_and_facility_energy_are_counters_where_configured() {
        let two_kwh = vec![GpuEnergy {
            gpu: 0,
            energy_j: 2.0 * J_PER_KWH,
        }];
        let rates = EnergyRates {
            price: Some(Price {
                per_kwh: 0.25,
                currency: "EUR".into(),
            }),
            grid_co2_g_per_kwh: Some(300.0),
            pue: Some(1.5),
        };
        let priced = RunEnergy::new(two_kwh.clone(), None, None, None).with_rates(&rates);
        let bare = RunEnergy::new(two_kwh, None, None, None);
        let p = page(&[
            run("r-priced", Some(priced)),
            run("r-bare", Some(bare)),
            run("r-none", None),
        ]);
        let l = |id: &str| format!("{{run=\"{id}\",name=\"rn50\",gpus=\"0\",Hostname=\"n\"}}");
        assert!(p.contains("# TYPE gpupilot_run_energy_joules_total counter\n"));
        assert!(p.contains(&format!(
            "gpupilot_run_energy_joules_total{} 7200000\n",
            l("r-priced")
        )));
        assert!(p.contains(&format!(
            "gpupilot_run_energy_joules_total{} 7200000\n",
            l("r-bare")
        )));
        assert!(
            !p.lines()
                .any(|line| line.starts_with("gpupilot_run_energy") && line.contains("r-none")),
            "no energy yet: no series\n{p}"
        );
        assert!(p.contains(&format!(
            "gpupilot_run_co2_grams_total{} 600\n",
            l("r-priced")
        )));
        assert!(p.contains(&format!(
            "gpupilot_run_facility_energy_joules_total{} 10800000\n",
            l("r-priced")
        )));
        assert!(p.contains(&format!(
            "gpupilot_run_facility_co2_grams_total{} 900\n",
            l("r-priced")
        )));
        assert!(p.contains(&format!("gpupilot_run_pue{} 1.5\n", l("r-priced"))));
        assert!(p.contains(
            "gpupilot_run_energy_cost_total{run=\"r-priced\",name=\"rn50\",currency=\"EUR\",gpus=\"0\",Hostname=\"n\"} 0.5\n"
        ));
        assert!(p.contains(
            "gpupilot_run_facility_energy_cost_total{run=\"r-priced\",name=\"rn50\",currency=\"EUR\",gpus=\"0\",Hostname=\"n\"} 0.75\n"
        ));
        // Nothing configured for the bare run: its energy only, never a 0 for the rest.
        for name in ["co2_grams", "facility", "cost", "pue"] {
            assert!(
                !p.lines()
                    .any(|line| line.contains(name) && line.contains("r-bare")),
                "{name} for an unconfigured run\n{p}"
            );
        }
    }
}
