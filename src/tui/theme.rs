//! Colour themes: presets embedded from `themes/*.toml`, user files merged over them.
//!
//! A theme file is a table of named styles (`[border] fg = "dark-gray"`). A user file at
//! `<config>/themes/NAME.toml` overrides a preset field by field: it names only what it changes,
//! and may pick the preset it starts from with `base = "light"` (default: the preset of the
//! same name, else `dark`). Colours are the 16 named ANSI colours or a 256-colour index — never
//! truecolor, so every theme works in 16- and 256-colour terminals and over old SSH clients.
//!
//! A bad user file never stops the console: [`load`] returns the preset together with a
//! message that names the file, line and column. Unknown keys are errors.
//!
//! This module parses and resolves; it draws nothing and reads no file but the one it is asked
//! to load.

pub use crate::config::theme::{DEFAULT_THEME, NO_COLOR_THEME, PRESETS};
use ratatui::style::{Color, Modifier, Style};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// A colour as written in a theme file: a name (`"light-red"`, `"reset"`) or an index 0–255.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColorSpec(pub Color);

impl<'de> Deserialize<'de> for ColorSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Index(i64),
            Name(String),
        }
        match Raw::deserialize(d)? {
            Raw::Index(i) => u8::try_from(i)
                .map(|i| ColorSpec(Color::Indexed(i)))
                .map_err(|_| {
                    serde::de::Error::custom(format!("colour index {i} is outside 0..=255"))
                }),
            Raw::Name(s) => parse_color(&s)
                .map(ColorSpec)
                .map_err(serde::de::Error::custom),
        }
    }
}

/// Parse a colour name or `"idx:N"`/`"N"` index. Truecolor (`#rrggbb`) is refused on purpose.
pub fn parse_color(s: &str) -> Result<Color, String> {
    let name = s.trim().to_ascii_lowercase().replace(['_', ' '], "-");
    let c = match name.as_str() {
        "reset" | "default" => Color::Reset,
        "black" => Color::Black,
        "red" => Color::Red,
        "green" => Color::Green,
        "yellow" => Color::Yellow,
        "blue" => Color::Blue,
        "magenta" => Color::Magenta,
        "cyan" => Color::Cyan,
        "gray" | "grey" => Color::Gray,
        "dark-gray" | "dark-grey" => Color::DarkGray,
        "light-red" => Color::LightRed,
        "light-green" => Color::LightGreen,
        "light-yellow" => Color::LightYellow,
        "light-blue" => Color::LightBlue,
        "light-magenta" => Color::LightMagenta,
        "light-cyan" => Color::LightCyan,
        "white" => Color::White,
        n if n.starts_with('#') => {
            return Err(format!(
                "truecolor {s:?} is not supported (terminals over SSH often lack it): use a colour name or an index 0..=255"
            ));
        }
        n => {
            let digits = n.strip_prefix("idx:").unwrap_or(n);
            return digits.parse::<u8>().map(Color::Indexed).map_err(|_| {
                format!(
                    "unknown colour {s:?}: use a name such as \"light-blue\" or an index 0..=255"
                )
            });
        }
    };
    Ok(c)
}

/// The palette index of a colour: 0–15 for the 16 named ANSI colours (`Gray` is 7, `DarkGray`
/// 8, `White` 15), the index itself for a 256-colour index; None for the terminal's default
/// and for truecolor.
pub fn ansi_index(c: Color) -> Option<u8> {
    Some(match c {
        Color::Reset | Color::Rgb(..) => return None,
        Color::Black => 0,
        Color::Red => 1,
        Color::Green => 2,
        Color::Yellow => 3,
        Color::Blue => 4,
        Color::Magenta => 5,
        Color::Cyan => 6,
        Color::Gray => 7,
        Color::DarkGray => 8,
        Color::LightRed => 9,
        Color::LightGreen => 10,
        Color::LightYellow => 11,
        Color::LightBlue => 12,
        Color::LightMagenta => 13,
        Color::LightCyan => 14,
        Color::White => 15,
        Color::Indexed(i) => i,
    })
}

