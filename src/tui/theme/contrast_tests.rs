//! Every shipped theme is readable: the WCAG 2 contrast ratio of each style used for text,
//! against the background the theme is meant for, in a common palette.
//!
//! The palette is Tango (the Tango Desktop Project's colours) as GNOME Terminal ships it: its
//! "Tango" palette for the 16 ANSI colours, and its "Tango light" (#2E3436 on #EEEEEC) and
//! "Tango dark" (#D3D7CF on #2E3436) colour schemes, in `src/profile-editor.cc` of
//! gnome-terminal. Plain white and plain black backgrounds are checked too. A terminal with
//! another palette shows other colours; Tango is a fair test because its gray, green, yellow
//! and bright black sit closer to the backgrounds than xterm's do.
//!
//! Thresholds (WCAG 2.1, 1.4.3 and 1.4.11): 4.5:1 for body text (the text the console is read
//! by: ordinary text, labels, titles, the footer, keys, the help, messages), 3:1 for every
//! other style that draws text or a chart line (values in series colours, badges, levels,
//! axes). Border lines and the unfilled part of gauges are decoration and not checked. A style
//! that sets no colour gets the terminal's default; `reversed` swaps the two; the `dim`
//! modifier (mono) cannot be measured and is left to the terminal.

use super::{PRESETS, ansi_index, preset};
use ratatui::style::{Color, Modifier, Style};

/// GNOME Terminal's Tango palette, ANSI 0–15, as `(r, g, b)`.
const TANGO: [(u8, u8, u8); 16] = [
    (0x2e, 0x34, 0x36), // 0 black
    (0xcc, 0x00, 0x00), // 1 red
    (0x4e, 0x9a, 0x06), // 2 green
    (0xc4, 0xa0, 0x00), // 3 yellow
    (0x34, 0x65, 0xa4), // 4 blue
    (0x75, 0x50, 0x7b), // 5 magenta
    (0x06, 0x98, 0x9a), // 6 cyan
    (0xd3, 0xd7, 0xcf), // 7 white (ratatui's Gray)
    (0x55, 0x57, 0x53), // 8 bright black (DarkGray)
    (0xef, 0x29, 0x29), // 9 bright red
    (0x8a, 0xe2, 0x34), // 10 bright green
    (0xfc, 0xe9, 0x4f), // 11 bright yellow
    (0x72, 0x9f, 0xcf), // 12 bright blue
    (0xad, 0x7f, 0xa8), // 13 bright magenta
    (0x34, 0xe2, 0xe2), // 14 bright cyan
    (0xee, 0xee, 0xec), // 15 bright white (White)
];

/// A terminal a theme is meant for: its name, default foreground and background.
type Terminal = (&'static str, (u8, u8, u8), (u8, u8, u8));

/// Light themes are checked on Tango light and on plain white; the others on Tango dark and
/// on plain black.
fn terminals(theme: &str) -> [Terminal; 2] {
    if theme == "light" {
        [
            ("Tango light", (0x2e, 0x34, 0x36), (0xee, 0xee, 0xec)),
            ("white", (0x00, 0x00, 0x00), (0xff, 0xff, 0xff)),
        ]
    } else {
        [
            ("Tango dark", (0xd3, 0xd7, 0xcf), (0x2e, 0x34, 0x36)),
            ("black", (0xff, 0xff, 0xff), (0x00, 0x00, 0x00)),
        ]
    }
}

/// The slots read as body text (4.5:1).
const BODY: &[&str] = &[
    "text",
    "dim",
    "title",
    "header",
    "tab",
    "footer",
    "key",
    "help_section",
    "status_info",
    "status_error",
];

/// Slots that draw no text: border lines and the empty part of a gauge.
const DECORATION: &[&str] = &["border", "border_selected", "gauge_empty"];

fn rgb(c: Color, default: (u8, u8, u8)) -> (u8, u8, u8) {
    match ansi_index(c) {
        None if c == Color::Reset => default,
        Some(i) if i < 16 => TANGO[i as usize],
        _ => panic!("{c:?} is outside the 16 colours this palette defines"),
    }
}

/// WCAG 2 relative luminance.
fn luminance((r, g, b): (u8, u8, u8)) -> f64 {
    let lin = |c: u8| {
        let c = f64::from(c) / 255.0;
        if c <= 0.04045 {
            c / 12.92
        } else {
            ((c + 0.055) / 1.055).powf(2.4)
        }
    };
    0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b)
}

