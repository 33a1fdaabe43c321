//! Alerts: hysteresis, one alert per condition, and hooks that never hold the daemon up.

use super::*;

fn temp(gpu: u32, t: f64) -> Observation {
    Observation::Temperature {
        gpu,
        temp_c: Some(t),
        limit_c: 85.0,
    }
}

#[test]
fn one_hot_gpu_is_one_alert_not_one_per_sample() {
    let mut a = Alerts::new();
    let mut raised = 0;
    let mut cleared = 0;
    // Up through the limit, hovering around it (84–87), then cooling off.
    let temps = [
        80.0, 84.0, 85.5, 86.0, 84.5, 86.5, 83.0, 85.2, 84.0, 81.0, 79.0,
    ];
    for (i, t) in temps.iter().enumerate() {
        for c in a.observe(&[temp(0, *t)], i as f64) {
            match c {
                AlertChange::Raised(al) => {
                    raised += 1;
                    assert_eq!(al.key, "temperature:gpu0");
                    assert_eq!(al.message, "GPU 0 at 86 °C (alert at 85 °C)");
                    assert_eq!(al.since_s, 2.0);
                }
                AlertChange::Cleared(al) => {
                    cleared += 1;
                    assert_eq!(al.since_s, 2.0);
                }
            }
        }
        if i == 8 {
            assert_eq!(a.active().count(), 1, "84 °C is within the hysteresis");
        }
    }
    assert_eq!((raised, cleared), (1, 1));
}

#[test]
fn power_ecc_lost_and_stalled() {
    let mut a = Alerts::new();
    let obs = |p: f64, ecc: u64, lost: bool, idle: f64| {
        vec![
            Observation::Power {
                gpu: 1,
                power_w: Some(p),
                limit_w: 600.0,
            },
            Observation::Ecc {
                gpu: 1,
                uncorrected: Some(ecc),
            },
            Observation::Lost { gpu: 2, lost },
            Observation::Stalled {
                run: "r1".into(),
                idle_s: idle,
                limit_s: 600.0,
            },
        ]
    };
    assert!(a.observe(&obs(500.0, 4, false, 10.0), 0.0).is_empty());
    let c = a.observe(&obs(610.0, 5, true, 700.0), 1.0);
    let kinds: Vec<AlertKind> = c
        .iter()
        .map(|c| match c {
            AlertChange::Raised(a) => a.kind,
            AlertChange::Cleared(_) => panic!("{c:?}"),
        })
        .collect();
    assert_eq!(
        kinds,
        [
            AlertKind::Power,
            AlertKind::Ecc,
            AlertKind::Lost,
            AlertKind::Stalled
        ]
    );
    // 580 W is above 95% of 600: the power alert holds; ECC stays; the rest clear.
    let c = a.observe(&obs(580.0, 5, false, 1.0), 2.0);
    assert_eq!(c.len(), 2, "{c:?}");
    assert_eq!(a.active().count(), 2);
    // The run ended: its observation is gone, and so is anything about it.
    let c = a.observe(&obs(500.0, 5, false, 700.0)[..2], 3.0);
    assert_eq!(c.len(), 1, "{c:?}");
    assert!(matches!(&c[0], AlertChange::Cleared(a) if a.kind == AlertKind::Power));
    let ecc = a.active().next().unwrap();
    assert!(
        ecc.message.contains("1 new uncorrected ECC error "),
        "{}",
        ecc.message
    );
}

fn straggler(ratio: Option<f64>, gpu: u32) -> Observation {
    Observation::Straggler {
        run: "r1".into(),
        ratio,
        raise_ratio: 1.10,
        gpu: Some(gpu),
        message: format!(
            "rank {gpu} on GPU {gpu} is {:.0}% slower than the median rank: thermal slowdown",
            100.0 * (ratio.unwrap_or(1.0) - 1.0)
        ),
    }
}

