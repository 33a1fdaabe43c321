//! The control loops inside a daemon (no socket): thermal and budget requests move the
//! simulator's caps through the daemon's control handle and land in the node's event log;
//! `status` shows them; a read-only daemon refuses them; a run's energy reaches `ps` and its
//! `summary.json`; a job of several ranks has its GPUs held at one cap. Simulated time is
//! driven by hand (see `support::sim_daemon`), so nothing here waits on physics.

use std::time::Duration;

use gpupilot::daemon::{Attach, Daemon};
use gpupilot::profile::Profile;
use gpupilot::protocol::{ErrorCode, NodeEvent, RankSpec, Request, Response, TargetGpus};
use gpupilot::supervisor::Caller;
use gpupilot::telemetry::Source;

use crate::support::sim_daemon::{caps, daemon, me, sim, tick};
use crate::support::wait::poll;

fn node_events(d: &Daemon) -> Vec<NodeEvent> {
    let Response::Events { events, .. } = d.answer(
        &me(),
        Request::Events {
            since: 0,
            max: None,
        },
    ) else {
        panic!("no events")
    };
    events.into_iter().map(|e| e.event).collect()
}

#[test]
fn a_governor_asked_for_moves_its_gpus_cap_and_lets_go_when_turned_off() {
    let tmp = tempfile::tempdir().unwrap();
    let src = sim();
    let d = daemon(tmp.path(), false, &src);
    tick(&d, &src);
    let r = d.answer(
        &me(),
        Request::ThermalSet {
            gpus: TargetGpus::Some(vec![0]),
            target_c: Some(70.0),
            margin_c: None,
            why: Some("test".into()),
        },
    );
    let Response::Control(c) = r else {
        panic!("{r:?}")
    };
    assert_eq!(c.governors.len(), 1);
    for _ in 0..200 {
        tick(&d, &src);
    }
    let c = caps(&src);
    assert!(c[0] < 620.0, "GPU 0 is governed: {c:?}");
    assert_eq!(c[1], 700.0, "GPU 1 is not");
    let t0 = src.sample_gpu(0).temperature_c.unwrap();
    assert!((t0 - 70.0).abs() <= 2.0, "{t0}");
    let Response::Status(s) = d.answer(&me(), Request::Status {}) else {
        panic!()
    };
    let control = s.control.expect("status carries the loops");
    assert!(
        control.governors[0]
            .line()
            .starts_with("governor 70 °C: cap ")
    );
    let events = node_events(&d);
    assert!(events.iter().any(|e| matches!(e, NodeEvent::Governor { change, by, .. } if change == "on" && by.contains("uid"))));
    assert!(
        events
            .iter()
            .any(|e| matches!(e, NodeEvent::Governor { change, gpu: 0, .. } if change == "cap"))
    );
    // Off: the cap found when it started (700 W) comes back at the next snapshot.
    let r = d.answer(
        &me(),
        Request::ThermalOff {
            gpus: TargetGpus::All,
            why: None,
        },
    );
    assert!(
        matches!(r, Response::Control(ref c) if c.governors.is_empty()),
        "{r:?}"
    );
    tick(&d, &src);
    assert_eq!(caps(&src), vec![700.0, 700.0]);
    // Bad requests change nothing.
    for bad in [
        Request::ThermalSet {
            gpus: TargetGpus::Some(vec![7]),
            target_c: Some(70.0),
            margin_c: None,
            why: None,
        },
        Request::ThermalSet {
            gpus: TargetGpus::All,
            target_c: Some(70.0),
            margin_c: Some(5.0),
            why: None,
        },
        Request::PowerBudget {
            budget_w: Some(-3.0),
            why: None,
        },
    ] {
        let r = d.answer(&me(), bad);
        assert!(
            matches!(
                r,
                Response::Error {
                    code: ErrorCode::BadRequest,
                    ..
                }
            ),
            "{r:?}"
        );
    }
}

