//! Writing a recording: the preamble and header, then records into one zstd stream.

use super::codec::{StateEncoder, kind, put_varint, zigzag};
use super::{FLUSH_EVERY_S, FORMAT, Header, Item, MAGIC, RecordingError};
use serde_json::json;
use std::io::Write;

/// zstd's level: 3 is its default, fast enough to keep up with any node at a fraction of a
/// core, and higher levels gain little on data the delta encoding has already thinned.
const LEVEL: i32 = 3;

/// Writes records as they come. Memory is bounded: the encoder's state (one value per path)
/// and zstd's window; nothing else is held.
pub struct Writer<W: Write> {
    zstd: zstd::stream::write::Encoder<'static, W>,
    state: StateEncoder,
    /// The time of the last record, milliseconds since the epoch.
    last_ms: i64,
    /// The recorded time of the last flush.
    flushed_s: Option<f64>,
    /// Records written.
    pub records: u64,
}

impl<W: Write> Writer<W> {
    /// Write the preamble and `header` to `out`, and start the stream of records.
    pub fn new(mut out: W, header: &Header) -> Result<Writer<W>, RecordingError> {
        let version = env!("CARGO_PKG_VERSION");
        let head = serde_json::to_vec(header).map_err(|e| RecordingError::Encode(e.to_string()))?;
        let mut pre = Vec::with_capacity(64 + head.len());
        pre.extend_from_slice(MAGIC);
        pre.extend_from_slice(&FORMAT.to_le_bytes());
        pre.push(version.len() as u8);
        pre.extend_from_slice(version.as_bytes());
        pre.extend_from_slice(&(head.len() as u32).to_le_bytes());
        pre.extend_from_slice(&head);
        out.write_all(&pre)?;
        // Each flush ends a block that a reader can decode on its own terms.
        let zstd = zstd::stream::write::Encoder::new(out, LEVEL)?;
        Ok(Writer {
            zstd,
            state: StateEncoder::default(),
            last_ms: (header.started_s * 1000.0) as i64,
            flushed_s: None,
            records: 0,
        })
    }

    /// Write what happened at `time_s` (seconds since the epoch). Flushes when
    /// [`FLUSH_EVERY_S`] of recorded time passed since the last flush.
    pub fn write(&mut self, time_s: f64, item: &Item) -> Result<(), RecordingError> {
        match item {
            Item::Snapshot(s) => self.state(kind::SNAPSHOT, time_s, &to_value(s)?)?,
            Item::Runs(r) => self.state(kind::RUNS, time_s, &to_value(r)?)?,
            Item::Control(c) => self.state(kind::CONTROL, time_s, &to_value(c)?)?,
            Item::Event(e) => self.state(kind::EVENT, time_s, &to_value(e)?)?,
            Item::Metrics { run, points } => {
                let v = to_value(&json!({"run": run, "points": points}))?;
                self.state(kind::METRICS, time_s, &v)?
            }
            Item::Trainer { run, trainer } => {
                let v = to_value(&json!({"run": run, "trainer": trainer}))?;
                self.state(kind::TRAINER, time_s, &v)?
            }
        }
        self.records += 1;
        match self.flushed_s {
            Some(t) if time_s - t < FLUSH_EVERY_S => {}
            _ => {
                self.flush()?;
                self.flushed_s = Some(time_s);
            }
        }
        Ok(())
    }

    /// End the current zstd block and hand it to the file: everything written so far is then
    /// readable, even if nothing more ever is.
    pub fn flush(&mut self) -> Result<(), RecordingError> {
        self.zstd.flush()?;
        Ok(())
    }

    /// The file underneath (what the flushes handed down so far).
    pub fn get_ref(&self) -> &W {
        self.zstd.get_ref()
    }

    /// Write the end mark and close the stream; the file underneath, flushed.
    pub fn finish(mut self, time_s: f64) -> Result<W, RecordingError> {
        self.record(kind::END, time_s, &[])?;
        let mut out = self.zstd.finish()?;
        out.flush()?;
        Ok(out)
    }

    fn state(&mut self, k: u8, time_s: f64, v: &serde_json::Value) -> Result<(), RecordingError> {
        let e = self.state.encode(k, v);
        for p in &e.paths {
            self.record(kind::PATH, time_s, p)?;
        }
        self.record(k, time_s, &e.record)
    }

    fn record(&mut self, k: u8, time_s: f64, body: &[u8]) -> Result<(), RecordingError> {
        let ms = (time_s * 1000.0).round() as i64;
        let mut head = Vec::with_capacity(16);
        head.push(k);
        put_varint(&mut head, zigzag(ms.wrapping_sub(self.last_ms)));
        put_varint(&mut head, body.len() as u64);
        self.last_ms = ms;
        self.zstd.write_all(&head)?;
        self.zstd.write_all(body)?;
        Ok(())
    }
}

fn to_value(v: &impl serde::Serialize) -> Result<serde_json::Value, RecordingError> {
    serde_json::to_value(v).map_err(|e| RecordingError::Encode(e.to_string()))
}
