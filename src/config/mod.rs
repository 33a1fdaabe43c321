//! Configuration: where gpupilot keeps its files, and (with the console) themes and keymaps.

pub mod keymap;
pub mod paths;
pub mod prometheus;
pub mod theme;

pub use paths::Paths;
