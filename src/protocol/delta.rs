//! Snapshot pushes as changes (`subscribe` with `"delta": true`).
//!
//! A snapshot of eight GPUs is some 12 KB of JSON, and from one second to the next most of it
//! is the same: names, UUIDs, bus ids, rated limits and clocks, PCIe widths, ECC counts, the
//! node's topology. A connection that asks for deltas gets the first snapshot whole and then
//! `telemetry_delta` pushes that carry, per GPU, only the fields whose value changed (a field
//! that became absent is sent as `null`), the host sample and the node only when they changed,
//! and the time of the snapshot they apply to:
//!
//! ```text
//! {"type":"telemetry_delta","base":1796011675.9,"snapshot":{"time_s":1796011676.9,
//!  "gpus":[{"index":0,"time_s":1796011676.8,"power_w":612.4,"util_gpu_pct":97.0}]}}
//! ```
//!
//! The daemon computes each delta against the snapshot it last wrote to that connection (a
//! slow reader that skips snapshots gets its next delta against the one it has), and sends a
//! whole snapshot again every [`KEYFRAME_EVERY`] pushes and whenever the GPUs themselves
//! changed (one more, one fewer, another order). [`SnapshotStream`] turns the pushes of one
//! connection back into whole snapshots. On the busy 8×H100 node a delta is about 1.6 KB against
//! 10.3 KB whole: what a console reads, and both sides encode and decode, every second, on the
//! node and over an SSH link.

use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Deserializer, Serialize, Serializer};

use super::{FrameError, Response, ServerFrame};
use crate::telemetry::{GpuSample, Snapshot};

/// A connection that gets deltas gets a whole snapshot at least this often (in pushes), so a
/// reader that lost its base for any reason is whole again within a minute at 1 Hz.
pub const KEYFRAME_EVERY: u32 = 60;

/// The tag a delta push starts with (the daemon writes the tag first).
const DELTA_PREFIX: &str = r#"{"type":"telemetry_delta","#;

/// Every field of [`GpuSample`] but `index` (which names the GPU a change is for), as the
/// delta writes and reads it. `every_field_of_a_sample_is_carried` fails when a field is added
/// to the sample and not here.
macro_rules! gpu_fields {
    ($($f:ident),* $(,)?) => {
        #[cfg(test)]
        const GPU_FIELDS: &[&str] = &[$(stringify!($f)),*];

        /// Each field of `cur` that differs from `base`, into `map`.
        fn write_changed<M: SerializeMap>(
            base: &GpuSample,
            cur: &GpuSample,
            map: &mut M,
        ) -> Result<(), M::Error> {
            $(
                if base.$f != cur.$f {
                    map.serialize_entry(stringify!($f), &cur.$f)?;
                }
            )*
            Ok(())
        }

        /// Read the value of field `key` into `g`; false for a key no field has (a newer
        /// daemon's), whose value is left unread.
        fn read_field<'de, A: MapAccess<'de>>(
            g: &mut GpuSample,
            key: &str,
            map: &mut A,
        ) -> Result<bool, A::Error> {
            match key {
                $(stringify!($f) => g.$f = map.next_value()?,)*
                _ => return Ok(false),
            }
            Ok(true)
        }
    };
}

gpu_fields!(
    name,
    uuid,
    pci_bus_id,
    lost,
    stale,
    time_s,
    util_gpu_pct,
    util_mem_pct,
    memory_used_bytes,
    memory_total_bytes,
    temperature_c,
    temp_slowdown_c,
    temp_shutdown_c,
    temp_gpu_max_c,
    power_w,
    power_limit_w,
    power_enforced_w,
    power_default_w,
    power_min_w,
    power_max_w,
    energy_j,
    sm_clock_mhz,
    sm_clock_max_mhz,
    mem_clock_mhz,
    mem_clock_max_mhz,
    fan_pct,
    pstate,
    throttle_reasons,
    pcie_rx_kbps,
    pcie_tx_kbps,
    pcie_gen,
    pcie_width,
    pcie_gen_max,
    pcie_width_max,
    pcie_replays,
    ecc_corrected,
    ecc_uncorrected,
    ecc_corrected_total,
    ecc_uncorrected_total,
    remapped_rows,
    retired_pages,
    memory_temp_c,
    memory_reserved_bytes,
    enc_util_pct,
    dec_util_pct,
    persistence,
    mig,
    processes,
    xids,
    xid_since_s,
    xid_count,
    nvlink,
);