#[test]
fn a_straggler_is_one_alert_per_job_while_it_lasts() {
    let mut a = Alerts::new();
    assert!(a.observe(&[straggler(Some(1.04), 2)], 0.0).is_empty());
    let c = a.observe(&[straggler(Some(1.23), 2)], 1.0);
    let [AlertChange::Raised(al)] = c.as_slice() else {
        panic!("{c:?}")
    };
    assert_eq!(al.key, "straggler:r1");
    assert_eq!(
        (al.kind, al.gpu, al.run.as_deref()),
        (AlertKind::Straggler, Some(2), Some("r1"))
    );
    assert_eq!(
        al.message,
        "run r1: rank 2 on GPU 2 is 23% slower than the median rank: thermal slowdown"
    );
    assert!((al.value.unwrap() - 23.0).abs() < 1e-9);
    assert!((al.threshold.unwrap() - 10.0).abs() < 1e-9);
    // Hovering between the clear line (1.05) and the raise line, or without reports: held;
    // another rank taking the lead refreshes the message, not a new alert.
    for (t, obs) in [
        (2.0, straggler(Some(1.07), 2)),
        (3.0, straggler(None, 2)),
        (4.0, straggler(Some(1.3), 1)),
    ] {
        assert!(a.observe(&[obs], t).is_empty());
    }
    let al = a.active().next().unwrap();
    assert_eq!((al.since_s, al.gpu), (1.0, Some(1)));
    assert!(
        al.message.contains("rank 1 on GPU 1 is 30% slower"),
        "{}",
        al.message
    );
    // Clearly over, then the job ends while another straggles.
    let c = a.observe(&[straggler(Some(1.02), 1)], 5.0);
    assert!(matches!(c.as_slice(), [AlertChange::Cleared(al)] if al.kind == AlertKind::Straggler));
    a.observe(&[straggler(Some(1.5), 0)], 6.0);
    let c = a.observe(&[], 7.0);
    assert!(matches!(c.as_slice(), [AlertChange::Cleared(_)]));
}

fn payload() -> HookPayload {
    HookPayload {
        change: "raised".into(),
        node: "n1".into(),
        time: "2026-11-30T03:15:00.000Z".into(),
        alert: Alert {
            key: "temperature:gpu0".into(),
            kind: AlertKind::Temperature,
            gpu: Some(0),
            run: None,
            value: Some(91.0),
            threshold: Some(85.0),
            message: "GPU 0 at 91 °C (alert at 85 °C)".into(),
            since_s: 1.0,
        },
    }
}

#[test]
fn the_hook_reads_the_alert_as_json_on_stdin() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("alert.json");
    let argv = vec![
        "sh".to_string(),
        "-c".into(),
        format!("cat > {}", out.display()),
    ];
    let h = run_hook(&argv, &payload(), HOOK_TIMEOUT, HookUser::Daemon).unwrap();
    assert_eq!(h.join().unwrap(), HookOutcome::Exited(0));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(v["change"], "raised");
    assert_eq!(v["kind"], "temperature");
    assert_eq!(v["gpu"], 0);
    assert_eq!(v["value"], 91.0);
    assert_eq!(v["node"], "n1");
}

#[test]
fn a_hung_hook_is_killed_and_a_missing_one_is_reported() {
    let t = Instant::now();
    let argv = vec!["sleep".to_string(), "30".into()];
    let h = run_hook(
        &argv,
        &payload(),
        Duration::from_millis(200),
        HookUser::Daemon,
    )
    .unwrap();
    assert!(
        t.elapsed() < Duration::from_millis(150),
        "run_hook must not block"
    );
    assert_eq!(h.join().unwrap(), HookOutcome::TimedOut);
    assert!(t.elapsed() < Duration::from_secs(5));
    let argv = vec!["/no/such/hook".to_string()];
    let h = run_hook(&argv, &payload(), HOOK_TIMEOUT, HookUser::Daemon).unwrap();
    assert!(matches!(h.join().unwrap(), HookOutcome::Failed(_)));
    assert!(run_hook(&[], &payload(), HOOK_TIMEOUT, HookUser::Daemon).is_none());
}

