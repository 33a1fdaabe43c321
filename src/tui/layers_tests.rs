//! The console's own layers, checked as the crate's are (`crate::layering::inner_violations`):
//! a child of `tui` uses only the children of the layers below its own, through
//! `crate::tui::…` or `super::…` paths (parent ↔ child inside one child is not checked). The views never name the App, the
//! feed never names what it feeds, and the App never names what draws it.

use std::path::Path;

/// Bottom to top. A child of `tui` may use the children of earlier layers only.
const LAYERS: &[&[&str]] = &[
    // Leaves: actions, numbers in words, colours, log lines, metrics series, control lines, the
    // terminal; then the keymap (keys to actions) and the backend that writes frames.
    &[
        "action", "format", "theme", "log", "metrics", "control", "tty",
    ],
    &["keymap", "ansi"],
    // Where data comes from, and the messages it sends; then what the views read.
    &["feed"],
    &["data"],
    // Building blocks and where the frame's parts go; dialogs are made of widgets.
    &["widgets", "layout"],
    &["dialog"],
    // Each view: its state and its drawing.
    &["views"],
    // The App holds the views' states and changes them.
    &["app"],
    // Drawing the App, the terminal's frames, the loop.
    &["ui"],
    &["screen"],
    &["event_loop"],
];

#[test]
fn the_console_imports_one_way() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/tui");
    let bad = crate::layering::inner_violations(&dir, "tui", LAYERS);
    assert!(
        bad.is_empty(),
        "the console's layers are broken:\n{}",
        bad.join("\n")
    );
}
