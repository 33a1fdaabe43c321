//! XIDs and the owners of GPU processes in the console: the XID badge on a GPU's block, the
//! last XID of a lost GPU in words, the user and Slurm job beside a process, and an XID in the
//! Events view with what it means and what to do (insta snapshots in tui/snapshots/); and end
//! to end, in tmux, an XID a fake-nvml scenario raises, through a daemon to the console.

use crate::support::nvml_daemon::NvmlDaemon;
use crate::support::tmux::{PROMPT, Tmux};
use crate::support::tui::{SECONDS, T0, app_with_runs, render, snapshot_at, take, text};
use gpupilot::protocol::{NodeEvent, NodeEventRecord};
use gpupilot::telemetry::owner::ProcessOwner;
use gpupilot::telemetry::xid::XidEvent;
use gpupilot::tui::feed::Update;
use gpupilot::tui::{Action, App, ViewId};
use insta::assert_snapshot;

/// The 4-GPU fixture whose last snapshot has GPU 0 reporting XID 13 (the application's),
/// GPU 3 lost after XID 79, and GPU 1's process owned by alice in Slurm job 4242.
fn app() -> App {
    let mut a = app_with_runs();
    let mut snap = snapshot_at(4, SECONDS);
    let now = T0 + SECONDS as f64;
    snap.gpus[0].xids = Some(vec![XidEvent::new(13, now - 40.0)]);
    snap.gpus[0].xid_count = Some(1);
    snap.gpus[3].xids = Some(vec![XidEvent::new(79, now - 21.0)]);
    snap.gpus[3].xid_count = Some(1);
    for p in snap.gpus[1].processes.iter_mut().flatten() {
        p.owner = Some(ProcessOwner {
            uid: Some(1000),
            user: Some("alice".into()),
            slurm_job: Some("4242".into()),
            ..ProcessOwner::default()
        });
    }
    take(&mut a, snap);
    a.data.now = now + 0.5;
    a.on_update(Update::Events {
        events: vec![NodeEventRecord {
            seq: 7,
            time: "2023-11-14T22:21:00.000Z".into(),
            event: NodeEvent::Xid {
                gpu: 3,
                uuid: None,
                xid: 79,
                name: "GPU has fallen off the bus".into(),
                action: String::new(),
                repeats: None,
            },
        }],
        reset: false,
    });
    a.take_requests();
    a
}

#[test]
fn an_xid_badge_and_a_lost_gpu_that_says_which_xid() {
    let mut a = app();
    a.apply(Action::SelectGpu(0));
    let screen = text(&render(&mut a, 80, 24));
    assert!(screen.contains(" XID 13 "), "{screen}");
    assert!(
        screen.contains(" XID 79 ") && screen.contains(" LOST "),
        "{screen}"
    );
    assert!(
        screen.contains("LOST after XID 79 (GPU has fallen off the bus)"),
        "{screen}"
    );
    assert_snapshot!("overview_xid_80x24", render(&mut a, 80, 24).backend());
}

#[test]
fn a_process_shows_its_user_and_slurm_job() {
    let mut a = app();
    a.apply(Action::SelectGpu(1));
    a.apply(Action::ShowView(ViewId::Detail));
    let screen = text(&render(&mut a, 200, 50));
    assert!(
        screen.contains("alice") && screen.contains("slurm 4242") && screen.contains("40001"),
        "{screen}"
    );
    assert_snapshot!("detail_owner_200x50", render(&mut a, 200, 50).backend());
}

#[test]
fn the_events_view_explains_an_xid() {
    let mut a = app();
    a.apply(Action::ShowView(ViewId::Events));
    let screen = text(&render(&mut a, 200, 50));
    assert!(
        screen
            .lines()
            .any(|l| l.contains(" GPU 3 ") && l.contains(" XID 79 ")),
        "{screen}"
    );
    assert!(
        screen.contains("GPU has fallen off the bus: the GPU no longer answers on PCIe; reset"),
        "{screen}"
    );
    assert_snapshot!("events_xid_200x50", render(&mut a, 200, 50).backend());
}

#[test]
fn an_xid_from_a_fake_nvml_scenario_reaches_the_console() {
    // GPU 1 reports XID 94 (a contained ECC error) every second, and its PCIe link trained at
    // x8 (an H100 SXM can do Gen5 x16).
    let s = NvmlDaemon::new(
        "model = \"h100-sxm\"\ncount = 2\n[[faults]]\nkind = \"xid\"\ngpu = 1\nxid = 94\nevery_s = 1\n\
         [[per_gpu]]\ngpu = 1\npcie_link_gen = 4\npcie_link_width = 8\n",
        &[],
    );
    let tmux = Tmux::start(&s.home.root());
    tmux.wait_text(PROMPT);
    let bin = env!("CARGO_BIN_EXE_gpupilot");
    let no_system = s.home.dir.path().join("no-system");
    tmux.type_line(&format!(
        "GPUPILOT_SYSTEM_DIR='{}' '{bin}'",
        no_system.display()
    ));
    let screen = tmux.wait_screen("the XID badge on GPU 1", |s| s.contains(" XID 94 "));
    assert_eq!(
        screen.matches(" XID ").count(),
        1,
        "GPU 0 has none:\n{screen}"
    );
    // GPU 1's detail says its link runs below the board's best, and what to do.
    tmux.keys(&["j", "2"]);
    tmux.wait_screen("GPU 1's degraded link in its detail", |s| {
        // Idle, the GPU has lowered its link's generation: the width is what says degraded.
        s.contains(" GPU 1 ") && s.contains(" x8 of Gen5 x16 (reseat, check the riser)")
    });
    tmux.keys(&["4"]);
    tmux.wait_screen("the XID in the Events view, explained", |s| {
        s.lines()
            .any(|l| l.contains(" driver ") && l.contains(" GPU 1 ") && l.contains(" XID 94 "))
            && s.contains("Contained ECC error: an uncorrectable memory error hit one application")
    });
    tmux.keys(&["q"]);
    tmux.wait_prompt();
}
