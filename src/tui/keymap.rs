//! The console's keymap: defaults embedded from `src/tui/keymap-default.toml`, a user file
//! (`<config>/keymap.toml`) merged over them.
//!
//! The file has one array of bindings per context (`[[global]]`, `[[overview]]`, `[[detail]]`,
//! `[[run]]`, `[[events]]`, `[[help]]`); each binding lists the keys that do the same thing (`on`), the action it runs
//! (`run`), the words the help screen shows (`desc`) and, optionally, a short word for the
//! footer (`hint`) and a shorter one for narrow terminals (`short`). A key the user binds replaces its default binding in that context;
//! `run = "noop"` unbinds it. The help screen is generated from this, so it is never out of step
//! with the keys.
//!
//! A bad user file never stops the console: [`load`] falls back to the defaults and returns a
//! message with file, line and column. Unknown keys, fields and actions are errors.

use super::action::{Action, ViewId};
use super::theme::line_col;
use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use serde::Deserialize;
use std::fmt;
use std::path::Path;

/// The embedded default keymap.
pub const DEFAULT_KEYMAP: &str = include_str!("keymap-default.toml");

/// One key with its modifiers, as a keymap names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key {
    pub code: KeyCode,
    pub mods: KeyModifiers,
}

impl Key {
    pub fn new(code: KeyCode, mods: KeyModifiers) -> Key {
        Key { code, mods }.normalized()
    }

    /// A plain character key.
    pub fn char(c: char) -> Key {
        Key::new(KeyCode::Char(c), KeyModifiers::NONE)
    }

    /// The key a terminal event stands for. Shift is folded into the character (`G`, `?`) and
    /// into BackTab, so a keymap never has to spell it for those.
    pub fn from_event(ev: &KeyEvent) -> Key {
        Key::new(ev.code, ev.modifiers)
    }

    fn normalized(mut self) -> Key {
        self.mods &= KeyModifiers::SHIFT | KeyModifiers::CONTROL | KeyModifiers::ALT;
        match self.code {
            KeyCode::Char(_) | KeyCode::BackTab => self.mods.remove(KeyModifiers::SHIFT),
            KeyCode::Tab if self.mods.contains(KeyModifiers::SHIFT) => {
                self.code = KeyCode::BackTab;
                self.mods.remove(KeyModifiers::SHIFT);
            }
            _ => {}
        }
        self
    }

    /// Parse `q`, `?`, `<Enter>`, `<C-l>`, `<S-Tab>`, `<A-x>`, `<F1>` …
    pub fn parse(s: &str) -> Result<Key, String> {
        let bad = || {
            format!(
                "unknown key {s:?}: a character (\"q\") or <Enter> <Esc> <Tab> <S-Tab> <Backspace> <Space> <Up> <Down> <Left> <Right> <PageUp> <PageDown> <Home> <End> <Delete> <Insert> <F1>..<F12>, with <C-…> <A-…> <S-…>"
            )
        };
        let mut chars = s.chars();
        if let (Some(c), None) = (chars.next(), chars.next()) {
            return Ok(Key::char(c));
        }
        let inner = s
            .strip_prefix('<')
            .and_then(|r| r.strip_suffix('>'))
            .ok_or_else(bad)?;
        let mut mods = KeyModifiers::NONE;
        let mut rest = inner;
        while rest.len() > 2 && rest.as_bytes()[1] == b'-' {
            mods |= match rest.as_bytes()[0].to_ascii_uppercase() {
                b'C' => KeyModifiers::CONTROL,
                b'A' | b'M' => KeyModifiers::ALT,
                b'S' => KeyModifiers::SHIFT,
                _ => return Err(bad()),
            };
            rest = &rest[2..];
        }
        let mut rc = rest.chars();
        let code = match (rc.next(), rc.next()) {
            (Some(c), None) => KeyCode::Char(c),
            _ => match rest.to_ascii_lowercase().as_str() {
                "enter" | "cr" | "return" => KeyCode::Enter,
                "esc" | "escape" => KeyCode::Esc,
                "tab" => KeyCode::Tab,
                "backtab" => KeyCode::BackTab,
                "backspace" | "bs" => KeyCode::Backspace,
                "space" => KeyCode::Char(' '),
                "up" => KeyCode::Up,
                "down" => KeyCode::Down,
                "left" => KeyCode::Left,
                "right" => KeyCode::Right,
                "pageup" | "pgup" => KeyCode::PageUp,
                "pagedown" | "pgdn" => KeyCode::PageDown,
                "home" => KeyCode::Home,
                "end" => KeyCode::End,
                "delete" | "del" => KeyCode::Delete,
                "insert" | "ins" => KeyCode::Insert,
                "lt" => KeyCode::Char('<'),
                f if f.starts_with('f') => match f[1..].parse::<u8>() {
                    Ok(n @ 1..=12) => KeyCode::F(n),
                    _ => return Err(bad()),
                },
                _ => return Err(bad()),
            },
        };
        Ok(Key::new(code, mods))
    }
}

