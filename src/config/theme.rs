//! Which colour theme: the presets shipped in `themes/*.toml` (their names and text), the
//! default, and the choice `--theme` and `NO_COLOR` make. What a theme is (its styles, user
//! files merged over a preset) is the console's: `tui::theme`. The cluster view reads
//! `NO_COLOR` here too.

/// The shipped presets, by name.
pub const PRESETS: &[(&str, &str)] = &[
    ("dark", include_str!("../../themes/dark.toml")),
    ("light", include_str!("../../themes/light.toml")),
    (
        "high-contrast",
        include_str!("../../themes/high-contrast.toml"),
    ),
    ("mono", include_str!("../../themes/mono.toml")),
];

/// The theme used when none is named.
pub const DEFAULT_THEME: &str = "dark";

/// The theme `NO_COLOR` selects.
pub const NO_COLOR_THEME: &str = "mono";

/// Which theme to use: `--theme` wins, then `NO_COLOR` (mono), then the default.
pub fn choose(flag: Option<&str>, no_color: bool) -> String {
    match flag {
        Some(n) => n.to_string(),
        None if no_color => NO_COLOR_THEME.to_string(),
        None => DEFAULT_THEME.to_string(),
    }
}

/// True when `NO_COLOR` is set to something non-empty (no-color.org).
pub fn no_color_env() -> bool {
    std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_beats_no_color() {
        assert_eq!(choose(None, false), "dark");
        assert_eq!(choose(None, true), "mono");
        assert_eq!(choose(Some("light"), true), "light");
    }
}
