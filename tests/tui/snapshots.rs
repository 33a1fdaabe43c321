//! Every view at 80×24 and 200×50 on ratatui's TestBackend, from hand-built fixtures (see
//! `support::tui`), plus the states that must read as what they are: a lost GPU, a stale GPU,
//! absent metrics, a stale source, a bad theme file, a terminal too small.

use crate::support::tui::{T0, app, app_with_runs, app_with_theme, render, text};
use gpupilot::tui::theme::{self, Theme};
use gpupilot::tui::{Action, App, ViewId};
use insta::assert_snapshot;
use ratatui::style::Color;

const SIZES: [(u16, u16); 2] = [(80, 24), (200, 50)];

fn shot(name: &str, app: &mut App) {
    for (w, h) in SIZES {
        let term = render(app, w, h);
        assert_snapshot!(format!("{name}_{w}x{h}"), term.backend());
    }
}

#[test]
fn overview() {
    let mut a = app(4);
    a.apply(Action::SelectGpu(1));
    shot("overview", &mut a);
    let screen = text(&render(&mut a, 200, 50));
    assert!(screen.contains("gpu-node-07"), "{screen}");
    assert!(screen.contains("driver 550.54.15") && screen.contains("CUDA 12.4"));
    assert!(
        screen.contains("cpu")
            && screen.contains("38 % of 64")
            && screen.contains("187.0/503.0 GiB")
    );
    // GPU 1 held by its cap: the number against the cap and the badge.
    assert!(
        screen.contains("449/450 W")
            || screen.contains("448/450 W")
            || screen.contains("447/450 W"),
        "{screen}"
    );
    assert!(screen.contains(" pwr-cap "));
    // GPU 2: thermal badges, stale, and absent PCIe as N/A (not 0).
    assert!(
        screen.contains(" stale ") && screen.contains(" thermal ") && screen.contains(" hw-therm ")
    );
    assert!(screen.contains("PCIe ↓N/A ↑N/A"), "{screen}");
    assert!(screen.contains("fan N/A"));
    // GPU 3 is lost, and says so instead of showing zeros.
    assert!(screen.contains(" LOST ") && screen.contains("fell off the bus"));
    assert!(!screen.contains("0/0 W"));
}

#[test]
fn overview_eight_gpus() {
    let mut a = app(8);
    a.apply(Action::SelectGpu(6));
    shot("overview_8gpus", &mut a);
    let small = text(&render(&mut a, 80, 24));
    assert!(
        small.contains("GPUs 6–8 of 8: the page follows the selection"),
        "paged to the selection:\n{small}"
    );
    let big = text(&render(&mut a, 200, 50));
    assert!(
        big.contains(" 7 NVIDIA H100 80GB HBM3 "),
        "all eight fit at 200×50"
    );
}

#[test]
fn detail() {
    let mut a = app(4);
    a.apply(Action::SelectGpu(1));
    a.apply(Action::ShowView(ViewId::Detail));
    shot("detail", &mut a);
    let screen = text(&render(&mut a, 200, 50));
    for title in [
        "Utilization",
        "Memory",
        "Temperature",
        "Power",
        "SM clock",
        "Processes (1)",
    ] {
        assert!(screen.contains(title), "{title} missing:\n{screen}");
    }
    assert!(screen.contains("── cap 450 W"), "cap line keyed:\n{screen}");
    assert!(screen.contains("── slowdown 87 °C"));
    assert!(screen.contains("held by power cap (software)"));
    assert!(screen.contains("40001") && screen.contains("python train.py --model resnet50"));
    assert!(screen.contains("window 1m") && screen.contains("-1m"));
    assert!(
        screen.contains('⠀')
            || screen
                .chars()
                .any(|c| ('\u{2801}'..='\u{28FF}').contains(&c)),
        "braille charts"
    );
}

#[test]
fn detail_zoomed_out() {
    let mut a = app(4);
    a.apply(Action::ShowView(ViewId::Detail));
    a.apply(Action::ZoomOut);
    let screen = text(&render(&mut a, 200, 50));
    assert!(
        screen.contains("window 10m") && screen.contains("-10m"),
        "{screen}"
    );
    assert_snapshot!("detail_10m_200x50", render(&mut a, 200, 50).backend());
}

