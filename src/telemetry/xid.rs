//! XID errors: what the NVIDIA driver reports when a GPU, its memory, its link or an
//! application on it fails, by number. [`explain`] gives each number its name, what it means
//! and what to do, after NVIDIA's XID catalog ("XID Errors", docs.nvidia.com/deploy/xid-errors);
//! a number not in the catalog below is said to be unknown, never guessed at.
//!
//! The events themselves come from NVML's event set (`nvml_events`); this module only holds
//! the catalog and the event type every view shares.

use serde::{Deserialize, Serialize};

/// Recent XIDs kept per GPU (a ring: the oldest goes first).
pub const XID_RING: usize = 16;

/// How long an XID stays "recent": `doctor` calls it a problem and its alert stays raised
/// this long after the GPU last reported it.
pub const XID_RECENT_S: f64 = 3600.0;

/// One XID a GPU reported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct XidEvent {
    /// The XID number (NVML's event data; 999 is NVML's "unknown XID").
    pub xid: u64,
    /// When the event was received, seconds since the epoch.
    pub time_s: f64,
    /// The catalog's name for it ("GPU has fallen off the bus").
    pub name: String,
}

impl XidEvent {
    /// An event for `xid` received at `time_s`, named from the catalog.
    pub fn new(xid: u64, time_s: f64) -> XidEvent {
        XidEvent {
            xid,
            time_s,
            name: explain(xid).name.to_string(),
        }
    }
}

/// Who usually causes an XID, which decides how loud gpupilot is about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Blame {
    /// Usually the application (a bad kernel, an illegal address): a warning, not a GPU fault.
    Application,
    /// The driver or its firmware.
    Driver,
    /// The GPU, its memory, its link or its board: drain, reset, or replace.
    Hardware,
    /// Not in the catalog.
    Unknown,
}

/// What the catalog says about one XID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XidInfo {
    pub xid: u64,
    pub name: &'static str,
    /// What it means, in a sentence.
    pub meaning: &'static str,
    /// What to do.
    pub action: &'static str,
    pub blame: Blame,
}

impl XidInfo {
    /// `XID 79 (GPU has fallen off the bus)`.
    pub fn title(&self) -> String {
        format!("XID {} ({})", self.xid, self.name)
    }
}

/// (xid, name, meaning, action, blame), after NVIDIA's XID catalog.
const CATALOG: &[(u64, &str, &str, &str, Blame)] = &[
    (
        13,
        "Graphics Engine Exception",
        "a kernel faulted on the GPU (out-of-range access, illegal instruction)",
        "usually the application: run it under compute-sanitizer; if different programs hit it, check the GPU",
        Blame::Application,
    ),
    (
        31,
        "GPU memory page fault",
        "a kernel touched GPU memory it does not own (an illegal address)",
        "usually the application: check its indexing (compute-sanitizer); rarely a driver bug",
        Blame::Application,
    ),
    (
        32,
        "Invalid or corrupted push buffer stream",
        "the driver's command stream to the GPU arrived corrupted",
        "check the PCIe link (replays, degraded width) and system memory; update the driver if it repeats",
        Blame::Hardware,
    ),
    (
        38,
        "Driver firmware error",
        "the driver's firmware reported an error",
        "reset the GPU when it is free; update the driver if it repeats",
        Blame::Driver,
    ),
    (
        43,
        "GPU stopped processing",
        "a context faulted and was stopped; other applications go on",
        "usually the application (look at the XID before it); nothing to do on the GPU unless it repeats",
        Blame::Application,
    ),
    (
        45,
        "Preemptive cleanup, due to previous errors",
        "the driver ended a context after an earlier error, or a process was killed while on the GPU",
        "look at the XID that came before it; alone it needs no action",
        Blame::Application,
    ),
    (
        48,
        "Double Bit ECC Error",
        "GPU memory returned an uncorrectable (double-bit) error",
        "drain the GPU and reset it; replace it if it happens again",
        Blame::Hardware,
    ),
    (
        61,
        "Internal micro-controller breakpoint/warning",
        "the GPU's internal micro-controller hit a breakpoint or warning",
        "reset the GPU when it is free; report it to NVIDIA if it repeats",
        Blame::Driver,
    ),
    (
        62,
        "Internal micro-controller halt",
        "the GPU's internal micro-controller halted",
        "reset the GPU (or reboot); update the driver; replace the GPU if it repeats",
        Blame::Hardware,
    ),
    (
        63,
        "ECC page retirement or row remapping recording event",
        "a memory page was retired or a row remapped after ECC errors",
        "reset the GPU when it is free so the remap takes effect",
        Blame::Hardware,
    ),
    (
        64,
        "ECC page retirement or row remapper recording failure",
        "retiring a page or remapping a row failed to be recorded",
        "drain the GPU and have it inspected; replace it if it repeats",
        Blame::Hardware,
    ),
    (
        68,
        "NVDEC0 Exception",
        "the video decoder engine faulted",
        "usually the application or the driver: restart the application; update the driver",
        Blame::Driver,
    ),
    (
        69,
        "Graphics Engine class error",
        "the graphics engine received an invalid command class",
        "usually the application or the driver: restart the application; update the driver",
        Blame::Driver,
    ),
    (
        74,
        "NVLink Error",
        "an NVLink connection reported an error",
        "check the NVLink bridges/cables and the link state; reset the GPUs on the link",
        Blame::Hardware,
    ),
    (
        79,
        "GPU has fallen off the bus",
        "the GPU no longer answers on PCIe",
        "reset the GPU or reboot the node; check its power, cooling and seating if it repeats",
        Blame::Hardware,
    ),
    (
        92,
        "High single-bit ECC error rate",
        "GPU memory corrects single-bit errors at a high rate",
        "watch the remapped rows; reset the GPU when it is free; replace it if the rate stays high",
        Blame::Hardware,
    ),
    (
        94,
        "Contained ECC error",
        "an uncorrectable memory error hit one application, which was stopped; the others go on",
        "restart the application; reset the GPU when it is free so the row is remapped",
        Blame::Hardware,
    ),
    (
        95,
        "Uncontained ECC error",
        "an uncorrectable memory error could not be contained: every application on the GPU is affected",
        "drain the GPU and reset it; replace it if it happens again",
        Blame::Hardware,
    ),
    (
        109,
        "Context Switch Timeout Error",
        "the GPU did not switch contexts in time",
        "usually the application or the driver; reset the GPU if it repeats",
        Blame::Driver,
    ),
    (
        119,
        "GSP RPC Timeout",
        "the GPU System Processor firmware did not answer the driver in time",
        "reset the GPU (or reboot); update the driver; report it to NVIDIA if it repeats",
        Blame::Driver,
    ),
    (
        120,
        "GSP Error",
        "the GPU System Processor firmware reported an error",
        "reset the GPU (or reboot); update the driver",
        Blame::Driver,
    ),
    (
        140,
        "Unrecovered ECC Error",
        "the GPU found an unrecoverable memory error at start",
        "drain the GPU and reset it; replace it if it happens again",
        Blame::Hardware,
    ),
];