impl fmt::Display for Key {
    /// The way help and footer show a key: `q`, `Tab`, `S-Tab`, `C-l`, `↑`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.mods.contains(KeyModifiers::CONTROL) {
            f.write_str("C-")?;
        }
        if self.mods.contains(KeyModifiers::ALT) {
            f.write_str("A-")?;
        }
        if self.mods.contains(KeyModifiers::SHIFT) {
            f.write_str("S-")?;
        }
        match self.code {
            KeyCode::Char(' ') => f.write_str("Space"),
            KeyCode::Char(c) => write!(f, "{c}"),
            KeyCode::Enter => f.write_str("Enter"),
            KeyCode::Esc => f.write_str("Esc"),
            KeyCode::Tab => f.write_str("Tab"),
            KeyCode::BackTab => f.write_str("S-Tab"),
            KeyCode::Backspace => f.write_str("Backspace"),
            KeyCode::Up => f.write_str("↑"),
            KeyCode::Down => f.write_str("↓"),
            KeyCode::Left => f.write_str("←"),
            KeyCode::Right => f.write_str("→"),
            KeyCode::PageUp => f.write_str("PgUp"),
            KeyCode::PageDown => f.write_str("PgDn"),
            KeyCode::Home => f.write_str("Home"),
            KeyCode::End => f.write_str("End"),
            KeyCode::Delete => f.write_str("Del"),
            KeyCode::Insert => f.write_str("Ins"),
            KeyCode::F(n) => write!(f, "F{n}"),
            other => write!(f, "{other:?}"),
        }
    }
}

/// Where a binding applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Context {
    /// Every view (after the view's own bindings).
    Global,
    Overview,
    Detail,
    Run,
    Events,
    /// While the help screen is open (nothing else applies then).
    Help,
}

impl Context {
    pub const ALL: [Context; 6] = [
        Context::Global,
        Context::Overview,
        Context::Detail,
        Context::Run,
        Context::Events,
        Context::Help,
    ];

    /// The heading the help screen gives it.
    pub fn title(self) -> &'static str {
        match self {
            Context::Global => "Everywhere",
            Context::Overview => "Overview",
            Context::Detail => "GPU detail",
            Context::Run => "Run",
            Context::Events => "Events",
            Context::Help => "This help",
        }
    }

    /// The context of a view's own bindings, if it has any.
    pub fn of_view(view: ViewId) -> Option<Context> {
        match view {
            ViewId::Overview => Some(Context::Overview),
            ViewId::Detail => Some(Context::Detail),
            ViewId::Run => Some(Context::Run),
            ViewId::Events => Some(Context::Events),
            ViewId::Topology => None,
        }
    }
}

/// Keys that run one action.
#[derive(Debug, Clone, PartialEq)]
pub struct Binding {
    pub keys: Vec<Key>,
    pub action: Action,
    pub desc: String,
    /// Short word for the footer; bindings without one stay out of it.
    pub hint: Option<String>,
    /// A shorter word for a narrow footer (else the hint).
    pub short: Option<String>,
}

/// Every binding, by context, in file order.
#[derive(Debug, Clone, PartialEq)]
pub struct Keymap {
    sections: [Vec<Binding>; 6],
    memo: Memo,
}

