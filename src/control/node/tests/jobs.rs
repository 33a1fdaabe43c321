//! A job of several ranks under the loops: its GPUs at one cap, or each on its own.

use super::*;
use crate::control::jobs::JobCaps;

/// Run `r1`, a job of three ranks on GPUs 0–2 of a 4-GPU node.
fn job_view(dir: &Path, live: bool) -> ControlledRun {
    ControlledRun {
        visible: None,
        job_gpus: vec![0, 1, 2],
        ..run_view(dir, live)
    }
}

fn step(nc: &mut NodeControl, dev: &SimDev, views: &[ControlledRun]) -> Vec<ControlEvent> {
    advance(dev, 1.0);
    nc.step(
        &snapshot(dev, T0, true, false),
        views,
        &no_profile,
        Some(dev),
        "n",
    )
    .events
}

#[test]
fn a_governed_gpu_holds_its_jobs_gpus_at_its_cap() {
    let dev = hot(4);
    let tmp = tempfile::tempdir().unwrap();
    let mut nc = NodeControl::new(ControlSettings::default());
    // Only GPU 1 is governed (it runs hot); its job's other GPUs follow its cap.
    nc.thermal_on(&[1], Target::Celsius(65.0), "alice", "test");
    let view = job_view(tmp.path(), true);
    let mut events = Vec::new();
    for s in 0..200 {
        events.extend(step(&mut nc, &dev, std::slice::from_ref(&view)));
        let c = caps(&dev);
        assert!(c[0] == c[1] && c[1] == c[2], "at {s} s: {c:?}");
        assert_eq!(c[3], 700.0, "GPU 3 is not the job's");
    }
    let c = caps(&dev);
    assert!(c[1] < 650.0, "{c:?}");
    let said: Vec<&String> = events
        .iter()
        .filter_map(|e| match e {
            ControlEvent::Governor {
                change,
                gpu: 1,
                why,
                ..
            } if change == "job" => Some(why),
            _ => None,
        })
        .collect();
    assert!(!said.is_empty(), "{events:?}");
    let first = said[0];
    assert!(
        first.starts_with("GPU 1 is at ") && first.contains(": job r1's GPUs 0-2 held at "),
        "{first}"
    );
    assert!(first.ends_with(" W together"), "{first}");
    // The job ends: GPUs 0 and 2 get their users' caps back; GPU 1 stays governed.
    let events = step(&mut nc, &dev, &[job_view(tmp.path(), false)]);
    let c = caps(&dev);
    assert_eq!((c[0], c[2], c[3]), (700.0, 700.0, 700.0), "{c:?}");
    assert!(c[1] < 650.0, "{c:?}");
    let restored: Vec<u32> = events
        .iter()
        .filter_map(|e| match e {
            ControlEvent::Governor { change, gpu, .. } if change == "restored" => Some(*gpu),
            _ => None,
        })
        .collect();
    assert_eq!(restored, vec![0, 2]);
}

#[test]
fn per_gpu_caps_leave_a_jobs_other_gpus_alone() {
    let dev = hot(4);
    let tmp = tempfile::tempdir().unwrap();
    let mut nc = NodeControl::new(ControlSettings {
        job_caps: JobCaps::PerGpu,
        ..ControlSettings::default()
    });
    nc.thermal_on(&[1], Target::Celsius(65.0), "alice", "test");
    let view = job_view(tmp.path(), true);
    for _ in 0..200 {
        let events = step(&mut nc, &dev, std::slice::from_ref(&view));
        assert!(
            !events
                .iter()
                .any(|e| matches!(e, ControlEvent::Governor { change, .. } if change == "job"))
        );
    }
    let c = caps(&dev);
    assert!(c[1] < 650.0, "{c:?}");
    assert_eq!((c[0], c[2], c[3]), (700.0, 700.0, 700.0), "{c:?}");
}

#[test]
fn a_users_lower_cap_on_a_jobs_gpu_is_kept() {
    let dev = hot(4);
    let tmp = tempfile::tempdir().unwrap();
    let mut nc = NodeControl::new(ControlSettings::default());
    // `gpupilot power cap 400 --gpu 2` before the governor starts on GPU 1.
    dev.set_power_limit_w(2, 400.0).unwrap();
    nc.thermal_on(&[1], Target::Celsius(75.0), "alice", "test");
    let view = job_view(tmp.path(), true);
    for _ in 0..120 {
        step(&mut nc, &dev, std::slice::from_ref(&view));
        let c = caps(&dev);
        assert!(c[2] <= 400.0, "never above the user's cap: {c:?}");
        assert_eq!(c[0], c[1], "{c:?}");
    }
}

#[test]
fn a_budget_gives_a_job_one_cap() {
    let dev = hot(4);
    let tmp = tempfile::tempdir().unwrap();
    let mut nc = NodeControl::new(ControlSettings::default());
    nc.set_budget(Some(1900.0), "alice", "PSU");
    let view = job_view(tmp.path(), true);
    let mut events = Vec::new();
    for s in 0..60 {
        events.extend(step(&mut nc, &dev, std::slice::from_ref(&view)));
        let c = caps(&dev);
        let sum: f64 = c.iter().sum();
        assert!(sum <= 1900.0 + 1e-9, "at {s} s the caps sum to {sum} W");
        assert!(c[0] == c[1] && c[1] == c[2], "at {s} s: {c:?}");
    }
    let why = events
        .iter()
        .find_map(|e| match e {
            ControlEvent::Budget { caps, why, .. } if !caps.is_empty() => Some(why.clone()),
            _ => None,
        })
        .expect("the budget moved caps");
    assert!(why.contains("job r1's GPUs 0-2 held at "), "{why}");
    assert!(why.contains("GPU 3 "), "{why}");
}
