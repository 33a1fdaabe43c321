//! Recordings of a node (`gpupilot record`, `gpupilot replay`): the node's telemetry snapshots,
//! its runs, the watched runs' trainer metrics and knobs, the control loops and the node's
//! events, as they happened, in one compact file that the console plays back.
//!
//! The file, byte by byte:
//!
//! - a fixed preamble that never changes between format versions, so that any gpupilot can
//!   say what a file is: the magic [`MAGIC`], the format version (u16, little-endian) and the
//!   version of gpupilot that wrote it (a length byte, then UTF-8). A reader refuses a newer
//!   format with a message naming both versions ([`RecordingError::Newer`]);
//! - a JSON header (u32 length, little-endian, then the text; at most [`MAX_HEADER`]): the
//!   node, when the recording started;
//! - one zstd stream of records ([`codec`]), flushed at least every [`FLUSH_EVERY_S`]: a flush
//!   ends a zstd block, and a reader decodes every whole block, so a file cut off mid-write
//!   (the recorder killed, the disk full, the machine down) plays up to its last flush. The
//!   last record of a file closed cleanly is an end mark; a file without one was cut off,
//!   and the reader says so ([`Ending::CutOff`]).
//!
//! Records are delta-encoded: a snapshot is written as the leaves of its JSON form that changed
//! since the one before (a GPU's name, limits and thresholds once; its power and temperature as
//! the XOR of their bits with the last value, mostly zero bytes that zstd then squeezes), and so
//! are the run list, the control status, events, metrics reports and trainer states, each
//! against the last record of its kind.
//!
//! Layer: a reader of the domain and protocol types, beside `report`; it never talks to a
//! daemon (the recorder that does is `client::record`) and never draws (the replay is
//! `tui::feed::replay`).

pub mod codec;
mod read;
mod write;

pub use read::{Ending, Reader};
pub use write::Writer;

use crate::control::status::ControlStatus;
use crate::protocol::{MetricsPoint, NodeEventRecord, RunInfo, TrainerInfo};
use crate::telemetry::Snapshot;
use serde::{Deserialize, Serialize};

/// The first bytes of every recording (a high byte first, as PNG does, so that a file mangled
/// as text is not taken for one).
pub const MAGIC: &[u8; 8] = b"\x89GPUREC\n";

/// The format this gpupilot writes, and the newest it reads.
pub const FORMAT: u16 = 1;

/// The longest JSON header a reader accepts.
pub const MAX_HEADER: usize = 64 * 1024;

/// The writer ends a zstd block at least this often (seconds of recorded time): what a file
/// cut off mid-write loses at most.
pub const FLUSH_EVERY_S: f64 = 2.0;

/// A recording's file name suffix.
pub const EXTENSION: &str = "gprec";

/// What a recording says about itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    /// The node's host name.
    pub node: String,
    /// When the recording started, seconds since the epoch.
    pub started_s: f64,
    /// The daemon's samples per second.
    #[serde(default)]
    pub rate_hz: f64,
}

/// What a file's preamble says: its format and the gpupilot that wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub format: u16,
    pub version: String,
}

/// One thing that happened on the node.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    /// Every GPU and the host at one moment.
    Snapshot(Box<Snapshot>),
    /// Every run the daemon knows, oldest first.
    Runs(Vec<RunInfo>),
    /// The control loops (governors, budget, alerts, energy).
    Control(Box<ControlStatus>),
    /// A node event (knob changes, power caps, runs started and ended, …).
    Event(Box<NodeEventRecord>),
    /// New metrics reports of a run, oldest first.
    Metrics {
        run: String,
        points: Vec<MetricsPoint>,
    },
    /// Where a run's trainer and knobs stand (its newest report left out: that is the last
    /// of its metrics).
    Trainer {
        run: String,
        trainer: Box<TrainerInfo>,
    },
}

/// Why a recording cannot be read (or written).
#[derive(Debug, thiserror::Error)]
pub enum RecordingError {
    #[error("{path} is not a gpupilot recording (it does not start as one)")]
    NotARecording { path: String },
    #[error(
        "{path} was recorded by gpupilot {by} in recording format {format}; this gpupilot \
         ({ours}) reads formats up to {newest}: replay it with gpupilot {by} or newer"
    )]
    Newer {
        path: String,
        format: u16,
        by: String,
        newest: u16,
        ours: &'static str,
    },
    #[error("{path}: the recording's header is damaged ({why})")]
    BadHeader { path: String, why: String },
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("encoding a record: {0}")]
    Encode(String),
}

#[cfg(test)]
mod tests;
