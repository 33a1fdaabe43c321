//! Configuration: where gpupilot keeps its files (and how it makes and opens them safely), and
//! (with the console) themes and keymaps.

pub mod keymap;
pub mod paths;
pub mod prometheus;
pub mod safe_fs;
pub mod theme;

pub use paths::Paths;