/// A raw request and the command line accept the same values: at each bound, just inside and
/// just outside, the daemon answers `bad_request` exactly where `gpupilot` refuses to send, with
/// the same bounds in words. Observed: budgets of 1e-6 W and 1e308 W went through the raw
/// protocol; a target of 130 °C through the command line.
#[test]
fn raw_requests_have_the_command_lines_bounds() {
    use clap::Parser;
    use gpupilot::cli::Cli;
    use gpupilot::protocol::bounds::{self, Bound};
    let tmp = tempfile::tempdir().unwrap();
    let src = sim();
    let d = daemon(tmp.path(), false, &src);
    tick(&d, &src);
    type Ask = fn(f64) -> Request;
    let cases: [(Bound, &[&str], Ask); 4] = [
        (bounds::BUDGET_W, &["budget"], |w| Request::PowerBudget {
            budget_w: Some(w),
            why: None,
        }),
        (bounds::CAP_W, &["power", "cap"], |w| Request::PowerCap {
            gpus: TargetGpus::All,
            watts: w,
            why: None,
        }),
        (bounds::TARGET_C, &["thermal", "target"], |c| {
            Request::ThermalSet {
                gpus: TargetGpus::All,
                target_c: Some(c),
                margin_c: None,
                why: None,
            }
        }),
        (bounds::MARGIN_C, &["thermal", "target", "--margin"], |m| {
            Request::ThermalSet {
                gpus: TargetGpus::All,
                target_c: None,
                margin_c: Some(m),
                why: None,
            }
        }),
    ];
    // Whether `gpupilot WORDS… V` parses.
    let cli_takes = |words: &[&str], v: f64| {
        let text = v.to_string();
        let argv = ["gpupilot"].iter().chain(words).copied();
        Cli::try_parse_from(argv.chain([text.as_str()])).is_ok()
    };
    for (b, words, ask) in cases {
        let outside = [b.lo - 0.5, b.hi + 0.5, 1e-6_f64.min(b.lo - 0.5), 1e308];
        for v in outside {
            assert!(!cli_takes(words, v), "{words:?} {v}");
            let r = d.answer(&me(), ask(v));
            let Response::Error {
                code: ErrorCode::BadRequest,
                message,
            } = &r
            else {
                panic!("{} {v}: {r:?}", b.what)
            };
            assert!(
                message.contains(&format!("{} must be {}", b.what, b.range())),
                "{message}"
            );
        }
        for v in [b.lo, b.hi] {
            assert!(cli_takes(words, v), "{words:?} {v}");
            // Within the bounds, the daemon goes on to the GPU's own range, or acts.
            let r = d.answer(&me(), ask(v));
            if let Response::Error { message, .. } = &r {
                assert!(!message.contains(b.what), "{} {v}: {message}", b.what);
            }
        }
    }
    let r = d.answer(
        &me(),
        Request::PowerBudget {
            budget_w: Some(1e-6),
            why: None,
        },
    );
    let Response::Error { message, .. } = r else {
        panic!("{r:?}")
    };
    assert_eq!(
        message,
        "budget in watts must be between 1 and 1000000 W, not 1e-6"
    );
}

#[test]
fn a_budget_holds_the_sum_of_caps() {
    let tmp = tempfile::tempdir().unwrap();
    let src = sim();
    let d = daemon(tmp.path(), false, &src);
    tick(&d, &src);
    let r = d.answer(
        &me(),
        Request::PowerBudget {
            budget_w: Some(1000.0),
            why: None,
        },
    );
    assert!(
        matches!(r, Response::Control(ref c) if c.budget.is_some()),
        "{r:?}"
    );
    for _ in 0..30 {
        tick(&d, &src);
        let sum: f64 = caps(&src).iter().sum();
        assert!(sum <= 1000.0, "{sum}");
    }
    assert!(
        node_events(&d)
            .iter()
            .any(|e| matches!(e, NodeEvent::Budget { caps, .. } if !caps.is_empty()))
    );
    d.answer(
        &me(),
        Request::PowerBudget {
            budget_w: None,
            why: None,
        },
    );
    tick(&d, &src);
    assert_eq!(caps(&src), vec![700.0, 700.0]);
}

