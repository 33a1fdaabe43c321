//! The examples in docs/console.md are files the console accepts: the keymap override parses
//! and does what it says, and the theme overrides parse and resolve.

use gpupilot::tui::keymap::{self, Key};
use gpupilot::tui::theme;
use gpupilot::tui::{Action, ViewId};

const DOC: &str = include_str!("../../docs/console.md");

/// The ```toml block whose first line is `# <first_line>…`.
fn block(first_line: &str) -> &'static str {
    DOC.split("```toml\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .find(|b| b.starts_with(&format!("# {first_line}")))
        .unwrap_or_else(|| panic!("no example starting with {first_line:?}"))
}

#[test]
fn the_keymap_example_works() {
    let km = keymap::from_user_text(block("~/.config/gpupilot/keymap.toml"), "keymap.toml")
        .expect("the example parses");
    let at = |v, k: &str| km.lookup(v, false, Key::parse(k).unwrap());
    assert_eq!(at(ViewId::Overview, "x"), Some(Action::Quit));
    assert_eq!(at(ViewId::Overview, "q"), None, "q unbound");
    assert_eq!(at(ViewId::Run, "S"), Some(Action::StopRun));
    assert_eq!(
        at(ViewId::Run, "s"),
        Some(Action::StopRun),
        "the default stays"
    );
}

#[test]
fn the_theme_examples_work() {
    for (start, base) in [
        ("~/.config/gpupilot/themes/dark.toml", "dark"),
        ("~/.config/gpupilot/themes/ward.toml", "light"),
    ] {
        let user = theme::parse(block(start), start).expect("the example parses");
        assert_eq!(user.base.as_deref().unwrap_or("dark"), base);
        let t = theme::preset(base).unwrap().merged(&user).resolve("x");
        assert_ne!(
            t,
            theme::preset(base).unwrap().resolve("x"),
            "{start} changes something"
        );
    }
}
