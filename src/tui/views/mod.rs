//! The views. Each has its own state type (where it needs one) and a borrowed view struct
//! that implements `Widget`: render reads its state and a narrow [`Ctx`] (the data, the theme,
//! the keymap), never the whole `App`, and changes nothing.

pub mod advisor;
pub mod bench;
pub mod detail;
pub mod events;
pub mod help;
pub mod mig;
pub mod overview;
pub mod power_dialog;
pub mod run;
pub mod topology;

use super::data::Data;
use super::keymap::Keymap;
use super::theme::Theme;

/// What a view may read besides its own state: the data every view draws from, the theme, and
/// the keymap (for the keys a view names).
#[derive(Debug, Clone, Copy)]
pub struct Ctx<'a> {
    pub data: &'a Data,
    pub theme: &'a Theme,
    pub keymap: &'a Keymap,
}