/// The footer's hints, worked out once per view (the console draws its footer every second,
/// and working them out looks up every binding's key again). Not part of a keymap's identity.
#[derive(Debug, Clone, Default)]
struct Memo {
    /// By view (its place in [`ViewId::ALL`]), then help open or not.
    hints: [[std::sync::OnceLock<Vec<Hint>>; 2]; ViewId::ALL.len()],
    /// The key that shows each view, by its place in [`ViewId::ALL`].
    view_keys: std::sync::OnceLock<[Option<Key>; ViewId::ALL.len()]>,
}

impl PartialEq for Memo {
    fn eq(&self, _: &Memo) -> bool {
        true
    }
}

/// A hint for the footer: the key, the word for what it does, a shorter word for a narrow
/// footer, the action, and whether it is the view's own (not a global binding).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hint {
    pub key: String,
    pub word: String,
    pub short: String,
    pub action: Action,
    pub own: bool,
}

impl Keymap {
    /// The bindings of one context.
    pub fn bindings(&self, ctx: Context) -> &[Binding] {
        &self.sections[ctx as usize]
    }

    /// The action `key` runs: in help only the help bindings; elsewhere the view's own, then
    /// the global ones.
    pub fn lookup(&self, view: ViewId, help_open: bool, key: Key) -> Option<Action> {
        let contexts = if help_open {
            [Some(Context::Help), None]
        } else {
            [Context::of_view(view), Some(Context::Global)]
        };
        contexts
            .iter()
            .flatten()
            .flat_map(|c| self.bindings(*c))
            .find(|b| b.keys.contains(&key))
            .map(|b| b.action)
    }

    /// The footer's hints in `view` (or in help), the view's own first, then the global ones:
    /// each binding of the context that has a hint, with its first key, unless that key runs
    /// something else there (a global key the view binds otherwise would be a wrong hint).
    /// Which of them apply now (a run shown, a replay) is the footer's to decide.
    pub fn hints(&self, view: ViewId, help_open: bool) -> &[Hint] {
        let at = ViewId::ALL.iter().position(|v| *v == view).unwrap_or(0);
        self.memo.hints[at][usize::from(help_open)].get_or_init(|| {
            let contexts: Vec<Context> = if help_open {
                vec![Context::Help]
            } else {
                Context::of_view(view)
                    .into_iter()
                    .chain([Context::Global])
                    .collect()
            };
            contexts
                .iter()
                .flat_map(|c| self.bindings(*c).iter().map(move |b| (*c, b)))
                .filter_map(|(c, b)| match (&b.hint, b.keys.first()) {
                    (Some(hint), Some(key))
                        if self.lookup(view, help_open, *key) == Some(b.action) =>
                    {
                        Some(Hint {
                            key: key.to_string(),
                            word: hint.clone(),
                            short: b.short.clone().unwrap_or_else(|| hint.clone()),
                            action: b.action,
                            own: c != Context::Global,
                        })
                    }
                    _ => None,
                })
                .collect()
        })
    }

    /// The first key that shows `view` from anywhere (its tab's label).
    pub fn view_key(&self, view: ViewId) -> Option<Key> {
        let keys = self.memo.view_keys.get_or_init(|| {
            ViewId::ALL.map(|v| {
                self.bindings(Context::Global)
                    .iter()
                    .find(|b| b.action == Action::ShowView(v))
                    .and_then(|b| b.keys.first().copied())
            })
        });
        let at = ViewId::ALL.iter().position(|v| *v == view)?;
        keys[at]
    }

    /// The embedded defaults.
    pub fn defaults() -> Keymap {
        Keymap::from_file(
            parse(DEFAULT_KEYMAP, "keymap-default.toml").expect("default keymap parses (tested)"),
        )
    }

    fn from_file(f: KeymapFile) -> Keymap {
        let conv = |v: Vec<BindingSpec>| v.into_iter().map(BindingSpec::into_binding).collect();
        Keymap {
            sections: [
                conv(f.global),
                conv(f.overview),
                conv(f.detail),
                conv(f.run),
                conv(f.events),
                conv(f.help),
            ],
            memo: Memo::default(),
        }
    }

    /// These bindings with `user`'s merged over them (see the module doc).
    pub fn merged(mut self, user: Keymap) -> Keymap {
        for (mine, theirs) in self.sections.iter_mut().zip(user.sections) {
            for b in theirs {
                for m in mine.iter_mut() {
                    m.keys.retain(|k| !b.keys.contains(k));
                }
                mine.retain(|m| !m.keys.is_empty());
                if b.action != Action::Noop {
                    mine.push(b);
                }
            }
        }
        self.memo = Memo::default();
        self
    }
}