/// One style as written in a theme file; every field optional so that files can be merged.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StyleSpec {
    pub fg: Option<ColorSpec>,
    pub bg: Option<ColorSpec>,
    pub bold: Option<bool>,
    pub dim: Option<bool>,
    pub italic: Option<bool>,
    pub underline: Option<bool>,
    pub reversed: Option<bool>,
}

impl StyleSpec {
    /// `self` with every field `over` sets replaced.
    fn merged(&self, over: &StyleSpec) -> StyleSpec {
        StyleSpec {
            fg: over.fg.or(self.fg),
            bg: over.bg.or(self.bg),
            bold: over.bold.or(self.bold),
            dim: over.dim.or(self.dim),
            italic: over.italic.or(self.italic),
            underline: over.underline.or(self.underline),
            reversed: over.reversed.or(self.reversed),
        }
    }

    fn style(&self) -> Style {
        let mut s = Style::default();
        if let Some(c) = self.fg {
            s = s.fg(c.0);
        }
        if let Some(c) = self.bg {
            s = s.bg(c.0);
        }
        for (on, m) in [
            (self.bold, Modifier::BOLD),
            (self.dim, Modifier::DIM),
            (self.italic, Modifier::ITALIC),
            (self.underline, Modifier::UNDERLINED),
            (self.reversed, Modifier::REVERSED),
        ] {
            if on == Some(true) {
                s = s.add_modifier(m);
            }
        }
        s
    }
}

/// Declares the style slots once: the file form (all optional), the resolved form, merging and
/// resolution stay in step.
macro_rules! theme_slots {
    ($($(#[doc = $doc:literal])* $name:ident,)*) => {
        /// A theme file as parsed: every style optional (see the module doc).
        #[derive(Debug, Clone, Default, PartialEq, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct ThemeFile {
            /// The preset a user file starts from.
            pub base: Option<String>,
            $(pub $name: Option<StyleSpec>,)*
        }

        /// A resolved theme: one ratatui style per slot.
        #[derive(Debug, Clone, PartialEq)]
        pub struct Theme {
            /// Name it was loaded as.
            pub name: String,
            $($(#[doc = $doc])* pub $name: Style,)*
        }

        impl ThemeFile {
            /// `self` with every style (field by field) that `over` sets replaced.
            pub fn merged(&self, over: &ThemeFile) -> ThemeFile {
                ThemeFile {
                    base: over.base.clone().or_else(|| self.base.clone()),
                    $($name: match (&self.$name, &over.$name) {
                        (Some(a), Some(b)) => Some(a.merged(b)),
                        (a, b) => b.clone().or_else(|| a.clone()),
                    },)*
                }
            }

            /// Slots the file leaves unset (a preset must set them all).
            pub fn missing(&self) -> Vec<&'static str> {
                let mut v = Vec::new();
                $(if self.$name.is_none() { v.push(stringify!($name)); })*
                v
            }

            /// The theme these styles make; unset slots are the terminal's default style.
            pub fn resolve(&self, name: &str) -> Theme {
                Theme {
                    name: name.to_string(),
                    $($name: self.$name.as_ref().map(StyleSpec::style).unwrap_or_default(),)*
                }
            }
        }
    };
}

theme_slots! {
    /// Ordinary text.
    text,
    /// Labels and secondary text.
    dim,
    /// Block titles.
    title,
    border,
    /// Border of the selected GPU.
    border_selected,
    /// The header line (node, driver, CUDA).
    header,
    tab,
    tab_active,
    footer,
    /// A key in the footer hints.
    key,
    status_info,
    status_error,
    /// Utilization gauges, sparklines and chart.
    util,
    memory,
    temperature,
    power,
    clock,
    /// Threshold and cap lines on charts.
    threshold,
    /// Chart axes and labels.
    axis,
    /// The unfilled part of a gauge.
    gauge_empty,
    /// Level colours for temperature and power gauges.
    ok,
    warn,
    crit,
    /// A throttle-reason badge.
    badge,
    /// A badge for power or thermal throttling (the ones that cost throughput).
    badge_warn,
    /// A GPU that fell off the bus.
    lost,
    /// A reading that is not fresh.
    stale,
    /// An absent metric (`N/A`).
    na,
    /// The selected row of a table.
    selected,
    /// Help screen section titles.
    help_section,
    /// A match of the log search.
    search_match,
    /// The current match of the log search.
    search_current,
}

/// Why a theme could not be used.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ThemeError {
    #[error("{file}: line {line}, column {column}: {message}")]
    Parse {
        file: String,
        line: usize,
        column: usize,
        message: String,
    },
    #[error(
        "unknown theme {0:?}: shipped themes are dark, light, high-contrast, mono; or put NAME.toml in {1}"
    )]
    Unknown(String, String),
    #[error("{file}: {message}")]
    Read { file: String, message: String },
}