#[test]
fn detail_of_a_lost_gpu_and_of_absent_metrics() {
    let mut a = app(4);
    a.apply(Action::ShowView(ViewId::Detail));
    a.apply(Action::SelectGpu(3));
    let lost = text(&render(&mut a, 200, 50));
    assert!(lost.contains(" LOST "), "{lost}");
    assert!(
        lost.matches("LOST").count() >= 5,
        "every chart says LOST, not 0:\n{lost}"
    );
    assert_snapshot!("detail_lost_80x24", render(&mut a, 80, 24).backend());

    a.apply(Action::SelectGpu(2));
    let v100 = text(&render(&mut a, 200, 50));
    assert!(v100.contains("Tesla V100-SXM2-32GB"));
    assert!(
        v100.contains("energy N/A") && v100.contains("N/A: the driver does not list processes"),
        "{v100}"
    );
    assert!(v100.contains(" stale "));
}

/// The Run view at `w`×`h`: three runs, the training run's log, a search for `checkpoint`
/// walked one match back from the newest (so the current match and the others differ).
fn run_app(w: u16, h: u16) -> App {
    let mut a = app_with_runs();
    a.size = ratatui::layout::Rect::new(0, 0, w, h);
    a.apply(Action::ShowView(ViewId::Run));
    a.apply(Action::Search);
    for c in "checkpoint".chars() {
        a.apply(Action::PromptChar(c));
    }
    a.apply(Action::PromptSubmit);
    a.apply(Action::SearchPrev);
    a
}

#[test]
fn run_view_with_a_log_tail_a_search_and_a_run_list() {
    for (w, h) in SIZES {
        let mut a = run_app(w, h);
        assert_eq!(
            a.run.current,
            Some(34),
            "line 35 (step 35) is the current match"
        );
        let term = render(&mut a, w, h);
        assert_snapshot!(format!("run_{w}x{h}"), term.backend());
        let screen = text(&term);
        for s in [
            "Run 20231114-220820-train",
            " running ",
            "restarts 1",
            "GPUs 0,1",
            "exits: exit 1 · now attempt 2",
            "$ python3 train.py --model resnet50",
            "stdout",
            "/checkpoint",
            "match on line 35",
            "step   35 checkpoint saved",
            // The list, newest first, with the shown run marked.
            "▶ 20231114-220820-train",
            "20231114-215000-eval",
            "failed",
            "3 runs",
        ] {
            assert!(screen.contains(s), "{s:?} missing at {w}×{h}:\n{screen}");
        }
        // The hints are the Run view's (short words where narrow), without the global ones
        // it shadows.
        assert!(
            (screen.contains("/ search") || screen.contains("/ find")) && screen.contains("s stop"),
            "{screen}"
        );
        assert!(!screen.contains("j gpu"), "{screen}");
        let buf = term.backend().buffer();
        let t = &a.theme;
        let styled = |bg| {
            buf.content()
                .iter()
                .filter(|c| Some(c.bg) == bg && c.symbol() == "k")
                .count()
        };
        assert_eq!(styled(t.search_current.bg), 1, "one current match");
        assert!(
            styled(t.search_match.bg) >= 1,
            "the other matches are marked"
        );
    }
    let big = text(&render(&mut run_app(200, 50), 200, 50));
    assert!(
        big.contains("20231114-210000-prep") && big.contains("succeeded"),
        "all three runs fit at 200×50:\n{big}"
    );
}

#[test]
fn run_view_asks_before_stopping() {
    let mut a = app_with_runs();
    a.apply(Action::ShowView(ViewId::Run));
    a.apply(Action::StopRun);
    let term = render(&mut a, 80, 24);
    assert_snapshot!("run_confirm_stop_80x24", term.backend());
    let screen = text(&term);
    assert!(
        screen.contains("Stop run 20231114-220820-train? y stops it"),
        "{screen}"
    );
    assert!(a.take_requests().is_empty());
}