/// Whether `cur` can be sent as changes to `base`: the same GPUs in the same order.
fn same_gpus(base: &Snapshot, cur: &Snapshot) -> bool {
    base.gpus.len() == cur.gpus.len()
        && base
            .gpus
            .iter()
            .zip(&cur.gpus)
            .all(|(a, b)| a.index == b.index)
}

/// The push frame (with its newline) that turns `base` into `cur`; None when the GPUs are not
/// the same ones (send `cur` whole).
pub fn encode_delta(base: &Snapshot, cur: &Snapshot) -> Option<String> {
    if !same_gpus(base, cur) {
        return None;
    }
    let mut out = Vec::with_capacity(4096);
    let frame = DeltaFrame { base, cur };
    frame
        .serialize(&mut serde_json::Serializer::new(&mut out))
        .ok()?;
    out.push(b'\n');
    String::from_utf8(out).ok()
}

struct DeltaFrame<'a> {
    base: &'a Snapshot,
    cur: &'a Snapshot,
}

impl Serialize for DeltaFrame<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(3))?;
        m.serialize_entry("type", "telemetry_delta")?;
        m.serialize_entry("base", &self.base.time_s)?;
        m.serialize_entry("snapshot", &SnapshotChanges(self))?;
        m.end()
    }
}

struct SnapshotChanges<'a>(&'a DeltaFrame<'a>);

impl Serialize for SnapshotChanges<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let DeltaFrame { base, cur } = self.0;
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("time_s", &cur.time_s)?;
        if base.node != cur.node {
            m.serialize_entry("node", &cur.node)?;
        }
        if base.host != cur.host {
            m.serialize_entry("host", &cur.host)?;
        }
        m.serialize_entry("gpus", &GpuChanges(self.0))?;
        m.end()
    }
}

struct GpuChanges<'a>(&'a DeltaFrame<'a>);

impl Serialize for GpuChanges<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let DeltaFrame { base, cur } = self.0;
        let mut seq = s.serialize_seq(None)?;
        for (b, c) in base.gpus.iter().zip(&cur.gpus) {
            if b != c {
                seq.serialize_element(&GpuChange { base: b, cur: c })?;
            }
        }
        seq.end()
    }
}

struct GpuChange<'a> {
    base: &'a GpuSample,
    cur: &'a GpuSample,
}

impl Serialize for GpuChange<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("index", &self.cur.index)?;
        write_changed(self.base, self.cur, &mut m)?;
        m.end()
    }
}

/// The pushes of one connection, read back into whole snapshots: it keeps the last snapshot
/// so that the next delta has its base.
#[derive(Debug, Default)]
pub struct SnapshotStream {
    last: Option<Box<Snapshot>>,
}

impl SnapshotStream {
    /// [`super::decode_server_frame`], with `telemetry_delta` pushes applied to the last
    /// snapshot and returned as `telemetry` pushes of the whole snapshot. A delta whose base is
    /// not the last snapshot (none came yet, or another one) is an error; the next whole
    /// snapshot (at most [`KEYFRAME_EVERY`] pushes later) mends it.
    pub fn decode(&mut self, line: &str, max: usize) -> Result<ServerFrame, FrameError> {
        let text = line.strip_suffix('\n').unwrap_or(line);
        if text.len() > max {
            return Err(FrameError::TooLong { max });
        }
        if text.starts_with(DELTA_PREFIX) {
            let snapshot = self.apply(text)?;
            return Ok(ServerFrame {
                id: None,
                response: Response::Telemetry { snapshot },
            });
        }
        let frame = super::decode_server_frame(text, max)?;
        if let Response::Telemetry { snapshot } = &frame.response {
            self.last = Some(snapshot.clone());
        }
        Ok(frame)
    }

    /// Apply `text` (a delta push) to the last snapshot, in place, and return a copy of it.
    /// Whatever fails forgets the last snapshot (it may be half changed): the next whole one
    /// is the next base.
    fn apply(&mut self, text: &str) -> Result<Box<Snapshot>, FrameError> {
        let mut de = serde_json::Deserializer::from_str(text);
        let mut verdict = None;
        let applied = de
            .deserialize_map(DeltaVisitor {
                last: self.last.as_deref_mut(),
                verdict: &mut verdict,
            })
            .and_then(|()| de.end());
        match (applied, verdict) {
            (Ok(()), _) => self.last.clone().ok_or(FrameError::Delta(NO_BASE)),
            (Err(e), why) => {
                self.last = None;
                Err(why.map_or(FrameError::Json(e), FrameError::Delta))
            }
        }
    }
}