/// `power cap` under a budget is the user's cap, the budget's ceiling: a cap above the share
/// the budget holds a GPU at leaves it there (and says so), one below it lowers the GPU at once,
/// and the budget never raises it back past it; when the budget goes, that cap is the one put
/// back. `power reset` under a budget makes the original the ceiling again.
#[test]
fn a_power_cap_under_a_budget_is_its_ceiling() {
    let tmp = tempfile::tempdir().unwrap();
    let src = sim();
    let d = daemon(tmp.path(), false, &src);
    tick(&d, &src);
    d.answer(
        &me(),
        Request::PowerBudget {
            budget_w: Some(900.0),
            why: None,
        },
    );
    for _ in 0..10 {
        tick(&d, &src);
    }
    let held = caps(&src);
    assert!(
        held[0] < 600.0 && held.iter().sum::<f64>() <= 900.0,
        "{held:?}"
    );
    let cap = |w: f64| {
        d.answer(
            &me(),
            Request::PowerCap {
                gpus: TargetGpus::Some(vec![0]),
                watts: w,
                why: None,
            },
        )
    };
    // Above the budget's share: the GPU stays where the budget holds it.
    let r = cap(650.0);
    let Response::GpuChanged { changes, notes } = r else {
        panic!("{r:?}")
    };
    assert_eq!(changes[0].new.as_deref(), Some("650 W"), "{changes:?}");
    assert!(
        notes
            .iter()
            .any(|n| n.contains("GPU 0 stays at") && n.contains("650 W is its ceiling")),
        "{notes:?}"
    );
    assert_eq!(caps(&src)[0], held[0], "raised past the budget's share");
    // Below it: lowered at once, and held there through the budget's steps.
    let r = cap(300.0);
    assert!(matches!(r, Response::GpuChanged { .. }), "{r:?}");
    assert_eq!(caps(&src)[0], 300.0);
    for s in 0..12 {
        tick(&d, &src);
        let c = caps(&src);
        assert!(c[0] <= 300.0, "{s} s after the cap: {c:?}");
        assert!(c.iter().sum::<f64>() <= 900.0, "{s} s after the cap: {c:?}");
    }
    let budget = |w: Option<f64>| {
        d.answer(
            &me(),
            Request::PowerBudget {
                budget_w: w,
                why: None,
            },
        )
    };
    budget(None);
    tick(&d, &src);
    assert_eq!(caps(&src), vec![300.0, 700.0]);
    // `power reset` under a budget: the original (700 W) is the ceiling again, not a cap that
    // takes the GPU past the budget.
    budget(Some(900.0));
    for _ in 0..10 {
        tick(&d, &src);
    }
    let before = caps(&src);
    let r = d.answer(
        &me(),
        Request::PowerReset {
            gpus: TargetGpus::Some(vec![0]),
            why: None,
        },
    );
    let Response::GpuChanged { changes, notes } = r else {
        panic!("{r:?}")
    };
    assert_eq!(changes[0].new.as_deref(), Some("700 W"), "{changes:?}");
    assert!(
        notes.iter().any(|n| n.contains("700 W is its ceiling")),
        "{notes:?}"
    );
    assert_eq!(caps(&src), before);
    // The GPU is still below its original: the record stays for a daemon that dies meanwhile.
    let original = || {
        let Response::Power { gpus, .. } = d.answer(&me(), Request::Power {}) else {
            panic!("no power answer")
        };
        gpus[0].original.power_limit_w
    };
    assert_eq!(original(), Some(700.0));
    for _ in 0..12 {
        tick(&d, &src);
        assert!(caps(&src).iter().sum::<f64>() <= 900.0, "{:?}", caps(&src));
    }
    budget(None);
    tick(&d, &src);
    assert_eq!(caps(&src), vec![700.0, 700.0]);
    assert_eq!(original(), None, "put back: nothing left to restore");
}

#[test]
fn a_readonly_daemon_refuses_governor_and_budget_changes() {
    let tmp = tempfile::tempdir().unwrap();
    let src = sim();
    let d = daemon(tmp.path(), true, &src);
    tick(&d, &src);
    for r in [
        Request::ThermalSet {
            gpus: TargetGpus::All,
            target_c: Some(70.0),
            margin_c: None,
            why: None,
        },
        Request::ThermalOff {
            gpus: TargetGpus::All,
            why: None,
        },
        Request::PowerBudget {
            budget_w: Some(900.0),
            why: None,
        },
    ] {
        let r = d.answer(&me(), r);
        assert!(
            matches!(
                r,
                Response::Error {
                    code: ErrorCode::Readonly,
                    ..
                }
            ),
            "{r:?}"
        );
    }
    assert!(matches!(
        d.answer(&me(), Request::Thermal {}),
        Response::Control(_)
    ));
    assert_eq!(caps(&src), vec![700.0, 700.0]);
}