/// WCAG 2 contrast ratio, 1 to 21.
fn ratio(a: (u8, u8, u8), b: (u8, u8, u8)) -> f64 {
    let (la, lb) = (luminance(a), luminance(b));
    (la.max(lb) + 0.05) / (la.min(lb) + 0.05)
}

/// A style's text and background colours on `term`.
fn colours(s: Style, term: &Terminal) -> ((u8, u8, u8), (u8, u8, u8)) {
    let fg = rgb(s.fg.unwrap_or(Color::Reset), term.1);
    let bg = rgb(s.bg.unwrap_or(Color::Reset), term.2);
    if s.add_modifier.contains(Modifier::REVERSED) {
        (bg, fg)
    } else {
        (fg, bg)
    }
}

#[test]
fn the_formula_gives_wcags_figures() {
    assert!((ratio((0, 0, 0), (255, 255, 255)) - 21.0).abs() < 1e-9);
    assert!((ratio((9, 9, 9), (9, 9, 9)) - 1.0).abs() < 1e-9);
    // Tango's gray on white: the light theme's labels before it was fixed.
    let gray_on_white = ratio(TANGO[7], (255, 255, 255));
    assert!((1.4..1.5).contains(&gray_on_white), "{gray_on_white}");
}

#[test]
fn every_shipped_theme_is_readable_on_the_terminal_it_is_meant_for() {
    let mut bad = Vec::new();
    let mut checked = 0;
    for (name, _) in PRESETS {
        let file = preset(name).expect("shipped themes parse");
        let theme = file.resolve(name);
        for (slot, style) in slots(&theme) {
            if DECORATION.contains(&slot) {
                continue;
            }
            let need = if BODY.contains(&slot) { 4.5 } else { 3.0 };
            for term in terminals(name) {
                let (fg, bg) = colours(style, &term);
                let r = ratio(fg, bg);
                checked += 1;
                if r < need {
                    bad.push(format!(
                        "{name}.{slot} on {}: {r:.2}:1 (needs {need}:1)",
                        term.0
                    ));
                }
            }
        }
    }
    assert!(checked > 100, "{checked} checks");
    assert!(bad.is_empty(), "hard to read:\n{}", bad.join("\n"));
}

/// Every slot of a theme with its name.
fn slots(t: &super::Theme) -> Vec<(&'static str, Style)> {
    vec![
        ("text", t.text),
        ("dim", t.dim),
        ("title", t.title),
        ("border", t.border),
        ("border_selected", t.border_selected),
        ("header", t.header),
        ("tab", t.tab),
        ("tab_active", t.tab_active),
        ("footer", t.footer),
        ("key", t.key),
        ("status_info", t.status_info),
        ("status_error", t.status_error),
        ("util", t.util),
        ("memory", t.memory),
        ("temperature", t.temperature),
        ("power", t.power),
        ("clock", t.clock),
        ("threshold", t.threshold),
        ("axis", t.axis),
        ("gauge_empty", t.gauge_empty),
        ("ok", t.ok),
        ("warn", t.warn),
        ("crit", t.crit),
        ("badge", t.badge),
        ("badge_warn", t.badge_warn),
        ("lost", t.lost),
        ("stale", t.stale),
        ("na", t.na),
        ("selected", t.selected),
        ("help_section", t.help_section),
        ("search_match", t.search_match),
        ("search_current", t.search_current),
    ]
}

#[test]
fn every_slot_is_checked() {
    // A new slot has to be listed in `slots` (and so checked): the preset names them all.
    let file = preset("dark").unwrap();
    let listed: Vec<&str> = slots(&file.resolve("dark")).iter().map(|s| s.0).collect();
    let unset = super::ThemeFile::default().missing();
    assert_eq!(listed, unset, "slots() and the theme's slots differ");
}