/// A root daemon runs a hook only as the unprivileged user its settings name; a user's daemon
/// runs hooks as itself.
#[test]
fn a_root_daemon_runs_hooks_only_as_the_named_unprivileged_user() {
    let users = |name: &str| match name {
        "nobody" => Some((65534, 65534)),
        "toor" => Some((0, 0)),
        "alice" => Some((1000, 1000)),
        _ => None,
    };
    let e = hook_user(0, None, users).unwrap_err();
    assert!(e.contains("hook_user") && e.contains("none was run"), "{e}");
    assert_eq!(
        hook_user(0, Some("nobody"), users),
        Ok(HookUser::Ids {
            uid: 65534,
            gid: 65534
        })
    );
    let e = hook_user(0, Some("toor"), users).unwrap_err();
    assert!(e.contains("never runs as root"), "{e}");
    assert!(
        hook_user(0, Some("ghost"), users)
            .unwrap_err()
            .contains("no such user")
    );
    assert_eq!(hook_user(1000, None, users), Ok(HookUser::Daemon));
    assert_eq!(hook_user(1000, Some("alice"), users), Ok(HookUser::Daemon));
    assert!(hook_user(1000, Some("nobody"), users).is_err());

    // Run as root (as CI does): the hook really runs as that user, with no group of root's.
    if rustix::process::geteuid().as_raw() != 0 {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let out = tmp.path().join("who");
    let argv = vec![
        "sh".to_string(),
        "-c".into(),
        format!("echo $(id -u) $(id -g) $(id -G) > {}", out.display()),
    ];
    let user = HookUser::Ids {
        uid: 65534,
        gid: 65534,
    };
    let h = run_hook(&argv, &payload(), HOOK_TIMEOUT, user).unwrap();
    assert_eq!(h.join().unwrap(), HookOutcome::Exited(0));
    assert_eq!(
        std::fs::read_to_string(&out).unwrap().trim(),
        "65534 65534 65534"
    );
}

#[test]
fn a_pending_or_failed_row_remap_is_one_alert_until_it_is_gone() {
    let mut a = Alerts::new();
    let mem = |r: Option<RemappedRows>| {
        [Observation::Memory {
            gpu: 3,
            remapped: r,
            retired: None,
        }]
    };
    let healthy = RemappedRows::default();
    let pending = RemappedRows {
        uncorrectable: 1,
        pending: true,
        ..healthy
    };
    assert!(a.observe(&mem(Some(healthy)), 0.0).is_empty());
    let c = a.observe(&mem(Some(pending)), 1.0);
    let [AlertChange::Raised(al)] = c.as_slice() else {
        panic!("{c:?}");
    };
    assert_eq!(
        (al.key.as_str(), al.kind),
        ("memory:gpu3", AlertKind::Memory)
    );
    assert!(al.message.contains("waits for a reset"), "{}", al.message);
    // Still pending, or no reading for a while: the same alert, not a new one.
    assert!(a.observe(&mem(Some(pending)), 2.0).is_empty());
    assert!(a.observe(&mem(None), 3.0).is_empty());
    assert_eq!(a.active().count(), 1);
    // After the reset the remap is done: cleared.
    let c = a.observe(&mem(Some(healthy)), 4.0);
    assert!(matches!(c.as_slice(), [AlertChange::Cleared(_)]), "{c:?}");
    // A failure says what to do.
    let failed = RemappedRows {
        failure: true,
        ..healthy
    };
    let c = a.observe(&mem(Some(failed)), 5.0);
    let [AlertChange::Raised(al)] = c.as_slice() else {
        panic!("{c:?}");
    };
    assert!(al.message.contains("replaced"), "{}", al.message);
}

#[test]
fn a_pending_retirement_or_a_worn_out_page_table_is_an_alert() {
    let mut a = Alerts::new();
    let mem = |p: Option<RetiredPages>| {
        [Observation::Memory {
            gpu: 1,
            remapped: None,
            retired: p,
        }]
    };
    let healthy = RetiredPages::default();
    assert!(a.observe(&mem(Some(healthy)), 0.0).is_empty());
    let pending = RetiredPages {
        double_bit: 1,
        pending: true,
        ..healthy
    };
    let c = a.observe(&mem(Some(pending)), 1.0);
    let [AlertChange::Raised(al)] = c.as_slice() else {
        panic!("{c:?}");
    };
    assert_eq!(
        (al.key.as_str(), al.kind),
        ("memory:gpu1", AlertKind::Memory)
    );
    assert!(
        al.message.contains("page retirement waits for a reset"),
        "{}",
        al.message
    );
    // The reset retires the page: cleared.
    let done = RetiredPages {
        pending: false,
        ..pending
    };
    let c = a.observe(&mem(Some(done)), 2.0);
    assert!(matches!(c.as_slice(), [AlertChange::Cleared(_)]), "{c:?}");
    // Enough double-bit pages: replace.
    let worn = RetiredPages {
        double_bit: RetiredPages::REPLACE_DBE,
        ..healthy
    };
    let c = a.observe(&mem(Some(worn)), 3.0);
    let [AlertChange::Raised(al)] = c.as_slice() else {
        panic!("{c:?}");
    };
    assert!(al.message.contains("replaced"), "{}", al.message);
}

#[test]
fn an_xid_is_one_alert_per_gpu_and_number_cleared_an_hour_after_the_last() {
    let mut a = Alerts::new();
    let xid = |xid, last_s| Observation::Xid {
        gpu: 3,
        xid,
        last_s,
    };
    let c = a.observe(&[xid(79, 100.0)], 101.0);
    let [AlertChange::Raised(al)] = c.as_slice() else {
        panic!("{c:?}")
    };
    assert_eq!(al.key, "xid:gpu3:79");
    assert_eq!(al.kind, AlertKind::Xid);
    assert_eq!(al.value, Some(79.0));
    assert!(
        al.message
            .starts_with("GPU 3: XID 79 (GPU has fallen off the bus): "),
        "{}",
        al.message
    );
    assert!(al.message.contains("reset the GPU or reboot"));
    // The same XID again: still one alert. Another number: a second one.
    assert!(a.observe(&[xid(79, 200.0)], 201.0).is_empty());
    let c = a.observe(&[xid(79, 200.0), xid(48, 250.0)], 251.0);
    assert!(matches!(c.as_slice(), [AlertChange::Raised(al)] if al.key == "xid:gpu3:48"));
    // An hour after its last report, 79 clears; 48 still holds.
    let c = a.observe(
        &[xid(79, 200.0), xid(48, 250.0)],
        200.0 + XID_RECENT_S + 1.0,
    );
    assert!(matches!(c.as_slice(), [AlertChange::Cleared(al)] if al.key == "xid:gpu3:79"));
    assert_eq!(a.active().count(), 1);
}

#[test]
fn a_degraded_pcie_link_or_a_down_nvlink_is_one_link_alert() {
    let mut a = Alerts::new();
    let link = |pcie, busy, down: Option<Vec<u32>>| Observation::Link {
        gpu: 3,
        pcie: Some(pcie),
        busy,
        nvlink_down: down,
    };
    // An idle GPU's link at Gen1 saves power: no alert.
    assert!(
        a.observe(&[link((1, 16, 5, 16), false, None)], 1.0)
            .is_empty()
    );
    // Working at Gen4 x8 on a Gen5 x16 link: degraded.
    let c = a.observe(&[link((4, 8, 5, 16), true, None)], 2.0);
    let [AlertChange::Raised(al)] = c.as_slice() else {
        panic!("{c:?}")
    };
    assert_eq!((al.key.as_str(), al.kind), ("link:gpu3", AlertKind::Link));
    assert_eq!(
        al.message,
        "GPU 3: runs at PCIe Gen4 x8, it can do Gen5 x16 (reseat the GPU or check its riser \
         and slot)"
    );
    // Idle again, its generation down: nothing proves the link mended.
    assert!(
        a.observe(&[link((1, 16, 5, 16), false, None)], 3.0)
            .is_empty()
    );
    // Working at full speed: cleared.
    let c = a.observe(&[link((5, 16, 5, 16), true, Some(vec![]))], 4.0);
    assert!(matches!(c.as_slice(), [AlertChange::Cleared(_)]), "{c:?}");
    // A narrower link counts even idle; a link down is said with it.
    let c = a.observe(&[link((1, 8, 5, 16), false, Some(vec![5, 11]))], 5.0);
    let [AlertChange::Raised(al)] = c.as_slice() else {
        panic!("{c:?}")
    };
    assert!(
        al.message.starts_with("GPU 3: NVLink links 5, 11 down (") && al.message.contains("x8"),
        "{}",
        al.message
    );
    assert_eq!(al.value, Some(8.0));
    // A GPU that reports neither: kept as it was.
    let quiet = Observation::Link {
        gpu: 3,
        pcie: None,
        busy: true,
        nvlink_down: None,
    };
    assert!(a.observe(&[quiet], 6.0).is_empty());
}