const NO_BASE: &str = "a delta came before any whole snapshot";
const WRONG_BASE: &str = "a delta for a snapshot this connection did not get";

/// A delta frame applied to `last` once its `base` is checked against it (the daemon writes
/// `base` before `snapshot`). A base that is not `last` is said in `verdict`.
struct DeltaVisitor<'a> {
    last: Option<&'a mut Snapshot>,
    verdict: &'a mut Option<&'static str>,
}

impl<'de> Visitor<'de> for DeltaVisitor<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a telemetry_delta push")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut base = None;
        let mut tagged = false;
        let mut last = self.last;
        while let Some(key) = map.next_key::<&str>()? {
            match key {
                "type" => {
                    let tag: &str = map.next_value()?;
                    if tag != "telemetry_delta" {
                        return Err(de::Error::custom("not a telemetry_delta push"));
                    }
                    tagged = true;
                }
                "base" => base = Some(map.next_value::<f64>()?),
                "snapshot" => {
                    let Some(base) = base else {
                        return Err(de::Error::custom("a delta's base must come before it"));
                    };
                    let Some(last) = last.as_deref_mut() else {
                        *self.verdict = Some(NO_BASE);
                        return Err(de::Error::custom(NO_BASE));
                    };
                    // Exact: the daemon writes the base's own time; JSON numbers round-trip.
                    if base != last.time_s {
                        *self.verdict = Some(WRONG_BASE);
                        return Err(de::Error::custom(WRONG_BASE));
                    }
                    map.next_value_seed(SnapshotPatch(last))?;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        if !tagged {
            return Err(de::Error::missing_field("type"));
        }
        if base.is_none() {
            return Err(de::Error::missing_field("base"));
        }
        Ok(())
    }
}

/// Changes to a snapshot: `time_s`, and `node`, `host` and `gpus` where present.
struct SnapshotPatch<'a>(&'a mut Snapshot);

impl<'de> DeserializeSeed<'de> for SnapshotPatch<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for SnapshotPatch<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a snapshot's changes")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<&str>()? {
            match key {
                "time_s" => self.0.time_s = map.next_value()?,
                "node" => self.0.node = map.next_value()?,
                "host" => self.0.host = map.next_value()?,
                "gpus" => map.next_value_seed(GpusPatch(&mut self.0.gpus))?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

/// Changes to some of the GPUs, each naming its GPU by `index` first.
struct GpusPatch<'a>(&'a mut [GpuSample]);

impl<'de> DeserializeSeed<'de> for GpusPatch<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for GpusPatch<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of GPU changes")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(GpuPatch(&mut *self.0))?.is_some() {}
        Ok(())
    }
}

/// One GPU's changes: `index` first, then the fields that changed.
struct GpuPatch<'a>(&'a mut [GpuSample]);

