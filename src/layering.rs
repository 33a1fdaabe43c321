//! The crate's layers, checked: every top-level module of `src/` has a layer, and a module
//! uses only modules of the layers below its own. A new module, or a `use crate::…` that points
//! up or sideways, fails `cargo test` with the file and the path to move.
//!
//! What counts as a use is what the compiler would resolve: `crate::name` paths and
//! `use crate::{name, …}` groups, in code that is not a test (files named `tests.rs`, folders
//! named `tests`, and everything after a file's first `#[cfg(test)]` are test code, as are `//`
//! comments and doc links). Parent ↔ child inside one module is not checked here.
//!
//! The layers, bottom to top, and why each sits where it does, are in docs/architecture.md.
//! [`inner_violations`] checks a module's own children the same way (the console's in
//! `tui/layers_tests.rs`, the daemon's in `daemon/layers_tests.rs`).

use std::path::{Path, PathBuf};

/// Bottom to top. A module may use the modules of earlier layers only.
pub const LAYERS: &[&[&str]] = &[
    // Leaves: they use no other module of the crate.
    &["units", "text", "time", "config"],
    // Socket and log paths, peer checks: shared by the daemon and its clients.
    &["ipc"],
    // What the node and its runs are: samples, profiles, what trainers say, real load on the
    // GPU through CUDA; then the series.
    &["telemetry", "profile", "training", "cuda"],
    &["history"],
    // Acting on GPUs (caps, governor, budget, the tuner's search, energy), then on processes
    // (runs; a run's record carries its energy).
    &["control"],
    &["supervisor"],
    // The wire: it names the domain types above and is never named by them.
    &["protocol"],
    // The advisor's rules: they read samples, series and what trainers say.
    &["advisor"],
    // Readers of all that: the Prometheus exposition, run reports (with the advisor's findings
    // over the whole run), tables for pandas, the one-shot status table, a node's recordings.
    &["exporter", "report", "export", "status", "recording"],
    // Talking to a daemon; then the daemon itself, and the synthetic trainer (a client).
    &["client"],
    &["daemon", "trainer"],
    // What a person meets: the console and the cluster view, the command line, and the
    // commands, which parse, call a service and print.
    &["tui", "cluster"],
    &["cli"],
    &["commands"],
];

