//! One voice through a real daemon on the simulator: after `tune energy`, the advisor's input
//! says the tuner holds the run's GPUs at its best cap, and `advise` neither undoes that cap nor
//! raises it to the default; a node budget set afterwards keeps the tuner's cap as its ceiling
//! and takes the caps over; a thermal governor on a GPU takes that GPU's cap over.

use std::time::Duration;

use gpupilot::advisor::{self, HintKind, Suggestion, Thresholds};
use gpupilot::client::advise::gather;
use gpupilot::control::owner::{CapOwner, GpuOwner};

use crate::support::home::{Home, power_caps as caps};
use crate::support::wait::wait_for;
use crate::tune_energy::{QUICK, succeeded};

fn owner(owners: &[GpuOwner], gpu: u32) -> Option<CapOwner> {
    owners.iter().find(|o| o.gpu == gpu)?.owner.clone()
}

#[test]
fn after_a_tune_the_advisor_and_the_budget_leave_the_tuners_cap_alone() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let run = home.start_synthetic();
    let c = home.client();
    let mut args = vec!["tune", "energy", &run];
    args.extend(QUICK);
    succeeded(&home, &args, 120);
    let saved = home.run_dir(&run).path().join("tune-energy.json");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
    let best = r["best"]["cap_w"].as_f64().unwrap();
    assert!(best < 700.0, "{r}");
    assert_eq!(caps(&c), [best, best]);

    // Reports at the best cap, past the advisor's settling time after the last cap change.
    let tuned_at = c.status().unwrap().snapshot.unwrap().time_s;
    let th = Thresholds::default();
    wait_for(
        "reports past the settling time",
        Duration::from_secs(40),
        || {
            c.run_metrics(&run, 0).is_ok_and(|m| {
                m.points
                    .iter()
                    .filter(|p| p.t >= tuned_at + th.drop_settle_s)
                    .count()
                    >= 3
            })
        },
    );
    let input = gather(&c, &th).unwrap();
    for gpu in [0, 1] {
        let Some(CapOwner::Tuner(choice)) = owner(&input.owners, gpu) else {
            panic!("GPU {gpu}: {:#?}", input.owners)
        };
        assert_eq!(
            (
                choice.run.as_str(),
                choice.cap_w,
                choice.eta,
                &choice.gpus[..]
            ),
            (run.as_str(), best, 1.0, &[0, 1][..])
        );
        let measured = 1.0 / r["best"]["time_per_sample_s"].as_f64().unwrap();
        assert!((choice.samples_per_s.unwrap() - measured).abs() < 1e-6);
    }
    let hints = advisor::advise(&input, &th);
    assert!(
        !hints.iter().any(|h| matches!(
            h.kind,
            HintKind::ThroughputDrop | HintKind::PowerCapThrottle | HintKind::MeasuredCap
        ) || matches!(h.action, Some(Suggestion::PowerCap { .. }))),
        "{hints:#?}"
    );
    // The command line says the same.
    let (stdout, _) = succeeded(&home, &["advise", "--json"], 60);
    let said: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    for h in said.as_array().unwrap() {
        assert_ne!(h["kind"], "throughput_drop", "{said:#}");
        assert_ne!(h["action"]["action"], "power_cap", "{said:#}");
    }

    // A generous budget comes: the tuner's cap is its ceiling, and the budget now holds it.
    home.ok(&["budget", "5000"]);
    wait_for(
        "the budget to share the caps",
        Duration::from_secs(30),
        || {
            c.status()
                .ok()
                .and_then(|s| s.control)
                .and_then(|l| l.budget)
                .is_some_and(|b| !b.caps.is_empty())
        },
    );
    assert!(caps(&c).iter().all(|w| *w <= best + 0.5), "{:?}", caps(&c));
    let input = gather(&c, &th).unwrap();
    assert!(
        matches!(owner(&input.owners, 0), Some(CapOwner::Budget { budget_w, .. }) if budget_w == 5000.0),
        "{:#?}",
        input.owners
    );
    home.ok(&["budget", "off"]);

    // A governor on GPU 1 holds that GPU's cap; GPU 0 stays the tuner's.
    home.ok(&["thermal", "target", "80", "--gpu", "1"]);
    let input = gather(&c, &th).unwrap();
    assert!(
        matches!(owner(&input.owners, 1), Some(CapOwner::Governor { target_c: Some(t), .. }) if t == 80.0),
        "{:#?}",
        input.owners
    );
    assert!(matches!(owner(&input.owners, 0), Some(CapOwner::Tuner(_))));
}