#[test]
fn run_view_without_runs_says_how_to_start_one() {
    let mut a = app(4);
    a.apply(Action::ShowView(ViewId::Run));
    let waiting = text(&render(&mut a, 80, 24));
    assert!(waiting.contains("Waiting for the daemon"), "{waiting}");
    a.on_update(gpupilot::tui::feed::Update::Runs(Vec::new()));
    let none = text(&render(&mut a, 200, 50));
    assert!(
        none.contains("No runs yet") && none.contains("gpupilot run"),
        "{none}"
    );
    a.on_update(gpupilot::tui::feed::Update::Link(
        gpupilot::tui::feed::Link::Local,
    ));
    let demo = text(&render(&mut a, 200, 50));
    assert!(demo.contains("the demo has no daemon"), "{demo}");
}

#[test]
fn events_view_lists_who_what_and_why_newest_first() {
    let mut a = app_with_runs();
    a.apply(Action::ShowView(ViewId::Events));
    shot("events", &mut a);
    let screen = text(&render(&mut a, 200, 50));
    for s in [
        "Events (6)",
        "TIME (UTC)",
        "11-14 22:08:00",
        "alice (uid 1000) via gpupilot (pid 4242)",
        "20231114-220820-train",
        "running → backoff",
        "exit 1; restart 1 of 3 in 1 s",
        "uid 1001 (pid 777)",
        "refused",
        "started (pid 4100, 0.1.0)",
    ] {
        assert!(screen.contains(s), "{s:?} missing:\n{screen}");
    }
    let refused = screen.find("uid 1001 (pid 777)").unwrap();
    let started = screen.find("started (pid 4100").unwrap();
    assert!(refused < started, "newest first");
    let small = text(&render(&mut a, 80, 24));
    assert!(
        small.contains("22:08:52 alice        20231114-215000-eval  running → paused"),
        "narrow: time of day, the user's name, the run, the change:\n{small}"
    );
}

#[test]
fn a_daemon_that_went_away_is_shown_and_its_data_kept() {
    let mut a = app_with_runs();
    a.on_update(gpupilot::tui::feed::Update::Link(
        gpupilot::tui::feed::Link::Gone {
            reason: "the connection closed".into(),
        },
    ));
    a.apply(Action::ShowView(ViewId::Run));
    let screen = text(&render(&mut a, 200, 50));
    assert!(
        screen.contains("daemon gone — runs continue; restart with `gpupilot daemon --detach`"),
        "{screen}"
    );
    assert!(
        screen.contains("step   40 checkpoint saved"),
        "the last log is kept"
    );
    assert!(a.data.source_stale(), "the last data is marked stale");
    assert_snapshot!("daemon_gone_80x24", render(&mut a, 80, 24).backend());
}

#[test]
fn help_is_generated_from_the_keymap() {
    let mut a = app(4);
    a.apply(Action::Help);
    shot("help", &mut a);
    let screen = text(&render(&mut a, 200, 50));
    for b in
        gpupilot::tui::keymap::Keymap::defaults().bindings(gpupilot::tui::keymap::Context::Global)
    {
        // Every key that works here; a replay's only in a replay (tests/tui/reach.rs).
        // (Its first words: a long one wraps.)
        let works = gpupilot::tui::views::help::works(b.action, false);
        let start = b.desc.split(' ').take(4).collect::<Vec<_>>().join(" ");
        assert_eq!(screen.contains(&start), works, "{} in the help", b.desc);
    }
    // Scrolled to the end at 80×24 the last lines show.
    for _ in 0..100 {
        a.apply(Action::ScrollDown);
    }
    let small = text(&render(&mut a, 80, 24));
    assert!(small.contains("Mouse: click a GPU"), "{small}");
}