impl<'de> DeserializeSeed<'de> for GpuPatch<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for GpuPatch<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a GPU's changes, its index first")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        if map.next_key::<&str>()? != Some("index") {
            return Err(de::Error::custom(
                "a GPU's changes must name its index first",
            ));
        }
        let index: u32 = map.next_value()?;
        let Some(gpu) = self.0.iter_mut().find(|g| g.index == index) else {
            return Err(de::Error::custom(format_args!(
                "changes for GPU {index}, which the snapshot does not have"
            )));
        };
        while let Some(key) = map.next_key::<&str>()? {
            if !read_field(gpu, key, &mut map)? {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{MAX_REPLY_FRAME, encode};
    use crate::telemetry::{
        GpuProcess, HostSample, NodeInfo, RemappedRows, RetiredPages, mig::MigState,
        nvlink::NvLinkSample,
    };

    fn full_push(s: &Snapshot) -> String {
        encode(&ServerFrame {
            id: None,
            response: Response::Telemetry {
                snapshot: Box::new(s.clone()),
            },
        })
    }

    fn gpu(index: u32, t: f64, power: f64) -> GpuSample {
        GpuSample {
            index,
            name: Some("NVIDIA H100 80GB HBM3".into()),
            uuid: Some(format!("GPU-{index:08x}")),
            pci_bus_id: Some(format!("00000000:{:02X}:00.0", 0x18 + index)),
            time_s: t,
            util_gpu_pct: Some(97.0),
            memory_used_bytes: Some(32 << 30),
            memory_total_bytes: Some(80 << 30),
            temperature_c: Some(61.0),
            power_w: Some(power),
            power_limit_w: Some(700.0),
            sm_clock_mhz: Some(1980),
            processes: Some(vec![GpuProcess {
                pid: 4200 + index,
                name: Some("python3".into()),
                used_memory_bytes: Some(32 << 30),
                owner: None,
            }]),
            ..GpuSample::default()
        }
    }

    fn snapshot(t: f64, power: f64) -> Snapshot {
        Snapshot {
            time_s: t,
            node: NodeInfo {
                hostname: "gpu-node-07".into(),
                source: "nvml".into(),
                driver_version: Some("580.65.06".into()),
                ..NodeInfo::default()
            },
            gpus: (0..4)
                .map(|i| gpu(i, t - 0.1, power + f64::from(i)))
                .collect(),
            host: Some(HostSample {
                cpu_pct: Some(12.5),
                cpu_count: Some(64),
                ..HostSample::default()
            }),
        }
    }

    /// Each push of `snaps` (the first whole, the rest as deltas) read back by one stream.
    fn round_trip(snaps: &[Snapshot]) -> Vec<Snapshot> {
        let mut stream = SnapshotStream::default();
        let mut out = Vec::new();
        let mut prev: Option<&Snapshot> = None;
        for s in snaps {
            let line = match prev {
                Some(p) => encode_delta(p, s).unwrap_or_else(|| full_push(s)),
                None => full_push(s),
            };
            match stream.decode(&line, MAX_REPLY_FRAME).unwrap().response {
                Response::Telemetry { snapshot } => out.push(*snapshot),
                other => panic!("not a snapshot: {other:?}"),
            }
            prev = Some(s);
        }
        out
    }

    #[test]
    fn every_field_of_a_sample_is_carried() {
        // Every optional field set, so the whole sample's keys are all written.
        let g = GpuSample {
            retired_pages: Some(RetiredPages::default()),
            mig: Some(MigState::default()),
            nvlink: Some(NvLinkSample::default()),
            ..gpu(0, 1.0, 500.0)
        };
        let value = serde_json::to_value(&g).unwrap();
        let mut keys: Vec<&str> = value
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .filter(|k| *k != "index")
            .collect();
        keys.sort_unstable();
        let mut fields = GPU_FIELDS.to_vec();
        fields.sort_unstable();
        assert_eq!(keys, fields);
    }

    #[test]
    fn deltas_rebuild_every_snapshot_exactly() {
        let mut snaps = vec![snapshot(100.0, 600.0)];
        // Figures that move, a field that goes absent and comes back, the host and the node
        // changing, a process leaving, the ECC counts and remapped rows appearing.
        let mut s = snapshot(101.0, 612.5);
        s.gpus[1].temperature_c = None;
        s.gpus[2].processes = Some(Vec::new());
        snaps.push(s);
        let mut s = snapshot(102.0, 598.25);
        s.gpus[3].ecc_corrected = Some(3);
        s.gpus[3].remapped_rows = Some(RemappedRows {
            correctable: 1,
            ..RemappedRows::default()
        });
        s.gpus[0].retired_pages = Some(RetiredPages::default());
        s.host = None;
        snaps.push(s);
        let mut s = snapshot(103.0, 598.25);
        s.node.driver_version = Some("580.82.07".into());
        s.gpus[0].lost = true;
        s.gpus[0].power_w = None;
        snaps.push(s);
        // Nothing changed but the time.
        let mut s = snaps[3].clone();
        s.time_s = 104.0;
        snaps.push(s);
        assert_eq!(round_trip(&snaps), snaps);
    }

    #[test]
    fn a_delta_carries_only_what_changed() {
        let a = snapshot(100.0, 600.0);
        let mut b = a.clone();
        b.time_s = 101.0;
        b.gpus[2].power_w = Some(611.0);
        b.gpus[2].time_s = 100.9;
        let line = encode_delta(&a, &b).unwrap();
        assert_eq!(
            line,
            "{\"type\":\"telemetry_delta\",\"base\":100.0,\"snapshot\":{\"time_s\":101.0,\
             \"gpus\":[{\"index\":2,\"time_s\":100.9,\"power_w\":611.0}]}}\n"
        );
        assert!(line.len() * 10 < full_push(&b).len());
    }

    #[test]
    fn other_gpus_are_sent_whole() {
        let a = snapshot(100.0, 600.0);
        let mut fewer = snapshot(101.0, 600.0);
        fewer.gpus.pop();
        assert_eq!(encode_delta(&a, &fewer), None);
        let mut reordered = snapshot(101.0, 600.0);
        reordered.gpus.swap(0, 1);
        assert_eq!(encode_delta(&a, &reordered), None);
        // Read back whole, then deltas apply to it.
        let mut after = fewer.clone();
        after.time_s = 102.0;
        after.gpus[0].power_w = Some(1.0);
        let snaps = [a, fewer, after];
        assert_eq!(round_trip(&snaps), snaps);
    }

    #[test]
    fn a_delta_without_its_base_is_an_error_until_a_whole_snapshot() {
        let a = snapshot(100.0, 600.0);
        let b = snapshot(101.0, 610.0);
        let c = snapshot(102.0, 620.0);
        let mut stream = SnapshotStream::default();
        let ab = encode_delta(&a, &b).unwrap();
        let bc = encode_delta(&b, &c).unwrap();
        let e = stream.decode(&ab, MAX_REPLY_FRAME).unwrap_err();
        assert!(e.to_string().contains("before any whole snapshot"), "{e}");
        stream.decode(&full_push(&a), MAX_REPLY_FRAME).unwrap();
        // A delta against b, which this connection never got.
        let e = stream.decode(&bc, MAX_REPLY_FRAME).unwrap_err();
        assert!(e.to_string().contains("did not get"), "{e}");
        // The base is forgotten: the next delta fails too, the next whole snapshot mends it.
        assert!(stream.decode(&ab, MAX_REPLY_FRAME).is_err());
        stream.decode(&full_push(&b), MAX_REPLY_FRAME).unwrap();
        match stream.decode(&bc, MAX_REPLY_FRAME).unwrap().response {
            Response::Telemetry { snapshot } => assert_eq!(*snapshot, c),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bad_deltas_are_refused_and_the_stream_goes_on() {
        let a = snapshot(100.0, 600.0);
        let mut stream = SnapshotStream::default();
        for bad in [
            // Not JSON, a GPU the snapshot lacks, the index not first, a value of the wrong
            // type, no base, too long.
            "{\"type\":\"telemetry_delta\",\"base\":100.0,\"snapshot\":{\"gpus\":[{",
            "{\"type\":\"telemetry_delta\",\"base\":100.0,\"snapshot\":{\"gpus\":[{\"index\":9}]}}",
            "{\"type\":\"telemetry_delta\",\"base\":100.0,\"snapshot\":{\"gpus\":[{\"power_w\":1.0,\"index\":0}]}}",
            "{\"type\":\"telemetry_delta\",\"base\":100.0,\"snapshot\":{\"gpus\":[{\"index\":0,\"power_w\":\"x\"}]}}",
            "{\"type\":\"telemetry_delta\",\"snapshot\":{\"time_s\":101.0}}",
        ] {
            stream.decode(&full_push(&a), MAX_REPLY_FRAME).unwrap();
            assert!(stream.decode(bad, MAX_REPLY_FRAME).is_err(), "{bad}");
        }
        let long = format!(
            "{{\"type\":\"telemetry_delta\",\"base\":100.0,\"pad\":\"{}\"}}",
            "x".repeat(100)
        );
        assert!(matches!(
            stream.decode(&long, 64),
            Err(FrameError::TooLong { max: 64 })
        ));
        // A delta that failed may have been half applied: the base is forgotten until the
        // next whole snapshot.
        let mut good = a.clone();
        good.time_s = 101.0;
        let good = encode_delta(&a, &good).unwrap();
        let e = stream.decode(&good, MAX_REPLY_FRAME).unwrap_err();
        assert!(e.to_string().contains("before any whole snapshot"), "{e}");
        stream.decode(&full_push(&a), MAX_REPLY_FRAME).unwrap();
        // A field this build does not know (a newer daemon's) is skipped.
        let mut b = a.clone();
        b.time_s = 101.0;
        b.gpus[0].power_w = Some(1.5);
        let newer = "{\"type\":\"telemetry_delta\",\"base\":100.0,\"snapshot\":{\"time_s\":101.0,\
                     \"gpus\":[{\"index\":0,\"power_w\":1.5,\"sram_temp_c\":40.0}],\"extra\":1}}";
        match stream.decode(newer, MAX_REPLY_FRAME).unwrap().response {
            Response::Telemetry { snapshot } => assert_eq!(*snapshot, b),
            other => panic!("{other:?}"),
        }
        // Other frames pass through as before.
        let f = stream
            .decode("{\"type\":\"lagged\",\"missed\":3}\n", MAX_REPLY_FRAME)
            .unwrap();
        assert_eq!(f.response, Response::Lagged { missed: 3 });
    }
}
