use super::*;
use crate::control::alerts::{Alert, AlertKind};

/// GPU `gpu`'s setting `what` changed `old` → `new` by a user, for no recorded reason.
fn setting(gpu: u32, what: &str, old: &str, new: &str) -> NodeEvent {
    NodeEvent::GpuChanged {
        gpu,
        what: what.into(),
        old: Some(old.into()),
        new: Some(new.into()),
        by: "alice (uid 1000)".into(),
        why: None,
    }
}

fn cap(gpu: u32, old: &str, new: &str, by: &str) -> NodeEvent {
    NodeEvent::GpuChanged {
        gpu,
        what: "power_limit".into(),
        old: Some(old.into()),
        new: Some(new.into()),
        by: by.into(),
        why: Some("too hot".into()),
    }
}

#[test]
fn a_power_cap_reads_whole_with_its_undo() {
    let e = cap(1, "700 W", "300 W", "root (uid 0) via gpupilot (pid 9)");
    let w = words(&e);
    assert_eq!(w.subject, "GPU 1");
    assert_eq!(w.change, "power limit 700 W → 300 W");
    assert_eq!(w.why, "too hot");
    assert_eq!(
        w.line(),
        "root (uid 0) via gpupilot (pid 9): GPU 1 power limit 700 W → 300 W — too hot"
    );
    assert_eq!(actor(&w.who), "a user");
    assert_eq!(undo(&e).as_deref(), Some("gpupilot power cap 700 --gpu 1"));
    let odd = cap(0, "700.5 W", "300 W", "daemon");
    assert_eq!(
        undo(&odd).as_deref(),
        Some("gpupilot power cap 700.5 --gpu 0")
    );
    let unknown = NodeEvent::GpuChanged {
        gpu: 2,
        what: "power_limit".into(),
        old: None,
        new: Some("300 W".into()),
        by: "daemon".into(),
        why: None,
    };
    assert_eq!(
        undo(&unknown).as_deref(),
        Some("gpupilot power reset --gpu 2")
    );
}

#[test]
fn clocks_and_target_temperature_undo_to_what_they_were() {
    let clocks = setting(0, "locked_clocks", "1000–1500 MHz", "1200–1400 MHz");
    assert_eq!(
        words(&clocks).change,
        "locked SM clocks 1000–1500 MHz → 1200–1400 MHz"
    );
    assert_eq!(
        undo(&clocks).as_deref(),
        Some("gpupilot clocks lock 1000 1500 --gpu 0")
    );
    let unlocked = setting(0, "locked_clocks", "unlocked", "1200–1400 MHz");
    assert_eq!(
        undo(&unlocked).as_deref(),
        Some("gpupilot clocks reset --gpu 0")
    );
    let max = setting(3, "gpu_max_temp", "87 °C", "80 °C");
    assert_eq!(words(&max).change, "target temperature 87 °C → 80 °C");
    assert_eq!(
        undo(&max).as_deref(),
        Some("gpupilot power gpu-max 87 --gpu 3")
    );
}

#[test]
fn a_cap_the_tuner_asked_for_through_the_socket_reads_as_the_tuner_s() {
    let mut e = cap(1, "700 W", "600 W", "root (uid 0) via gpupilot (pid 9)");
    if let NodeEvent::GpuChanged { why, .. } = &mut e {
        *why = Some("energy tuner: trying a cap".into());
    }
    let w = words(&e);
    assert_eq!(
        w.line(),
        "energy tuner: GPU 1 power limit 700 W → 600 W — trying a cap"
    );
    assert_eq!(
        w.through.as_deref(),
        Some("root (uid 0) via gpupilot (pid 9)")
    );
    assert_eq!(actor(&w.who), "energy tuner");
    // A user's why that merely mentions the tuner is the user's.
    let mut user = cap(1, "700 W", "600 W", "alice (uid 1000)");
    if let NodeEvent::GpuChanged { why, .. } = &mut user {
        *why = Some("undo what the energy tuner did".into());
    }
    assert_eq!(words(&user).who, "alice (uid 1000)");
    assert_eq!(words(&user).through, None);
}

