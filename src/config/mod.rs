//! Configuration: where gpupilot keeps its files, and (with the console) themes and keymaps.

pub mod paths;

pub use paths::Paths;