/// Parse theme text; errors carry the line and column.
pub fn parse(text: &str, file: &str) -> Result<ThemeFile, ThemeError> {
    toml::from_str(text).map_err(|e| {
        let (line, column) = e.span().map(|s| line_col(text, s.start)).unwrap_or((1, 1));
        ThemeError::Parse {
            file: file.to_string(),
            line,
            column,
            message: e.message().trim().to_string(),
        }
    })
}

/// 1-based line and column of a byte offset.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// A shipped preset, parsed.
pub fn preset(name: &str) -> Option<ThemeFile> {
    PRESETS.iter().find(|(n, _)| *n == name).map(|(n, text)| {
        parse(text, &format!("themes/{n}.toml")).expect("shipped themes parse (tested)")
    })
}

/// Load theme `name`: the preset merged with `<themes_dir>/NAME.toml` if that exists.
/// Never fails: on a bad or unknown theme it returns the default preset and the error.
pub fn load(name: &str, themes_dir: &Path) -> (Theme, Option<ThemeError>) {
    match try_load(name, themes_dir) {
        Ok(t) => (t, None),
        Err(e) => {
            let fallback =
                preset(name).unwrap_or_else(|| preset(DEFAULT_THEME).expect("default preset"));
            let fallback_name = if preset(name).is_some() {
                name
            } else {
                DEFAULT_THEME
            };
            (fallback.resolve(fallback_name), Some(e))
        }
    }
}

/// Load theme `name` (see [`load`]), reporting any error.
pub fn try_load(name: &str, themes_dir: &Path) -> Result<Theme, ThemeError> {
    let path: PathBuf = themes_dir.join(format!("{name}.toml"));
    let user = match std::fs::read_to_string(&path) {
        Ok(text) => Some(parse(&text, &path.display().to_string())?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            return Err(ThemeError::Read {
                file: path.display().to_string(),
                message: e.to_string(),
            });
        }
    };
    let base_name = user
        .as_ref()
        .and_then(|u| u.base.clone())
        .unwrap_or_else(|| {
            if preset(name).is_some() {
                name.to_string()
            } else {
                DEFAULT_THEME.to_string()
            }
        });
    let Some(base) = preset(&base_name) else {
        return Err(ThemeError::Unknown(
            base_name,
            themes_dir.display().to_string(),
        ));
    };
    match user {
        Some(u) => Ok(base.merged(&u).resolve(name)),
        None if preset(name).is_some() => Ok(base.resolve(name)),
        None => Err(ThemeError::Unknown(
            name.to_string(),
            themes_dir.display().to_string(),
        )),
    }
}

impl Default for Theme {
    fn default() -> Self {
        preset(DEFAULT_THEME)
            .expect("default preset")
            .resolve(DEFAULT_THEME)
    }
}