#[test]
fn a_tuner_step_names_the_gpus_the_caps_and_the_job() {
    let e = NodeEvent::Tune {
        job: "tune-train-3".into(),
        run: "train-3".into(),
        change: "cap".into(),
        gpus: vec![1],
        old_w: Some(700.0),
        cap_w: Some(600.0),
        cost: None,
        why: None,
    };
    let w = words(&e);
    assert_eq!(
        w.line(),
        "energy tuner: GPU 1 cap 700 W → 600 W (job tune-train-3, searching)"
    );
    assert_eq!(actor(&w.who), "energy tuner");
    assert_eq!(undo(&e).as_deref(), Some("gpupilot tune stop tune-train-3"));
    assert!(numbers(&e).contains(&("cap".to_string(), "600 W".to_string())));
    assert!(numbers(&e).contains(&("old".to_string(), "700 W".to_string())));
    // A line of an older daemon: no GPUs, no cap before.
    let old = NodeEvent::Tune {
        job: "tune-train-3".into(),
        run: "train-3".into(),
        change: "cap".into(),
        gpus: vec![],
        old_w: None,
        cap_w: Some(600.0),
        cost: None,
        why: None,
    };
    assert_eq!(
        words(&old).line(),
        "energy tuner: run train-3 cap → 600 W (job tune-train-3, searching)"
    );
    let done = NodeEvent::Tune {
        job: "tune-r".into(),
        run: "r".into(),
        change: "done".into(),
        gpus: vec![0, 1],
        old_w: None,
        cap_w: Some(550.0),
        cost: Some(0.5),
        why: Some("saves 12%".into()),
    };
    assert_eq!(
        words(&done).line(),
        "energy tuner: GPUs 0,1 best cap 550 W set (job tune-r, done) — saves 12%"
    );
    assert_eq!(undo(&done), None);
}

#[test]
fn an_alert_reads_as_a_measurement_against_its_limit() {
    let alert = Alert {
        key: "temperature:gpu1".into(),
        kind: AlertKind::Temperature,
        gpu: Some(1),
        run: None,
        value: Some(91.0),
        threshold: Some(90.0),
        message: "GPU 1 at 91 °C (alert at 90 °C)".into(),
        since_s: 1.8e9,
    };
    let raised = NodeEvent::Alert {
        change: "raised".into(),
        alert: alert.clone(),
    };
    let w = words(&raised);
    assert_eq!(
        format!("{}: {} {}", w.who, w.subject, w.change),
        "alert: GPU 1 temperature 91 °C ≥ 90 °C"
    );
    assert_eq!(actor(&w.who), "alert");
    let cleared = NodeEvent::Alert {
        change: "cleared".into(),
        alert: alert.clone(),
    };
    assert_eq!(
        words(&cleared).change,
        "temperature over (raised at temperature 91 °C ≥ 90 °C)"
    );
    let nums = numbers(&raised);
    assert!(
        nums.contains(&("alert value".into(), "91".into())),
        "{nums:?}"
    );
    assert!(
        !nums.iter().any(|(k, _)| k.contains("since")),
        "the epoch seconds are not a number to show: {nums:?}"
    );
    let stalled = NodeEvent::Alert {
        change: "raised".into(),
        alert: Alert {
            kind: AlertKind::Stalled,
            gpu: None,
            run: Some("r1".into()),
            value: Some(120.0),
            threshold: Some(60.0),
            message: "run r1 wrote nothing for 120 s".into(),
            ..alert
        },
    };
    assert_eq!(
        words(&stalled).line(),
        "alert: run r1 stalled — run r1 wrote nothing for 120 s"
    );
}

