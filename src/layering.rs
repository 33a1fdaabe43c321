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

/// The top-level modules `text` (one source file) uses through `crate::` paths, outside tests
/// and comments.
fn uses(text: &str) -> Vec<String> {
    let code = match text.find("#[cfg(test)]") {
        Some(i) => &text[..i],
        None => text,
    };
    let code: String = code
        .lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
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

/// The top-level module a file under `src/` belongs to (`daemon` for `daemon/ops.rs`), or
/// `None` for the crate roots and this file.
fn top_module(rel: &Path) -> Option<String> {
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    // The crate roots, and this check (test code).
    (!matches!(name, "lib" | "main" | "layering")).then(|| name.to_string())
}

/// Every non-test `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if name != "tests" {
                sources(&path, out)?;
            }
        } else if name.ends_with(".rs") && name != "tests.rs" && !name.ends_with("_tests.rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// The top-level modules `lib.rs` declares.
fn declared(lib: &str) -> Vec<String> {
    lib.lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod "))
        .map(|m| m.trim_end_matches(';').to_string())
        .collect()
}

/// Each use that breaks the layers: `file: module → used (why)`.
fn violations(src: &Path) -> Vec<String> {
    let mut files = Vec::new();
    if let Err(e) = sources(src, &mut files) {
        return vec![format!("reading {}: {e}", src.display())];
    }
    files.sort();
    let mut bad = Vec::new();
    for file in files {
        let rel = file.strip_prefix(src).unwrap_or(&file);
        let Some(module) = top_module(rel) else {
            continue;
        };
        let Some(own) = layer_of(&module) else {
            bad.push(format!(
                "{}: module `{module}` has no layer in LAYERS",
                rel.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for used in uses(&text) {
            if used == module {
                continue;
            }
            match layer_of(&used) {
                Some(l) if l < own => {}
                Some(l) => bad.push(format!(
                    "{}: `{module}` (layer {own}) uses `{used}` (layer {l}): only lower layers",
                    rel.display()
                )),
                // Not a module of ours (a macro-exported item, say): nothing to check.
                None => {}
            }
        }
    }
    bad
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
}