/// The catalog's entry for `xid`, or an honest "unknown XID N".
pub fn explain(xid: u64) -> XidInfo {
    match CATALOG.iter().find(|e| e.0 == xid) {
        Some(&(xid, name, meaning, action, blame)) => XidInfo {
            xid,
            name,
            meaning,
            action,
            blame,
        },
        None => XidInfo {
            xid,
            name: "unknown XID",
            meaning: "not in gpupilot's XID catalog",
            action: "look it up in NVIDIA's XID catalog (docs.nvidia.com/deploy/xid-errors) and the kernel log (`dmesg | grep Xid`)",
            blame: Blame::Unknown,
        },
    }
}

/// Every XID the catalog knows, ascending.
pub fn known() -> impl Iterator<Item = u64> {
    CATALOG.iter().map(|e| e.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_catalog_covers_the_xids_operators_meet() {
        for xid in [
            13, 31, 32, 38, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 119, 120,
        ] {
            let info = explain(xid);
            assert_eq!(info.xid, xid);
            assert_ne!(info.blame, Blame::Unknown, "XID {xid} is in the catalog");
            assert!(!info.action.is_empty() && !info.meaning.is_empty());
        }
        let ids: Vec<u64> = known().collect();
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(ids, sorted, "ascending, no duplicates");
    }

    #[test]
    fn known_xids_say_what_to_do() {
        assert_eq!(explain(79).name, "GPU has fallen off the bus");
        assert!(explain(79).action.contains("reset the GPU or reboot"));
        assert!(explain(48).action.starts_with("drain the GPU and reset"));
        assert_eq!(explain(13).blame, Blame::Application);
        assert_eq!(explain(95).blame, Blame::Hardware);
        assert_eq!(explain(79).title(), "XID 79 (GPU has fallen off the bus)");
        assert_eq!(XidEvent::new(94, 1.0).name, "Contained ECC error");
    }

    #[test]
    fn an_unknown_xid_is_said_to_be_unknown() {
        let info = explain(4242);
        assert_eq!(info.xid, 4242);
        assert_eq!(info.blame, Blame::Unknown);
        assert_eq!(info.title(), "XID 4242 (unknown XID)");
        assert!(info.action.contains("docs.nvidia.com/deploy/xid-errors"));
    }
}