impl Default for Keymap {
    fn default() -> Self {
        Keymap::defaults()
    }
}

/// A keymap file as parsed.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeymapFile {
    #[serde(default)]
    global: Vec<BindingSpec>,
    #[serde(default)]
    overview: Vec<BindingSpec>,
    #[serde(default)]
    detail: Vec<BindingSpec>,
    #[serde(default)]
    run: Vec<BindingSpec>,
    #[serde(default)]
    events: Vec<BindingSpec>,
    #[serde(default)]
    help: Vec<BindingSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BindingSpec {
    on: OneOrMany,
    run: ActionSpec,
    #[serde(default)]
    desc: String,
    hint: Option<String>,
    short: Option<String>,
}

impl BindingSpec {
    fn into_binding(self) -> Binding {
        Binding {
            keys: self.on.0,
            action: self.run.0,
            desc: self.desc,
            hint: self.hint,
            short: self.short,
        }
    }
}

#[derive(Debug)]
struct OneOrMany(Vec<Key>);

impl<'de> Deserialize<'de> for OneOrMany {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            One(String),
            Many(Vec<String>),
        }
        let raw = match Raw::deserialize(d)? {
            Raw::One(s) => vec![s],
            Raw::Many(v) => v,
        };
        if raw.is_empty() {
            return Err(serde::de::Error::custom("`on` lists no key"));
        }
        raw.iter()
            .map(|s| Key::parse(s))
            .collect::<Result<_, _>>()
            .map(OneOrMany)
            .map_err(serde::de::Error::custom)
    }
}

#[derive(Debug)]
struct ActionSpec(Action);

impl<'de> Deserialize<'de> for ActionSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map(ActionSpec).map_err(serde::de::Error::custom)
    }
}

/// Why a keymap file could not be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KeymapError {
    #[error("{file}: line {line}, column {column}: {message}")]
    Parse {
        file: String,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{file}: {message}")]
    Read { file: String, message: String },
}

fn parse(text: &str, file: &str) -> Result<KeymapFile, KeymapError> {
    toml::from_str(text).map_err(|e| {
        let (line, column) = e.span().map(|s| line_col(text, s.start)).unwrap_or((1, 1));
        KeymapError::Parse {
            file: file.to_string(),
            line,
            column,
            message: e.message().trim().to_string(),
        }
    })
}

/// Parse a user keymap's text and merge it over the defaults.
pub fn from_user_text(text: &str, file: &str) -> Result<Keymap, KeymapError> {
    Ok(Keymap::defaults().merged(Keymap::from_file(parse(text, file)?)))
}

