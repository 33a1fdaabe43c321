//! Every action of the console within reach of someone who never read the docs: the footer
//! lists the view's actions (short words, then fewer and `? more`, each one left out in the
//! help), worded for the state; the run's knobs with their keys in sight at 80×24, and changed
//! from there; the help of the view shown, wrapped at word boundaries; a replay that says so
//! at every width; the straggler alert whole where there is room; `+`/`-` saying what they
//! change.

use crate::knobs::{RUN, app as run_app, ranked_app};
use crate::support::tui::{T0, app, app_with_runs, press, render, runs, text, typed};
use crossterm::event::KeyCode;
use gpupilot::control::alerts::{Alert, AlertKind};
use gpupilot::control::status::ControlStatus;
use gpupilot::protocol::KnobName;
use gpupilot::supervisor::RunStatus;
use gpupilot::tui::feed::{Link, Request, Update};
use gpupilot::tui::keymap::{Context, Keymap};
use gpupilot::tui::views::help;
use gpupilot::tui::{Action, App, ViewId};

const SIZES: [(u16, u16); 3] = [(80, 24), (120, 40), (200, 50)];

fn footer(a: &mut App, w: u16, h: u16) -> String {
    let screen = text(&render(a, w, h));
    screen.lines().last().unwrap_or_default().to_string()
}

fn header(a: &mut App, w: u16, h: u16) -> String {
    let screen = text(&render(a, w, h));
    screen.lines().next().unwrap_or_default().to_string()
}

/// Everything the help shows at `w`×`h`, scrolled from its top to its end; the help closed
/// again after.
fn help_screens(a: &mut App, w: u16, h: u16) -> Vec<String> {
    a.apply(Action::Help);
    let mut screens = vec![text(&render(a, w, h))];
    for _ in 0..80 {
        a.apply(Action::ScrollDown);
        let s = text(&render(a, w, h));
        if screens.last() == Some(&s) {
            break;
        }
        screens.push(s);
    }
    a.apply(Action::Close);
    screens
}

/// The description of the binding of `action` in `ctx`.
fn desc(ctx: Context, action: Action) -> String {
    Keymap::defaults()
        .bindings(ctx)
        .iter()
        .find(|b| b.action == action)
        .unwrap_or_else(|| panic!("{action} is bound in {ctx:?}"))
        .desc
        .clone()
}