/// The layer `module` is in.
fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// The code of one source file as the readers see it: up to its first `#[cfg(test)]`, without
/// `//` comments.
fn code_of(text: &str) -> String {
    let code = text.find("#[cfg(test)]").map_or(text, |i| &text[..i]);
    code.lines()
        .map(|l| l.find("//").map_or(l, |i| &l[..i]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules `text` (one source file) uses through `crate::` paths, outside tests
/// and comments.
fn uses(text: &str) -> Vec<String> {
    let code = code_of(text);
    let mut out = Vec::new();
    let mut rest = code.as_str();
    while let Some(i) = rest.find("crate::") {
        // `gpupilot_crate::x` or `some_crate::x` are not ours.
        let before = rest[..i].chars().next_back();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            out.extend(group_heads(group));
        } else {
            out.push(ident(rest).to_string());
        }
    }
    out.retain(|m| !m.is_empty() && m != "self" && m != "super");
    out.sort();
    out.dedup();
    out
}

/// The first path segment of each item of a `{a::b, c, d::{e, f}}` group (`text` starts after
/// the opening brace).
fn group_heads(text: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut at_item = true;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => at_item = true,
            c if at_item && !c.is_whitespace() => {
                heads.push(ident(&text[i..]).to_string());
                at_item = false;
            }
            _ => {}
        }
    }
    heads
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The top-level modules `lib.rs` declares.
fn declared(lib: &str) -> Vec<String> {
    lib.lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod "))
        .map(|m| m.trim_end_matches(';').to_string())
        .collect()
}

/// Each use that breaks the layers: `module: top → used (why)`.
fn violations(src: &Path) -> Vec<String> {
    let mut files = Vec::new();
    if let Err(e) = inner_sources(src, &[], &mut files) {
        return vec![format!("reading {}: {e}", src.display())];
    }
    let mut bad = Vec::new();
    for (path, text) in &files {
        // The crate roots, and this check (test code).
        let Some(module) = path
            .first()
            .filter(|m| !matches!(m.as_str(), "lib" | "main" | "layering"))
        else {
            continue;
        };
        let at = path.join("::");
        let Some(own) = layer_of(module) else {
            bad.push(format!("{at}: module `{module}` has no layer in LAYERS"));
            continue;
        };
        for used in uses(text) {
            if used == *module {
                continue;
            }
            match layer_of(&used) {
                Some(l) if l < own => {}
                Some(l) => bad.push(format!(
                    "{at}: `{module}` (layer {own}) uses `{used}` (layer {l}): only lower layers"
                )),
                // Not a module of ours (a macro-exported item, say): nothing to check.
                None => {}
            }
        }
    }
    bad
}

/// A module's own children in layers, checked as the crate's are (`src/tui`, `src/daemon`): a
/// child of `parent` uses only the children of the layers below its own, through
/// `crate::parent::…` or `super::…` paths. Parent ↔ child inside one child is not checked, nor
/// are the parent's own items (its `mod.rs`). `dir`: the parent's folder. Each use that breaks
/// the layers, and each child without a layer, as a line.
pub fn inner_violations(dir: &Path, parent: &str, layers: &[&[&str]]) -> Vec<String> {
    let layer_of = |child: &str| layers.iter().position(|l| l.contains(&child));
    let mut files = Vec::new();
    if let Err(e) = inner_sources(dir, &[], &mut files) {
        return vec![format!("reading {}: {e}", dir.display())];
    }
    let mut bad = Vec::new();
    for (module, text) in &files {
        // The parent's mod.rs puts its children together.
        let Some(top) = module.first() else { continue };
        let Some(own) = layer_of(top) else {
            bad.push(format!("{parent}::{top} has no layer"));
            continue;
        };
        for used in inner_uses(parent, module, text) {
            match layer_of(&used) {
                Some(l) if l < own => {}
                Some(l) => bad.push(format!(
                    "{parent}::{} (layer {own}) uses {parent}::{used} (layer {l}): only lower layers",
                    module.join("::")
                )),
                None => {}
            }
        }
    }
    // And every name in the layers is a child (so that a file moved away is noticed, and a
    // folder read wrong fails rather than passes).
    for name in layers.iter().flat_map(|l| l.iter()) {
        if !files
            .iter()
            .any(|(m, _)| m.first().map(String::as_str) == Some(*name))
        {
            bad.push(format!(
                "the layers name {parent}::{name}, which has no source"
            ));
        }
    }
    bad
}

/// The children of `parent` that the code of its module at `path` (its path inside `parent`,
/// as `["views", "run", "band"]`) names, outside tests and comments.
fn inner_uses(parent: &str, path: &[String], text: &str) -> Vec<String> {
    let code = code_of(text);
    let starts_path = |at: usize| {
        !code[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    };
    let prefix = format!("crate::{parent}::");
    let mut out = Vec::new();
    for (at, _) in code
        .match_indices(prefix.as_str())
        .filter(|(at, _)| starts_path(*at))
    {
        out.extend(heads(&code[at + prefix.len()..]));
    }
    for (at, _) in code
        .match_indices("super::")
        .filter(|(at, _)| starts_path(*at))
    {
        // One module up per `super`: what follows names a child of `parent` once the climb
        // reaches `parent` itself.
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
        Some(group) => group_heads(group),
        None => vec![ident(rest).to_string()],
    }
}

/// Every non-test source file under `dir` (not `tests.rs`, `*_tests.rs` or a `tests` folder),
/// with its module path below `dir`.
fn inner_sources(
    dir: &Path,
    path: &[String],
    out: &mut Vec<(Vec<String>, String)>,
) -> std::io::Result<()> {
    let mut entries = Vec::new();
    for e in std::fs::read_dir(dir)? {
        entries.push(e?.path());
    }
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
                inner_sources(&p, &sub, out)?;
            }
        } else if let Some(stem) = name.strip_suffix(".rs") {
            if stem == "tests" || stem.ends_with("_tests") {
                continue;
            }
            let mut module = path.to_vec();
            if stem != "mod" {
                module.push(stem.to_string());
            }
            out.push((module, std::fs::read_to_string(&p)?));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
    }

    #[test]
    fn every_module_uses_only_the_layers_below_it() {
        let bad = violations(&src());
        assert!(
            bad.is_empty(),
            "the layers (src/layering.rs, docs/architecture.md) are broken:\n{}",
            bad.join("\n")
        );
    }

    #[test]
    fn every_declared_module_has_one_layer_and_every_layer_names_a_module() {
        let lib = std::fs::read_to_string(src().join("lib.rs")).expect("reading src/lib.rs");
        let mods = declared(&lib);
        assert!(mods.len() > 10, "lib.rs declares modules: {mods:?}");
        for m in &mods {
            let n = LAYERS
                .iter()
                .flat_map(|l| l.iter())
                .filter(|x| *x == m)
                .count();
            assert_eq!(n, 1, "module `{m}` is in {n} layers");
        }
        for m in LAYERS.iter().flat_map(|l| l.iter()) {
            assert!(
                mods.iter().any(|d| d == m),
                "LAYERS names `{m}`, lib.rs has none"
            );
        }
    }

    #[test]
    fn lib_docs_name_every_module() {
        let lib = std::fs::read_to_string(src().join("lib.rs")).expect("reading src/lib.rs");
        for m in declared(&lib) {
            assert!(
                lib.contains(&format!("[`{m}`]")),
                "lib.rs's layout doc does not name `{m}`"
            );
        }
    }

    #[test]
    fn the_reader_finds_paths_groups_and_skips_tests_and_comments() {
        let text = "use crate::telemetry::Snapshot;\n\
                    use crate::{config::Paths, units, time::{rfc3339, parse_rfc3339}};\n\
                    // crate::daemon in a comment\n\
                    fn f() { let _ = crate::history::Metric::Util; let _ = other_crate::tui::X; }\n\
                    #[cfg(test)]\nmod tests { use crate::tui::App; }\n";
        assert_eq!(
            uses(text),
            ["config", "history", "telemetry", "time", "units"]
        );
    }

    #[test]
    fn an_upward_use_is_a_violation() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let write = |rel: &str, text: &str| {
            let p = dir.path().join(rel);
            std::fs::create_dir_all(p.parent().expect("a parent")).expect("mkdir");
            std::fs::write(p, text).expect("write");
        };
        write("telemetry/mod.rs", "use crate::cli::SourceKind;\n");
        write("telemetry/tests.rs", "use crate::tui::App;\n");
        write("config/mod.rs", "use crate::units::format_duration;\n");
        write("newmod.rs", "");
        let bad = violations(dir.path());
        assert_eq!(bad.len(), 3, "{bad:#?}");
        assert!(
            bad[0].contains("`config` (layer 0) uses `units` (layer 0)"),
            "{bad:#?}"
        );
        assert!(bad[1].contains("module `newmod` has no layer"), "{bad:#?}");
        assert!(
            bad[2].contains("`telemetry` (layer 2) uses `cli` (layer 12)"),
            "{bad:#?}"
        );
    }

    #[test]
    fn the_inner_reader_resolves_super_and_crate_paths() {
        let path = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let text = "use super::super::super::data::Data;\nuse super::knob_dialog::KnobDialog;\n\
                    use crate::tui::{feed::Link, widgets};\nuse crate::protocol::RunInfo;\n\
                    // crate::tui::app in a comment\n\
                    fn f() { let _ = crate::tui::app::App::new; }\n\
                    #[cfg(test)]\nmod tests { use crate::tui::ui; }\n";
        assert_eq!(
            inner_uses("tui", &path(&["views", "run", "state"]), text),
            ["app", "data", "feed", "widgets"]
        );
        assert_eq!(
            inner_uses(
                "tui",
                &path(&["app"]),
                "use super::ui::Areas;\nuse super::views::Ctx;\n"
            ),
            ["ui", "views"]
        );
    }

    #[test]
    fn an_inner_use_that_runs_up_or_sideways_is_a_violation() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let write = |rel: &str, text: &str| {
            let p = dir.path().join(rel);
            std::fs::create_dir_all(p.parent().expect("a parent")).expect("mkdir");
            std::fs::write(p, text).expect("write");
        };
        write("mod.rs", "mod base; mod parts; mod top;\n");
        write("base.rs", "use super::top::Thing;\n");
        write("parts/mod.rs", "use crate::daemon::base::lock;\n");
        write(
            "parts/one.rs",
            "use super::super::parts::Other; use super::super::top::X;\n",
        );
        write("top.rs", "use super::{base, parts::Part};\n");
        write("stray.rs", "");
        let layers: &[&[&str]] = &[&["base"], &["parts"], &["top", "gone"]];
        let bad = inner_violations(dir.path(), "daemon", layers);
        assert_eq!(bad.len(), 4, "{bad:#?}");
        assert!(
            bad[0].contains("daemon::base (layer 0) uses daemon::top (layer 2)"),
            "{bad:#?}"
        );
        assert!(
            bad[1].contains("daemon::parts::one (layer 1) uses daemon::top (layer 2)"),
            "{bad:#?}"
        );
        assert!(bad[2].contains("daemon::stray has no layer"), "{bad:#?}");
        assert!(
            bad[3].contains("the layers name daemon::gone, which has no source"),
            "{bad:#?}"
        );
    }
}