#[cfg(test)]
mod contrast_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_parses_and_sets_every_slot() {
        for (name, _) in PRESETS {
            let p = preset(name).unwrap();
            assert!(
                p.missing().is_empty(),
                "{name} leaves {:?} unset",
                p.missing()
            );
            assert!(p.base.is_none(), "{name}: presets have no base");
        }
    }

    #[test]
    fn presets_use_no_truecolor() {
        for (name, _) in PRESETS {
            let t = preset(name).unwrap();
            let dbg = format!("{t:?}");
            assert!(!dbg.contains("Rgb"), "{name} uses truecolor");
        }
    }

    #[test]
    fn mono_has_no_colours() {
        let dbg = format!("{:?}", preset("mono").unwrap());
        for c in [
            "Red", "Green", "Blue", "Yellow", "Cyan", "Magenta", "Indexed", "Gray",
        ] {
            assert!(!dbg.contains(c), "mono uses {c}");
        }
    }

    #[test]
    fn colours_by_name_and_index() {
        assert_eq!(parse_color("light-blue"), Ok(Color::LightBlue));
        assert_eq!(parse_color("Dark Gray"), Ok(Color::DarkGray));
        assert_eq!(parse_color("208"), Ok(Color::Indexed(208)));
        assert_eq!(parse_color("idx:17"), Ok(Color::Indexed(17)));
        assert!(parse_color("#ff0000").unwrap_err().contains("truecolor"));
        assert!(
            parse_color("blu")
                .unwrap_err()
                .contains("unknown colour \"blu\"")
        );
    }

    #[test]
    fn user_file_overrides_field_by_field() {
        let base = preset("dark").unwrap();
        let user = parse("[border]\nbold = true\n[power]\nfg = 208\n", "u.toml").unwrap();
        let m = base.merged(&user);
        let border = m.border.as_ref().unwrap();
        assert_eq!(border.bold, Some(true));
        assert_eq!(
            border.fg,
            base.border.as_ref().unwrap().fg,
            "fg kept from the preset"
        );
        assert_eq!(
            m.power.as_ref().unwrap().fg,
            Some(ColorSpec(Color::Indexed(208)))
        );
        assert_eq!(m.text, base.text);
    }

    #[test]
    fn errors_name_line_and_column() {
        let e = parse("[border]\nfg = \"blu\"\n", "t.toml").unwrap_err();
        let ThemeError::Parse {
            line,
            column,
            message,
            ..
        } = &e
        else {
            panic!("{e:?}")
        };
        assert_eq!((*line, *column), (2, 6), "{e}");
        assert!(message.contains("unknown colour"), "{message}");
        let e = parse("[bordr]\nfg = \"red\"\n", "t.toml").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("t.toml: line 1, column 2: unknown field `bordr`"),
            "{e}"
        );
        let e = parse("[border]\nfgg = \"red\"\n", "t.toml").unwrap_err();
        assert!(e.to_string().contains("line 2, column 1"), "{e}");
    }

    #[test]
    fn load_falls_back_and_reports() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("dark.toml"), "[title]\nfg = \"nope\"\n").unwrap();
        let (t, err) = load("dark", dir.path());
        assert_eq!(t, Theme::default());
        let msg = err.unwrap().to_string();
        assert!(msg.contains("dark.toml: line 2, column 6"), "{msg}");

        std::fs::write(
            dir.path().join("mine.toml"),
            "base = \"light\"\n[title]\nfg = \"red\"\n",
        )
        .unwrap();
        let t = try_load("mine", dir.path()).unwrap();
        let light = preset("light").unwrap().resolve("x");
        assert_eq!(t.title.fg, Some(Color::Red));
        assert_eq!(t.text, light.text);

        let (t, err) = load("nosuch", dir.path());
        assert_eq!(t.name, "dark");
        assert!(
            err.unwrap()
                .to_string()
                .contains("unknown theme \"nosuch\"")
        );
    }
}