#[test]
fn governor_and_budget_steps_read_in_words() {
    let g = NodeEvent::Governor {
        gpu: 2,
        change: "cap".into(),
        target_c: Some(80.0),
        temperature_c: Some(84.2),
        old_w: Some(700.0),
        new_w: Some(650.0),
        by: crate::control::node::BY_GOVERNOR.into(),
        why: "above target".into(),
    };
    let w = words(&g);
    assert_eq!(w.change, "cap 700 W → 650 W (target 80 °C, at 84 °C)");
    assert_eq!(actor(&w.who), "thermal governor");
    assert_eq!(undo(&g).as_deref(), Some("gpupilot thermal off --gpu 2"));
    let b = NodeEvent::Budget {
        budget_w: Some(1000.0),
        total_w: Some(1000.0),
        caps: vec![crate::control::status::CapChange {
            gpu: 0,
            old_w: 700.0,
            new_w: 500.0,
        }],
        by: crate::control::node::BY_BUDGET.into(),
        why: "caps follow demand".into(),
    };
    assert_eq!(words(&b).change, "GPU 0 cap 700 W → 500 W (budget 1000 W)");
    assert_eq!(actor(&words(&b).who), "node power budget");
    let set = NodeEvent::Budget {
        budget_w: Some(1200.0),
        total_w: None,
        caps: vec![],
        by: "alice (uid 1000)".into(),
        why: String::new(),
    };
    assert_eq!(words(&set).change, "node budget set to 1200 W");
    assert_eq!(undo(&set).as_deref(), Some("gpupilot budget off"));
}

#[test]
fn a_knob_change_undoes_to_the_old_value() {
    let e = NodeEvent::KnobChanged {
        run: "20261130-041500-train".into(),
        change: 4,
        knob: KnobName::BatchSize,
        old: Some(256),
        new: 512,
        via: KnobVia::Trainer,
        by: "alice (uid 1000) via gpupilot (pid 4242)".into(),
        why: Some("memory headroom".into()),
    };
    let w = words(&e);
    assert_eq!(w.change, "batch size 256 → 512");
    assert_eq!(
        undo(&e).as_deref(),
        Some("gpupilot set 20261130-041500-train batch-size 256")
    );
}

#[test]
fn no_row_is_a_dump_of_fields() {
    // Every kind of event the tests above build, and the rest: none reads as key=value or
    // JSON.
    let events = [
        cap(1, "700 W", "300 W", "daemon"),
        NodeEvent::PowerChangedOutside {
            gpu: 0,
            uuid: None,
            old_w: 700.0,
            new_w: 450.0,
        },
        NodeEvent::DaemonStopped {
            pid: 1,
            reason: "SIGTERM".into(),
        },
    ];
    for e in &events {
        let line = words(e).line();
        assert!(
            !line.contains('=') && !line.contains('{') && !line.contains('"'),
            "{line}"
        );
    }
    assert_eq!(
        undo(&events[1]).as_deref(),
        Some("gpupilot power cap 700 --gpu 0")
    );
}

#[test]
fn a_change_to_several_ranks_reads_as_agreed_applied_or_called_off() {
    let knob = KnobName::BatchSize;
    let staged = NodeEvent::KnobStaged {
        run: "r".into(),
        change: 3,
        knob,
        value: 64,
        apply_step: 1234,
        ranks: 4,
        rtt_ms: 3.08,
    };
    let w = words(&staged);
    assert_eq!(
        (w.change.as_str(), w.why.as_str()),
        (
            "batch size → 64 agreed by all 4 ranks",
            "every rank applies it at step 1234; agreed in 3.1 ms"
        )
    );
    let applied = NodeEvent::KnobApplied {
        run: "r".into(),
        change: 3,
        knob,
        value: 64,
        rtt_ms: 9.0,
        ranks: Some(4),
        step: Some(1234),
    };
    assert_eq!(
        words(&applied).change,
        "batch size = 64 applied on 4 ranks at step 1234"
    );
    let rejected = |reason: &str, rank| NodeEvent::KnobRejected {
        run: "r".into(),
        change: 3,
        knob,
        value: 64,
        kept: Some(32),
        reason: reason.into(),
        rtt_ms: 5.0,
        rank,
    };
    let off = words(&rejected(
        "called off on every rank: rank 2 refused: out of memory",
        Some(2),
    ));
    assert_eq!(
        (off.change.as_str(), off.why.as_str()),
        (
            "batch size = 64 called off",
            "rank 2 refused: out of memory; every rank keeps 32"
        )
    );
    let partial = rejected(
        "applied at step 1234 by 3 of 4 ranks (rank 1: gone)",
        Some(1),
    );
    assert_eq!(
        words(&partial).change,
        "batch size = 64 not applied by every rank"
    );
    assert_eq!(
        words(&rejected("out of memory", None)).change,
        "batch size = 64 rejected"
    );
}

