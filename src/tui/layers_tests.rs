//! The console's own layers, checked as the crate's are (`src/layering.rs`): a child of `tui`
//! uses only the children of the layers below its own, through `crate::tui::…` or `super::…`
//! paths (parent ↔ child inside one child is not checked). The views never name the App, the
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

fn layer_of(child: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&child))
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The first segment of each item of a `{a::b, c, d::{e, f}}` group (`text` starts after `{`).
fn group_heads(text: &str) -> Vec<&str> {
    let mut heads = Vec::new();
    let (mut depth, mut at_item) = (0, true);
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => at_item = true,
            c if at_item && !c.is_whitespace() => {
                heads.push(ident(&text[i..]));
                at_item = false;
            }
            _ => {}
        }
    }
    heads
}

/// The children of `tui` that the code of the module at `path` (its path inside `tui`, as
/// `["views", "run", "band"]`) names, outside tests and comments.
fn uses(path: &[String], text: &str) -> Vec<String> {
    let code = text.find("#[cfg(test)]").map_or(text, |i| &text[..i]);
    let code: String = code
        .lines()
        .map(|l| l.find("//").map_or(l, |i| &l[..i]))
        .collect::<Vec<_>>()
        .join("\n");
    let starts_path = |at: usize| {
        !code[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    };
    let mut out = Vec::new();
    for (at, _) in code
        .match_indices("crate::tui::")
        .filter(|(at, _)| starts_path(*at))
    {
        out.extend(heads(&code[at + "crate::tui::".len()..]));
    }
    for (at, _) in code
        .match_indices("super::")
        .filter(|(at, _)| starts_path(*at))
    {
        // One module up per `super`: what follows names a child of `tui` once the climb
        // reaches `tui` itself.
        let mut rest = &code[at..];
        let mut depth = path.len();
        while let Some(r) = rest.strip_prefix("super::") {
            rest = r;
            depth = depth.saturating_sub(1);
        }
        if depth == 0 {
            out.extend(heads(rest));
        }
    }
    out.retain(|m| !m.is_empty() && m != "self" && m != "super" && Some(m) != path.first());
    out.sort();
    out.dedup();
    out
}

/// The first segment of the path `rest`, or of each item of the group it opens.
fn heads(rest: &str) -> Vec<String> {
    match rest.strip_prefix('{') {
        Some(group) => group_heads(group).into_iter().map(String::from).collect(),
        None => vec![ident(rest).to_string()],
    }
}

/// Every non-test source file under `dir`, with its module path inside `tui`.
fn sources(dir: &Path, path: &[String], out: &mut Vec<(Vec<String>, String)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("reading src/tui")
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        let name = p
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("")
            .to_string();
        if p.is_dir() {
            if name != "tests" {
                let mut sub = path.to_vec();
                sub.push(name);
                sources(&p, &sub, out);
            }
        } else if let Some(stem) = name.strip_suffix(".rs") {
            if stem == "tests" || stem.ends_with("_tests") {
                continue;
            }
            let mut module = path.to_vec();
            if stem != "mod" {
                module.push(stem.to_string());
            }
            let text = std::fs::read_to_string(&p).expect("reading a source file");
            out.push((module, text));
        }
    }
}

#[test]
fn the_console_imports_one_way() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/tui");
    let mut files = Vec::new();
    sources(&dir, &[], &mut files);
    assert!(files.len() > 20, "{} files under src/tui", files.len());
    let mut bad = Vec::new();
    for (module, text) in &files {
        // tui/mod.rs puts the console together.
        let Some(top) = module.first() else { continue };
        let Some(own) = layer_of(top) else {
            bad.push(format!("tui::{top} has no layer in LAYERS"));
            continue;
        };
        for used in uses(module, text) {
            match layer_of(&used) {
                Some(l) if l < own => {}
                Some(l) => bad.push(format!(
                    "tui::{} (layer {own}) uses tui::{used} (layer {l}): only lower layers",
                    module.join("::")
                )),
                None => {}
            }
        }
    }
    assert!(
        bad.is_empty(),
        "the console's layers are broken:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_reader_resolves_super_and_crate_paths() {
    let path = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let text = "use super::super::super::data::Data;\nuse super::knob_dialog::KnobDialog;\n\
                use crate::tui::{feed::Link, widgets};\nuse crate::protocol::RunInfo;\n\
                // crate::tui::app in a comment\n\
                fn f() { let _ = crate::tui::app::App::new; }\n\
                #[cfg(test)]\nmod tests { use crate::tui::ui; }\n";
    assert_eq!(
        uses(&path(&["views", "run", "state"]), text),
        ["app", "data", "feed", "widgets"]
    );
    assert_eq!(
        uses(
            &path(&["app"]),
            "use super::ui::Areas;\nuse super::views::Ctx;\n"
        ),
        ["ui", "views"]
    );
}
