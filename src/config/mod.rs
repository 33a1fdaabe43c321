//! Configuration: where gpupilot keeps its files (and how it makes and opens them safely), and
//! which colour theme to use. The console's keymap and what a theme is live with the console
//! (`tui::keymap`, `tui::theme`): configuration imports nothing above it.

pub mod paths;
pub mod prometheus;
pub mod safe_fs;
pub mod theme;

pub use paths::Paths;