#[test]
fn a_runs_energy_reaches_ps_and_its_summary() {
    let tmp = tempfile::tempdir().unwrap();
    let src = sim();
    std::fs::create_dir_all(tmp.path().join("config")).unwrap();
    std::fs::write(
        tmp.path().join("config/control.toml"),
        "[energy]\nprice_per_kwh = 0.5\ncurrency = \"EUR\"\n",
    )
    .unwrap();
    let d = daemon(tmp.path(), false, &src);
    tick(&d, &src);
    let counter = || -> f64 {
        src.with_node(|n| {
            n.gpus()
                .iter()
                .map(|g| g.reading().energy_mj as f64 / 1000.0)
                .sum()
        })
    };
    let before = counter();
    let mut caller = Caller::current().unwrap();
    caller.cwd = std::env::temp_dir();
    // Its GPUs declared: a run that declares none is charged only the GPUs its processes use.
    let mut profile = Profile::from_command(vec!["sh".into(), "-c".into(), "sleep 0.5".into()]);
    profile.run.gpus = gpupilot::profile::GpuSelection::List(vec![0, 1]);
    let r = d.answer(
        &me(),
        Request::RunStart {
            profile: Box::new(profile),
            caller,
            knobs: Default::default(),
            why: None,
        },
    );
    let Response::RunStarted { run } = r else {
        panic!("{r:?}")
    };
    for _ in 0..60 {
        tick(&d, &src);
    }
    let expected = counter() - before;
    poll(
        "the run to end",
        Duration::from_secs(10),
        Duration::from_millis(20),
        || {
            d.poll_runs();
            let Response::Runs { runs } = d.answer(
                &me(),
                Request::Runs {
                    run: Some(run.id.clone()),
                    live: false,
                },
            ) else {
                panic!()
            };
            if runs[0].is_final() {
                Ok(())
            } else {
                Err(String::new())
            }
        },
    );
    tick(&d, &src);
    let Response::Runs { runs } = d.answer(
        &me(),
        Request::Runs {
            run: Some(run.id.clone()),
            live: false,
        },
    ) else {
        panic!()
    };
    let e = runs[0].energy.clone().expect("ps shows the run's energy");
    assert!(
        (e.energy_j - expected).abs() <= 0.01 * expected,
        "{} vs {expected}",
        e.energy_j
    );
    assert!((e.cost.unwrap() - e.kwh * 0.5).abs() < 1e-12);
    assert_eq!(e.currency.as_deref(), Some("EUR"));
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.dir.join("summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["status"], "succeeded");
    let j = summary["energy_j"].as_f64().unwrap();
    assert!((j - expected).abs() <= 0.01 * expected, "{j} vs {expected}");
    assert!(summary["energy"]["kwh"].as_f64().unwrap() > 0.0);
    assert_eq!(summary["energy"]["per_gpu"].as_array().unwrap().len(), 2);
}

/// A live run (`sleep`) whose trainer side is two ranks of one job, attached in-process on
/// GPUs 0 and 1; its id. The senders are the ranks' connections: keep them while they attach.
fn two_rank_job(d: &Daemon) -> (String, Vec<tokio::sync::mpsc::Sender<String>>) {
    let mut caller = Caller::current().unwrap();
    caller.cwd = std::env::temp_dir();
    let r = d.answer(
        &me(),
        Request::RunStart {
            profile: Box::new(Profile::from_command(vec!["sleep".into(), "60".into()])),
            caller,
            knobs: Default::default(),
            why: None,
        },
    );
    let Response::RunStarted { run } = r else {
        panic!("{r:?}")
    };
    let mut links = Vec::new();
    for rank in 0..2u32 {
        let (tx, _rx) = tokio::sync::mpsc::channel(16);
        let spec = RankSpec {
            rank,
            world_size: 2,
            local_rank: Some(rank),
            host: Some("node".into()),
            gpu: Some(rank),
            gpu_uuid: None,
        };
        let ask = Attach {
            run: run.id.clone(),
            pid: Some(9000 + rank),
            rank: Some(spec),
            ..Attach::default()
        };
        d.trainer_attach(100 + u64::from(rank), tx.clone(), ask)
            .unwrap_or_else(|e| panic!("rank {rank}: {}", e.message));
        links.push(tx);
    }
    (run.id, links)
}

#[test]
fn a_governed_gpu_holds_its_jobs_other_gpu_at_its_cap() {
    let tmp = tempfile::tempdir().unwrap();
    let src = sim();
    let d = daemon(tmp.path(), false, &src);
    tick(&d, &src);
    let (run, _links) = two_rank_job(&d);
    // Only GPU 0 is governed; GPU 1 trains rank 1 of the same job.
    let r = d.answer(
        &me(),
        Request::ThermalSet {
            gpus: TargetGpus::Some(vec![0]),
            target_c: Some(70.0),
            margin_c: None,
            why: None,
        },
    );
    assert!(matches!(r, Response::Control(_)), "{r:?}");
    for s in 0..200 {
        tick(&d, &src);
        let c = caps(&src);
        assert_eq!(c[0], c[1], "at {s} s the job's GPUs are apart: {c:?}");
    }
    let c = caps(&src);
    assert!(c[0] < 620.0, "{c:?}");
    let held: Vec<String> = node_events(&d)
        .into_iter()
        .filter_map(|e| match e {
            NodeEvent::Governor {
                change,
                gpu: 0,
                why,
                ..
            } if change == "job" => Some(why),
            _ => None,
        })
        .collect();
    assert!(!held.is_empty());
    assert!(
        held[0].starts_with("GPU 0 is at ")
            && held[0].contains(&format!(": job {run}'s GPUs 0,1 held at ")),
        "{held:?}"
    );
    // The governor goes: both GPUs are let go, back to 700 W.
    d.answer(
        &me(),
        Request::ThermalOff {
            gpus: TargetGpus::All,
            why: None,
        },
    );
    tick(&d, &src);
    assert_eq!(caps(&src), vec![700.0, 700.0]);
    d.answer(
        &me(),
        Request::RunStop {
            run,
            kill: true,
            grace_s: None,
            why: None,
        },
    );
}