#[test]
fn an_xid_reads_with_its_meaning_and_what_to_do() {
    let e = NodeEvent::Xid {
        gpu: 2,
        uuid: None,
        xid: 48,
        name: "Double Bit ECC Error".into(),
        action: String::new(),
        repeats: None,
    };
    let w = words(&e);
    assert_eq!(
        (w.who.as_str(), w.subject.as_str(), w.change.as_str()),
        ("driver", "GPU 2", "XID 48")
    );
    assert!(
        w.why
            .starts_with("Double Bit ECC Error: GPU memory returned"),
        "{}",
        w.why
    );
    assert!(
        w.why
            .ends_with("drain the GPU and reset it; replace it if it happens again")
    );
    assert_eq!(actor(&w.who), "GPU driver");
}

#[test]
fn events_are_picked_by_run_and_by_gpu() {
    let knob = NodeEvent::KnobChanged {
        run: "r1".into(),
        change: 1,
        knob: KnobName::Prefetch,
        old: Some(2),
        new: 4,
        via: KnobVia::Restart,
        by: "daemon".into(),
        why: None,
    };
    assert!(about_run(&knob, "r1") && !about_run(&knob, "r2"));
    assert!(!about_gpu(&knob, &[0, 1]));
    let c = cap(1, "700 W", "300 W", "daemon");
    assert!(about_gpu(&c, &[1]) && about_gpu(&c, &[0, 1]) && !about_gpu(&c, &[0]));
    assert!(!about_run(&c, "r1"));
    let tune = NodeEvent::Tune {
        job: "tune-r1".into(),
        run: "r1".into(),
        change: "cap".into(),
        gpus: vec![2, 3],
        old_w: None,
        cap_w: Some(500.0),
        cost: None,
        why: None,
    };
    assert!(about_run(&tune, "r1") && about_gpu(&tune, &[3]) && !about_gpu(&tune, &[1]));
    let budget = NodeEvent::Budget {
        budget_w: Some(900.0),
        total_w: None,
        caps: vec![crate::control::status::CapChange {
            gpu: 4,
            old_w: 700.0,
            new_w: 450.0,
        }],
        by: "power budget".into(),
        why: String::new(),
    };
    assert!(about_gpu(&budget, &[4]) && !about_gpu(&budget, &[0]));
}

#[test]
fn a_clock_search_step_is_in_mhz_in_its_words_and_its_numbers() {
    let e = NodeEvent::Tune {
        job: "tune-train-3".into(),
        run: "train-3".into(),
        change: "clock".into(),
        gpus: vec![0, 1],
        old_w: Some(1980.0),
        cap_w: Some(1680.0),
        cost: None,
        why: None,
    };
    let line = words(&e).line();
    assert!(
        line.contains("SM clocks locked up to 1980 MHz → 1680 MHz (job tune-train-3, searching)"),
        "{line}"
    );
    assert!(!line.contains(" W"), "{line}");
    let n = numbers(&e);
    assert!(
        n.contains(&("SM clock lock".to_string(), "1680 MHz".to_string())),
        "{n:?}"
    );
    assert!(n.iter().all(|(_, v)| !v.ends_with(" W")), "{n:?}");
    assert_eq!(undo(&e).as_deref(), Some("gpupilot tune stop tune-train-3"));
    let done = NodeEvent::Tune {
        job: "tune-train-3".into(),
        run: "train-3".into(),
        change: "clock_done".into(),
        gpus: vec![0, 1],
        old_w: None,
        cap_w: Some(1680.0),
        cost: Some(1.2),
        why: None,
    };
    assert!(
        words(&done)
            .line()
            .contains("best SM clock lock up to 1680 MHz set")
    );
}