#[test]
fn stale_source_and_bad_theme_are_shown() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("themes")).unwrap();
    std::fs::write(
        dir.path().join("themes/dark.toml"),
        "[border]\nfg = \"purple\"\n",
    )
    .unwrap();
    let (t, err) = theme::load("dark", &dir.path().join("themes"));
    let mut a = app_with_theme(4, t);
    // The message names the file; the temporary directory is replaced so the frame is stable.
    let msg = format!("theme: {} (using dark)", err.unwrap())
        .replace(&dir.path().display().to_string(), "~/.config/gpupilot");
    a.data.set_status(gpupilot::tui::data::Level::Error, msg);
    a.data.now = T0 + 129.0;
    let term = render(&mut a, 200, 50);
    let screen = text(&term);
    assert!(screen.contains("STALE: no data for 10 s"), "{screen}");
    assert!(
        screen.contains("dark.toml: line 2, column 6: unknown colour \"purple\""),
        "{screen}"
    );
    assert_snapshot!(
        "stale_and_theme_error_80x24",
        render(&mut a, 80, 24).backend()
    );
}

#[test]
fn tiny_terminal_says_so() {
    let mut a = app(4);
    for view in ViewId::ALL {
        a.apply(Action::ShowView(view));
        let screen = text(&render(&mut a, 30, 10));
        assert!(screen.contains("too small"), "{screen}");
    }
    a.apply(Action::Help);
    assert_snapshot!("too_small_30x10", render(&mut a, 30, 10).backend());
    for (w, h) in [(1, 1), (0, 0), (39, 11), (40, 12), (41, 13)] {
        render(&mut a, w, h);
    }
}

#[test]
fn waiting_for_the_first_sample() {
    let mut a = App::new(
        Default::default(),
        Theme::default(),
        std::time::Duration::from_secs(1),
    );
    let screen = text(&render(&mut a, 80, 24));
    assert!(screen.contains("waiting for the first sample"), "{screen}");
    a.apply(Action::ShowView(ViewId::Detail));
    render(&mut a, 80, 24);
    // A daemon without telemetry says why, and that runs are supervised all the same.
    a.on_update(gpupilot::tui::feed::Update::Link(
        gpupilot::tui::feed::Link::Daemon {
            pid: 1234,
            readonly: false,
            telemetry_error: Some("NVML library not found".into()),
            rate_hz: 1.0,
        },
    ));
    for view in [ViewId::Overview, ViewId::Detail] {
        a.apply(Action::ShowView(view));
        let screen = text(&render(&mut a, 120, 30));
        assert!(
            screen.contains("gpupilot  no GPU telemetry")
                && screen.contains("No GPU telemetry: NVML library not found.")
                && screen.contains("supervises runs all the same"),
            "{screen}"
        );
    }
}

#[test]
fn colours_come_from_the_theme() {
    // Dark: the LOST badge has the theme's background; mono: no colour anywhere.
    let mut a = app_with_theme(4, Theme::default());
    let term = render(&mut a, 200, 50);
    let buf = term.backend().buffer();
    let lost_bg = Theme::default().lost.bg;
    let found = buf
        .content()
        .iter()
        .any(|c| c.symbol() == "L" && Some(c.bg) == lost_bg);
    assert!(found, "the LOST badge is drawn in the theme's lost style");

    let (mono, err) = theme::load("mono", std::path::Path::new("/nonexistent"));
    assert!(err.is_none());
    let mut a = app_with_theme(4, mono);
    for view in ViewId::ALL {
        a.apply(Action::ShowView(view));
        let term = render(&mut a, 200, 50);
        for c in term.backend().buffer().content() {
            assert!(
                matches!(c.fg, Color::Reset) && matches!(c.bg, Color::Reset),
                "mono drew a colour: {c:?}"
            );
        }
    }
}

#[test]
fn every_theme_renders_every_view() {
    for (name, _) in theme::PRESETS {
        let (t, err) = theme::load(name, std::path::Path::new("/nonexistent"));
        assert!(err.is_none(), "{name}: {err:?}");
        let mut a = app_with_theme(4, t);
        for view in ViewId::ALL {
            a.apply(Action::ShowView(view));
            let screen = text(&render(&mut a, 80, 24));
            assert!(screen.contains("gpu-node-07"), "{name}/{view:?}");
        }
    }
}
