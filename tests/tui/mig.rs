//! MIG in the console: GPU 0 of the fixture node split into a 3g.40gb and three 1g.10gb
//! instances (H100 80GB profile sizes), GPU 1 with a MIG mode change
//! waiting for a reset. The overview names the instances on GPU 0's block and the pending reset
//! on GPU 1's; GPU detail lists GPU 0's instances above its processes. Snapshots at 80×24 and
//! 200×50 of the screen between the header and tabs and the footer of keys (which other views
//! change); a tiny terminal draws without a panic.

use crate::support::tui::{SECONDS, T0, render, snapshot_at, take, text};
use gpupilot::telemetry::Snapshot;
use gpupilot::telemetry::mig::{MigInstance, MigState};
use gpupilot::tui::keymap::Keymap;
use gpupilot::tui::theme::Theme;
use gpupilot::tui::{Action, App, ViewId};
use insta::assert_snapshot;
use std::time::Duration;

const MIB: u64 = 1 << 20;

fn with_mig(mut s: Snapshot) -> Snapshot {
    let inst =
        |gi: u32, profile: &str, total_mib: u64, used_mib: u64, pids: Vec<u32>| MigInstance {
            gpu_instance_id: Some(gi),
            compute_instance_id: Some(0),
            profile: Some(profile.into()),
            slices: Some(if profile.starts_with('3') { 3 } else { 1 }),
            uuid: Some(format!("MIG-{gi:08x}-0000-0000-0000-000000000000")),
            memory_used_bytes: Some(used_mib * MIB),
            memory_total_bytes: Some(total_mib * MIB),
            pids,
        };
    let g0 = &mut s.gpus[0];
    g0.util_gpu_pct = None;
    g0.mig = Some(MigState {
        enabled: true,
        pending: true,
        instances: vec![
            inst(2, "3g.40gb", 40_320, 30_720, vec![40000]),
            inst(7, "1g.10gb", 9_984, 6_144, vec![]),
            inst(8, "1g.10gb", 9_984, 0, vec![]),
            inst(9, "1g.10gb", 9_984, 0, vec![]),
        ],
    });
    s.gpus[1].mig = Some(MigState {
        enabled: false,
        pending: true,
        instances: vec![],
    });
    s
}

/// The screen between the three header rows (node, host, tabs) and the footer of keys, one
/// line per row.
fn body(a: &mut App, w: u16, h: u16) -> String {
    let screen = text(&render(a, w, h));
    let lines: Vec<&str> = screen.lines().collect();
    lines[3..lines.len() - 1].join("\n")
}

fn mig_app() -> App {
    let mut app = App::new(Keymap::defaults(), Theme::default(), Duration::from_secs(1));
    for s in 0..SECONDS {
        take(&mut app, with_mig(snapshot_at(2, s)));
    }
    app.data.now = T0 + SECONDS as f64 - 0.5;
    app
}

#[test]
fn overview_and_detail_show_the_instances_under_their_gpu() {
    let mut a = mig_app();
    for (w, h) in [(80, 24), (200, 50)] {
        assert_snapshot!(format!("mig_overview_{w}x{h}"), body(&mut a, w, h));
    }
    let big = text(&render(&mut a, 200, 50));
    assert!(big.contains("MIG 3g.40gb 1g.10gb×3"), "{big}");
    assert!(big.contains("MIG on at reset: reset to apply"), "{big}");

    a.apply(Action::ShowView(ViewId::Detail));
    for (w, h) in [(80, 24), (200, 50)] {
        assert_snapshot!(format!("mig_detail_{w}x{h}"), body(&mut a, w, h));
    }
    let big = text(&render(&mut a, 200, 50));
    assert!(big.contains("MIG instances (4)"), "{big}");
    for row in ["0:2", "0:7", "0:8", "0:9"] {
        assert!(big.contains(row), "{row} missing:\n{big}");
    }
    assert!(big.contains("30.0/39.4 GiB"), "{big}");
    assert!(
        big.contains("Processes (1)"),
        "the processes stay below:\n{big}"
    );

    for (w, h) in [(30, 10), (1, 1), (0, 0), (40, 12)] {
        render(&mut a, w, h);
    }
    a.apply(Action::ShowView(ViewId::Overview));
    for (w, h) in [(30, 10), (1, 1), (0, 0), (40, 12)] {
        render(&mut a, w, h);
    }
}