#[test]
fn the_footer_lists_the_views_actions_and_the_help_the_rest() {
    type Want = (&'static str, &'static [&'static str], Context, Action);
    let overview: &[Want] = &[
        (
            "Enter",
            &["charts"],
            Context::Overview,
            Action::ShowView(ViewId::Detail),
        ),
        (
            "c",
            &["power cap", "cap"],
            Context::Overview,
            Action::PowerCap,
        ),
        ("a", &["advisor", "adv"], Context::Global, Action::Advisor),
        ("q", &["quit"], Context::Global, Action::Quit),
    ];
    let detail: &[Want] = &[
        (
            "Esc",
            &["back"],
            Context::Detail,
            Action::ShowView(ViewId::Overview),
        ),
        (
            "c",
            &["power cap", "cap"],
            Context::Detail,
            Action::PowerCap,
        ),
        ("+", &["zoom"], Context::Global, Action::ZoomIn),
    ];
    let run: &[Want] = &[
        ("/", &["search", "find"], Context::Run, Action::Search),
        ("s", &["stop"], Context::Run, Action::StopRun),
        ("p", &["pause"], Context::Run, Action::PauseRun),
        ("e", &["stderr"], Context::Run, Action::LogStream),
        (
            "b",
            &["batch size", "batch"],
            Context::Run,
            Action::SetKnob(KnobName::BatchSize),
        ),
        (
            "d",
            &["prefetch"],
            Context::Run,
            Action::SetKnob(KnobName::Prefetch),
        ),
        ("c", &["power cap", "cap"], Context::Run, Action::PowerCap),
        ("t", &["tuner"], Context::Run, Action::TuneEnergy),
        ("a", &["advisor", "adv"], Context::Global, Action::Advisor),
    ];
    let mut detail_app = app(4);
    detail_app.apply(Action::ShowView(ViewId::Detail));
    for (name, mut a, wants) in [
        ("overview", app(4), overview),
        ("detail", detail_app, detail),
        ("run", run_app(), run),
    ] {
        for (w, h) in SIZES {
            let foot = footer(&mut a, w, h);
            assert!(
                foot.contains("? "),
                "{name} {w}×{h}: the help's key: {foot:?}"
            );
            let more = foot.contains("? more");
            let helped = help_screens(&mut a, w, h).concat();
            for (key, words, ctx, action) in wants {
                let shown = words.iter().any(|w| foot.contains(&format!("{key} {w}")));
                if !shown {
                    assert!(
                        more,
                        "{name} {w}×{h}: {key} left out without `? more`: {foot:?}"
                    );
                    // The help wraps; its words are all there.
                    let d = desc(*ctx, *action);
                    let first = d.split(' ').take(3).collect::<Vec<_>>().join(" ");
                    assert!(
                        helped.contains(&first),
                        "{name} {w}×{h}: {key} is in neither the footer nor the help ({first:?})"
                    );
                }
                if w == 200 {
                    assert!(
                        foot.contains(&format!("{key} {}", words[0])),
                        "{name} at 200 columns: {key} {} in full: {foot:?}",
                        words[0]
                    );
                }
            }
            if w == 200 {
                assert!(!more, "{name}: room for every hint at 200: {foot:?}");
            }
        }
    }
    // What does not apply is not offered: no knob keys for a run without knobs, no stop for a
    // run that ended, no zoom where no chart shows a window.
    let mut plain = app_with_runs();
    plain.apply(Action::ShowView(ViewId::Run));
    let foot = footer(&mut plain, 200, 50);
    assert!(
        foot.contains("s stop") && foot.contains("c power cap"),
        "{foot:?}"
    );
    assert!(
        !foot.contains("b batch") && !foot.contains("d prefetch"),
        "{foot:?}"
    );
    assert!(!foot.contains("+ zoom"), "{foot:?}");
    assert!(
        !foot.contains("Space"),
        "no replay keys outside a replay: {foot:?}"
    );
}

#[test]
fn the_footer_says_resume_while_the_run_is_paused() {
    let mut a = app_with_runs();
    a.apply(Action::ShowView(ViewId::Run));
    for (w, h) in SIZES {
        let foot = footer(&mut a, w, h);
        assert!(foot.contains("p pause"), "{w}×{h}: {foot:?}");
    }
    let paused: Vec<_> = runs()
        .into_iter()
        .map(|mut r| {
            if r.id == RUN {
                r.status = RunStatus::Paused;
            }
            r
        })
        .collect();
    a.on_update(Update::Runs(paused));
    for (w, h) in SIZES {
        let foot = footer(&mut a, w, h);
        assert!(
            foot.contains("p resume") && !foot.contains("p pause"),
            "{w}×{h}: {foot:?}"
        );
    }
    // The stream key says where it goes.
    press(&mut a, KeyCode::Char('e'));
    let foot = footer(&mut a, 200, 50);
    assert!(foot.contains("e stdout"), "{foot:?}");
}

#[test]
fn the_runs_knobs_are_in_sight_at_80x24_and_change_from_there() {
    // The demo's job of four ranks: rank table and log, no room for the band.
    let mut a = ranked_app();
    let screen = text(&render(&mut a, 80, 24));
    assert!(!screen.contains(" Knobs "), "no band at 80×24:\n{screen}");
    let row = screen
        .lines()
        .find(|l| l.starts_with("└ b batch size"))
        .unwrap_or_else(|| panic!("no knobs row:\n{screen}"));
    assert!(
        row.contains("b batch size 512 → 1024")
            && row.contains("d prefetch 4 → 8")
            && row.contains("c power cap GPU 0 700 W"),
        "{row}"
    );
    // Narrower, the words shorten before any part goes.
    let narrow = text(&render(&mut a, 60, 24));
    assert!(
        narrow.contains("b batch 512 → 1024  d prefetch 4 → 8  c cap GPU 0"),
        "{narrow}"
    );

    // Found, they work: a batch size, a prefetch depth and a power cap.
    let mut a = run_app();
    let screen = text(&render(&mut a, 80, 24));
    assert!(
        screen.contains("└ b batch size 512  d prefetch 4 → 8"),
        "{screen}"
    );
    for (key, value, knob) in [
        ('b', "768", KnobName::BatchSize),
        ('d', "6", KnobName::Prefetch),
    ] {
        press(&mut a, KeyCode::Char(key));
        typed(&mut a, value);
        press(&mut a, KeyCode::Enter);
        let sent = a.take_requests();
        let want = Request::SetKnob {
            run: RUN.into(),
            knob,
            value: value.parse().unwrap(),
            restart: false,
        };
        assert_eq!(sent, [want], "{key} {value}");
    }
    press(&mut a, KeyCode::Char('c'));
    let screen = text(&render(&mut a, 80, 24));
    assert!(screen.contains("Power cap of GPU 0"), "{screen}");
    typed(&mut a, "500");
    press(&mut a, KeyCode::Enter);
    press(&mut a, KeyCode::Char('y'));
    assert_eq!(
        a.take_requests(),
        [Request::PowerCap { gpu: 0, watts: 500 }]
    );
    // The selected GPU is the one capped when the run uses it.
    let mut a = run_app();
    a.apply(Action::SelectGpu(1));
    let screen = text(&render(&mut a, 80, 24));
    assert!(screen.contains("c power cap GPU 1 450 W"), "{screen}");
}

#[test]
fn the_help_lists_the_keys_of_the_view_shown() {
    let batch = desc(Context::Run, Action::SetKnob(KnobName::BatchSize));
    let charts = desc(Context::Overview, Action::ShowView(ViewId::Detail));
    let back = desc(Context::Global, Action::ReplaySeek(-10));
    let stop = desc(Context::Run, Action::StopRun);
    let quit = desc(Context::Global, Action::Quit);

    let mut a = app(4);
    let overview = help_screens(&mut a, 200, 50).concat();
    assert!(overview.contains("Overview (this view)"), "{overview}");
    assert!(overview.contains(&charts) && overview.contains(&quit));
    assert!(
        !overview.contains(&batch),
        "a Run key in the overview's help"
    );
    assert!(!overview.contains(&back), "replay keys outside a replay");

    let mut a = run_app();
    let run = help_screens(&mut a, 200, 50).concat();
    assert!(run.contains("Run (this view)") && run.contains(&batch) && run.contains(&stop));
    assert!(
        !run.contains(&charts),
        "an Overview key in the Run view's help"
    );

    // In a replay: its keys, and none that would change the node.
    a.on_update(Update::Link(Link::Replay {
        file: "node7.gprec".into(),
        start_s: T0,
        speed: 1.0,
        paused: false,
        end: None,
    }));
    let replay = help_screens(&mut a, 200, 50).concat();
    assert!(replay.contains(&back), "{replay}");
    assert!(
        !replay.contains(&stop) && !replay.contains(&batch),
        "{replay}"
    );
}

#[test]
fn the_help_wraps_at_word_boundaries_at_60x15() {
    for (name, mut a) in [("overview", app(4)), ("run", run_app())] {
        // Every word the help may show, from its lines unwrapped.
        let view = a.view;
        let words: std::collections::HashSet<String> = help::lines(a.ctx(), view, false, u16::MAX)
            .iter()
            .flat_map(|l| {
                l.spans
                    .iter()
                    .map(|s| s.content.to_string())
                    .collect::<String>()
                    .split_whitespace()
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .collect();
        let screens = help_screens(&mut a, 60, 15);
        assert!(screens.len() > 3, "{name}: it scrolls at 60×15");
        let mut rows = 0;
        for s in &screens {
            for line in s.lines().skip(3).take(11) {
                let Some(inner) = line.strip_prefix('│').and_then(|l| l.strip_suffix('│'))
                else {
                    continue;
                };
                rows += 1;
                for w in inner.split_whitespace() {
                    assert!(
                        words.contains(w),
                        "{name}: {w:?} is cut (not a word of the help):\n{s}"
                    );
                }
            }
        }
        assert!(rows > 20, "{name}: {rows} rows of help read");
        // Nothing is lost: the last note is reached.
        let all = screens.concat();
        assert!(all.contains("Mouse:") && all.contains("scrolls."), "{name}");
    }
}

#[test]
fn a_replay_says_so_at_every_width() {
    let mut a = app(4);
    let replay = |paused: bool| {
        Update::Link(Link::Replay {
            file: "node7.gprec".into(),
            start_s: T0 + 37.0,
            speed: 1.0,
            paused,
            end: None,
        })
    };
    a.on_update(replay(true));
    // The frame's clock is the recording's: 1:22 in.
    a.data.now = T0 + 119.0;
    for (w, h) in SIZES {
        let head = header(&mut a, w, h);
        let foot = footer(&mut a, w, h);
        assert!(
            head.contains("REPLAY +1:22 ×1 paused")
                || head.contains("replay node7.gprec +1:22 ×1 · paused"),
            "{w}×{h}: {head:?}"
        );
        assert!(foot.contains("Space play"), "{w}×{h}: {foot:?}");
        assert!(
            !foot.contains("s stop"),
            "nothing that changes the node: {foot:?}"
        );
    }
    let small = header(&mut a, 80, 24);
    assert!(small.ends_with(" REPLAY +1:22 ×1 paused "), "{small:?}");
    assert!(small.starts_with(" gpupilot │ gpu-node-07"), "{small:?}");
    let wide = header(&mut a, 200, 50);
    assert!(
        wide.contains("replay node7.gprec +1:22 ×1 · paused"),
        "{wide:?}"
    );
    // The run's knobs as recorded, without the keys that would change them.
    let mut r = run_app();
    r.on_update(replay(true));
    let screen = text(&render(&mut r, 80, 24));
    assert!(
        screen.contains("└ batch size 512  prefetch 4 → 8  power cap GPU 0 700 W"),
        "{screen}"
    );
    a.on_update(replay(false));
    let small = header(&mut a, 80, 24);
    assert!(small.ends_with(" REPLAY +1:22 ×1 "), "{small:?}");
    assert!(footer(&mut a, 80, 24).contains("Space pause"));
}

#[test]
fn a_straggler_alert_is_whole_at_200_columns_and_cut_where_narrow() {
    let mut a = ranked_app();
    let message = format!(
        "run {RUN}: rank 2 is 27 % slower than the others: its GPU 2 is held down by thermal \
         slowdown (`gpupilot thermal target 76 --gpu 2`)"
    );
    a.on_update(Update::Control(Box::new(ControlStatus {
        alerts: vec![Alert {
            key: format!("straggler:{RUN}"),
            kind: AlertKind::Straggler,
            gpu: Some(2),
            run: Some(RUN.into()),
            value: Some(27.0),
            threshold: Some(10.0),
            message: message.clone(),
            since_s: T0,
        }],
        ..ControlStatus::default()
    })));
    let wide = footer(&mut a, 200, 50);
    assert!(wide.contains(&format!("⚠ {message}")), "{wide:?}");
    assert!(wide.starts_with(" ? "), "the help's key stays: {wide:?}");
    let small = footer(&mut a, 80, 24);
    assert!(
        small.contains(&format!("⚠ run {RUN}")) && small.trim_end().ends_with('…'),
        "{small:?}"
    );
    assert!(small.starts_with(" ? more"), "{small:?}");
}

#[test]
fn plus_and_minus_say_what_they_change() {
    let mut a = run_app();
    press(&mut a, KeyCode::Char('-'));
    let foot = footer(&mut a, 120, 40);
    assert!(
        foot.contains("the GPU detail's charts now cover the last 10m (2 shows them)"),
        "{foot:?}"
    );
    a.apply(Action::ShowView(ViewId::Detail));
    let screen = text(&render(&mut a, 80, 24));
    assert!(screen.contains("window 10m"), "{screen}");
    // At 24 h the samples of the last minutes sit at the right edge: the charts say where they
    // start instead of looking empty.
    press(&mut a, KeyCode::Char('-'));
    press(&mut a, KeyCode::Char('-'));
    let screen = text(&render(&mut a, 120, 40));
    assert!(screen.contains("window 24h"), "{screen}");
    assert!(screen.contains("no samples before -"), "{screen}");
    // Zoomed in to a window the samples fill, no such note.
    for _ in 0..4 {
        press(&mut a, KeyCode::Char('+'));
    }
    let screen = text(&render(&mut a, 120, 40));
    assert!(
        screen.contains("window 1m") && !screen.contains("no samples before"),
        "{screen}"
    );
}