/// The defaults merged with `<config_dir>/keymap.toml` if it exists. Never fails: a bad file
/// gives the defaults and the error.
pub fn load(config_dir: &Path) -> (Keymap, Option<KeymapError>) {
    let path = config_dir.join("keymap.toml");
    let file = path.display().to_string();
    match std::fs::read_to_string(&path) {
        Ok(text) => match from_user_text(&text, &file) {
            Ok(k) => (k, None),
            Err(e) => (Keymap::defaults(), Some(e)),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (Keymap::defaults(), None),
        Err(e) => (
            Keymap::defaults(),
            Some(KeymapError::Read {
                file,
                message: e.to_string(),
            }),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(s: &str) -> Key {
        Key::parse(s).unwrap()
    }

    #[test]
    fn key_names_parse_and_print() {
        assert_eq!(k("q"), Key::char('q'));
        assert_eq!(
            k("<C-l>"),
            Key::new(KeyCode::Char('l'), KeyModifiers::CONTROL)
        );
        assert_eq!(k("<S-Tab>"), Key::new(KeyCode::BackTab, KeyModifiers::NONE));
        assert_eq!(k("<F1>"), Key::new(KeyCode::F(1), KeyModifiers::NONE));
        assert_eq!(k("<Space>"), Key::char(' '));
        assert_eq!(k("<C-l>").to_string(), "C-l");
        assert_eq!(k("<Down>").to_string(), "↓");
        assert_eq!(k("<S-Tab>").to_string(), "S-Tab");
        assert!(Key::parse("<Hyper-x>").is_err());
        assert!(Key::parse("<F13>").is_err());
        assert!(Key::parse("qq").is_err());
    }

    #[test]
    fn shifted_events_match_plain_names() {
        let ev = KeyEvent::new(KeyCode::Char('G'), KeyModifiers::SHIFT);
        assert_eq!(Key::from_event(&ev), k("G"));
        let ev = KeyEvent::new(KeyCode::Tab, KeyModifiers::SHIFT);
        assert_eq!(Key::from_event(&ev), k("<S-Tab>"));
        let ev = KeyEvent::new(KeyCode::BackTab, KeyModifiers::SHIFT);
        assert_eq!(Key::from_event(&ev), k("<S-Tab>"));
    }

    #[test]
    fn defaults_cover_the_promised_keys() {
        let km = Keymap::defaults();
        let at = |view, key: &str| km.lookup(view, false, k(key));
        assert_eq!(at(ViewId::Overview, "q"), Some(Action::Quit));
        assert_eq!(at(ViewId::Overview, "?"), Some(Action::Help));
        assert_eq!(at(ViewId::Overview, "<Tab>"), Some(Action::NextView));
        assert_eq!(at(ViewId::Overview, "<S-Tab>"), Some(Action::PrevView));
        assert_eq!(at(ViewId::Run, "2"), Some(Action::ShowView(ViewId::Detail)));
        assert_eq!(at(ViewId::Overview, "j"), Some(Action::NextGpu));
        assert_eq!(at(ViewId::Overview, "<Down>"), Some(Action::NextGpu));
        assert_eq!(at(ViewId::Detail, "k"), Some(Action::PrevGpu));
        assert_eq!(
            at(ViewId::Overview, "<Enter>"),
            Some(Action::ShowView(ViewId::Detail))
        );
        assert_eq!(
            at(ViewId::Detail, "<Esc>"),
            Some(Action::ShowView(ViewId::Overview))
        );
        assert_eq!(at(ViewId::Detail, "+"), Some(Action::ZoomIn));
        assert_eq!(at(ViewId::Detail, "-"), Some(Action::ZoomOut));
        assert_eq!(at(ViewId::Events, "<C-l>"), Some(Action::Redraw));
        assert_eq!(at(ViewId::Run, "/"), Some(Action::Search));
        assert_eq!(at(ViewId::Run, "n"), Some(Action::SearchNext));
        assert_eq!(at(ViewId::Run, "N"), Some(Action::SearchPrev));
        assert_eq!(at(ViewId::Run, "s"), Some(Action::StopRun));
        assert_eq!(at(ViewId::Run, "p"), Some(Action::PauseRun));
        assert_eq!(at(ViewId::Run, "f"), Some(Action::Follow));
        assert_eq!(at(ViewId::Run, "j"), Some(Action::RunNext));
        assert_eq!(at(ViewId::Run, "<Enter>"), Some(Action::RunOpen));
        assert_eq!(at(ViewId::Run, "q"), Some(Action::Quit));
        assert_eq!(at(ViewId::Events, "j"), Some(Action::ScrollDown));
        assert_eq!(
            at(ViewId::Overview, "s"),
            None,
            "stop only where a run is shown"
        );
        assert_eq!(
            km.lookup(ViewId::Overview, true, k("q")),
            Some(Action::Close)
        );
        assert_eq!(
            km.lookup(ViewId::Overview, true, k("<Tab>")),
            None,
            "help swallows other keys"
        );
        for ctx in Context::ALL {
            for b in km.bindings(ctx) {
                assert!(!b.desc.is_empty(), "{b:?} has no description");
            }
        }
    }

    #[test]
    fn user_bindings_replace_defaults_key_by_key() {
        let km = from_user_text(
            "[[global]]\non = \"x\"\nrun = \"quit\"\ndesc = \"Leave\"\n\n[[global]]\non = \"q\"\nrun = \"noop\"\n",
            "keymap.toml",
        )
        .unwrap();
        assert_eq!(
            km.lookup(ViewId::Overview, false, k("x")),
            Some(Action::Quit)
        );
        assert_eq!(
            km.lookup(ViewId::Overview, false, k("q")),
            None,
            "unbound by noop"
        );
        assert_eq!(
            km.lookup(ViewId::Overview, false, k("<C-c>")),
            Some(Action::Quit),
            "the other key of the default binding stays"
        );
    }

    #[test]
    fn footer_hints_and_tab_keys_follow_the_view_and_a_merged_keymap() {
        let pairs = |hints: &[Hint]| -> Vec<(String, String)> {
            hints
                .iter()
                .map(|h| (h.key.clone(), h.word.clone()))
                .collect()
        };
        let hint = |key: &str, word: &str| (key.to_string(), word.to_string());
        let km = Keymap::defaults();
        let overview = km.hints(ViewId::Overview, false);
        // The view's own first, then the global ones.
        assert_eq!(
            overview.first().map(|h| (h.key.as_str(), h.own)),
            Some(("Enter", true))
        );
        let own = overview.iter().take_while(|h| h.own).count();
        assert!(overview[own..].iter().all(|h| !h.own), "{overview:?}");
        let power = overview.iter().find(|h| h.action == Action::PowerCap);
        assert_eq!(
            power.map(|h| (h.key.as_str(), h.word.as_str(), h.short.as_str())),
            Some(("c", "power cap", "cap"))
        );
        let overview = pairs(overview);
        assert!(overview.contains(&hint("q", "quit")), "{overview:?}");
        assert!(overview.contains(&hint("?", "help")), "{overview:?}");
        // Asked twice: the same hints (kept, not worked out again).
        assert!(std::ptr::eq(
            km.hints(ViewId::Overview, false),
            km.hints(ViewId::Overview, false)
        ));
        let help = pairs(km.hints(ViewId::Overview, true));
        assert!(!help.contains(&hint("q", "quit")), "{help:?}");
        // A user's keymap merged over the defaults: its hints, not the ones kept before.
        let user = Keymap::from_file(
            parse(
                "[[global]]\non = \"x\"\nrun = \"quit\"\nhint = \"leave\"\n\n[[global]]\non = \"q\"\nrun = \"noop\"\n\n[[global]]\non = \"1\"\nrun = \"noop\"\n\n[[global]]\non = \"0\"\nrun = \"view overview\"\n",
                "keymap.toml",
            )
            .unwrap(),
        );
        assert_eq!(km.view_key(ViewId::Overview), Some(k("1")));
        let merged = km.clone().merged(user);
        let hints = pairs(merged.hints(ViewId::Overview, false));
        assert!(hints.contains(&hint("x", "leave")), "{hints:?}");
        assert!(!hints.iter().any(|h| h.0 == "q"), "{hints:?}");
        assert_eq!(
            merged.lookup(ViewId::Overview, false, k("x")),
            Some(Action::Quit)
        );
        assert_eq!(merged.view_key(ViewId::Overview), Some(k("0")));
        assert_eq!(merged.view_key(ViewId::Detail), Some(k("2")));
    }

    #[test]
    fn bad_files_report_line_and_column() {
        let e =
            from_user_text("[[global]]\non = \"q\"\nrun = \"explode\"\n", "km.toml").unwrap_err();
        let s = e.to_string();
        assert!(
            s.starts_with("km.toml: line 3, column 7: unknown action \"explode\""),
            "{s}"
        );
        let e = from_user_text(
            "[[global]]\non = \"<Hyper-q>\"\nrun = \"quit\"\n",
            "km.toml",
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("line 2, column 6: unknown key \"<Hyper-q>\""),
            "{e}"
        );
        let e = from_user_text("[[globl]]\non = \"q\"\nrun = \"quit\"\n", "km.toml").unwrap_err();
        assert!(
            e.to_string()
                .contains("line 1, column 3: unknown field `globl`"),
            "{e}"
        );
        let e = from_user_text(
            "[[global]]\non = \"q\"\nrun = \"quit\"\nwhen = 1\n",
            "km.toml",
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("line 4, column 1: unknown field `when`"),
            "{e}"
        );
    }

    #[test]
    fn load_falls_back_to_defaults() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path()), (Keymap::defaults(), None));
        std::fs::write(dir.path().join("keymap.toml"), "[[global]\n").unwrap();
        let (km, err) = load(dir.path());
        assert_eq!(km, Keymap::defaults());
        assert!(err.unwrap().to_string().contains("keymap.toml: line 1"));
    }
}
