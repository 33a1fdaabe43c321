//! The views. Each has its own state type (where it needs one) and a borrowed view struct
//! that implements `Widget`: render reads the app and changes nothing.

pub mod advisor;
pub mod detail;
pub mod events;
pub mod help;
pub mod overview;
pub mod power_dialog;
pub mod run;
