//! Reading a recording back, record by record; a file cut off mid-write reads up to its last
//! whole block and says where and why it ends.

use super::codec::{Bytes, MAX_PAYLOAD, StateDecoder, kind, unzigzag};
use super::{FORMAT, Header, Item, MAGIC, MAX_HEADER, Origin, RecordingError};
use crate::control::status::ControlStatus;
use crate::protocol::{MetricsPoint, NodeEventRecord, RunInfo, TrainerInfo};
use serde::Deserialize;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

/// How a recording ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// With its end mark: the recorder closed it.
    Complete,
    /// Without: the file was cut off (the recorder killed, the disk full) or damaged after
    /// this point; `why` says what the reader met.
    CutOff { why: String },
}

type Stream<R> = BufReader<zstd::stream::read::Decoder<'static, BufReader<R>>>;

/// Reads a recording's records in order. See the module doc of `recording`.
pub struct Reader<R: Read> {
    origin: Origin,
    header: Header,
    stream: Stream<R>,
    state: StateDecoder,
    last_ms: i64,
    ending: Option<Ending>,
}

impl Reader<std::fs::File> {
    /// Open the recording at `path`.
    pub fn open(path: &Path) -> Result<Reader<std::fs::File>, RecordingError> {
        let f = std::fs::File::open(path).map_err(|e| {
            std::io::Error::new(e.kind(), format!("opening {}: {e}", path.display()))
        })?;
        Reader::new(f, &path.display().to_string())
    }
}

impl<R: Read> Reader<R> {
    /// Read the preamble and header from `r`; `name` names it in errors.
    pub fn new(r: R, name: &str) -> Result<Reader<R>, RecordingError> {
        let mut r = BufReader::new(r);
        let not = || RecordingError::NotARecording { path: name.into() };
        let bad = |why: &str| RecordingError::BadHeader {
            path: name.into(),
            why: why.into(),
        };
        let mut magic = [0u8; 8];
        if read_full(&mut r, &mut magic)? < magic.len() || &magic != MAGIC {
            return Err(not());
        }
        let mut fixed = [0u8; 3];
        if read_full(&mut r, &mut fixed)? < fixed.len() {
            return Err(bad("it ends inside the preamble"));
        }
        let format = u16::from_le_bytes([fixed[0], fixed[1]]);
        let mut version = vec![0u8; usize::from(fixed[2])];
        if read_full(&mut r, &mut version)? < version.len() {
            return Err(bad("it ends inside the preamble"));
        }
        let origin = Origin {
            format,
            version: String::from_utf8_lossy(&version).into_owned(),
        };
        if format > FORMAT {
            return Err(RecordingError::Newer {
                path: name.into(),
                format,
                by: origin.version,
                newest: FORMAT,
                ours: env!("CARGO_PKG_VERSION"),
            });
        }
        if format == 0 {
            return Err(bad("format 0 does not exist"));
        }
        let mut len = [0u8; 4];
        if read_full(&mut r, &mut len)? < len.len() {
            return Err(bad("it ends before its header"));
        }
        let len = u32::from_le_bytes(len) as usize;
        if len > MAX_HEADER {
            return Err(bad(&format!("a header of {len} bytes")));
        }
        let mut head = vec![0u8; len];
        if read_full(&mut r, &mut head)? < len {
            return Err(bad("it ends inside its header"));
        }
        let header: Header = serde_json::from_slice(&head).map_err(|e| bad(&e.to_string()))?;
        let last_ms = (header.started_s * 1000.0) as i64;
        let zstd = zstd::stream::read::Decoder::with_buffer(r)?;
        Ok(Reader {
            origin,
            header,
            stream: BufReader::with_capacity(64 << 10, zstd),
            state: StateDecoder::default(),
            last_ms,
            ending: None,
        })
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The format of the file and the gpupilot that wrote it.
    pub fn origin(&self) -> &Origin {
        &self.origin
    }

    /// How the recording ended, once [`Reader::next_item`] returned `None`.
    pub fn ending(&self) -> Option<&Ending> {
        self.ending.as_ref()
    }

    /// The time of the last record read, seconds since the epoch.
    pub fn last_s(&self) -> f64 {
        self.last_ms as f64 / 1000.0
    }

    /// The next item and its time (seconds since the epoch); `None` at the end, whatever it
    /// was (see [`Reader::ending`]).
    pub fn next_item(&mut self) -> Option<(f64, Item)> {
        if self.ending.is_some() {
            return None;
        }
        match self.read_item() {
            Ok(Some(x)) => Some(x),
            Ok(None) => {
                self.ending = Some(Ending::Complete);
                None
            }
            Err(why) => {
                self.ending = Some(Ending::CutOff { why });
                None
            }
        }
    }

    fn read_item(&mut self) -> Result<Option<(f64, Item)>, String> {
        loop {
            let Some((k, body)) = self.record()? else {
                return Err("the file ends without the end mark of a finished recording".into());
            };
            let t = self.last_s();
            let item = match k {
                kind::END => return Ok(None),
                kind::PATH => {
                    self.state.declare(&body)?;
                    continue;
                }
                kind::SNAPSHOT => Item::Snapshot(Box::new(self.state_of(k, &body)?)),
                kind::RUNS => Item::Runs(self.state_of::<Vec<RunInfo>>(k, &body)?),
                kind::CONTROL => Item::Control(Box::new(self.state_of::<ControlStatus>(k, &body)?)),
                kind::EVENT => Item::Event(Box::new(self.state_of::<NodeEventRecord>(k, &body)?)),
                kind::METRICS => {
                    #[derive(Deserialize)]
                    struct M {
                        run: String,
                        points: Vec<MetricsPoint>,
                    }
                    let m: M = self.state_of(k, &body)?;
                    Item::Metrics {
                        run: m.run,
                        points: m.points,
                    }
                }
                kind::TRAINER => {
                    #[derive(Deserialize)]
                    struct T {
                        run: String,
                        trainer: Box<TrainerInfo>,
                    }
                    let t: T = self.state_of(k, &body)?;
                    Item::Trainer {
                        run: t.run,
                        trainer: t.trainer,
                    }
                }
                // A kind a later gpupilot added: skipped.
                _ => continue,
            };
            return Ok(Some((t, item)));
        }
    }

    fn state_of<T: serde::de::DeserializeOwned>(
        &mut self,
        k: u8,
        body: &[u8],
    ) -> Result<T, String> {
        let v = self.state.decode(k, body)?;
        serde_json::from_value(v).map_err(|e| format!("a state record: {e}"))
    }

    /// The next record's kind and payload; `None` at the end of the stream.
    fn record(&mut self) -> Result<Option<(u8, Vec<u8>)>, String> {
        let k = match self.stream.fill_buf() {
            Ok([]) => return Ok(None),
            Ok(b) => b[0],
            Err(e) => {
                return Err(format!(
                    "the file ends without the end mark of a finished recording ({e})"
                ));
            }
        };
        self.stream.consume(1);
        let mut head = Vec::with_capacity(20);
        // Two varints: the time step and the length.
        for _ in 0..2 {
            loop {
                let b = self.byte()?;
                head.push(b);
                if b & 0x80 == 0 {
                    break;
                }
                if head.len() > 20 {
                    return Err("a record's head is damaged".into());
                }
            }
        }
        let mut h = Bytes(&head);
        let step = unzigzag(h.varint()?);
        let len = h.varint()?;
        if len > MAX_PAYLOAD as u64 {
            return Err(format!("a record of {len} bytes (damaged)"));
        }
        let mut body = vec![0u8; len as usize];
        self.stream
            .read_exact(&mut body)
            .map_err(|e| format!("a record is cut off: {e}"))?;
        self.last_ms = self.last_ms.wrapping_add(step);
        Ok(Some((k, body)))
    }

    fn byte(&mut self) -> Result<u8, String> {
        let mut b = [0u8; 1];
        self.stream
            .read_exact(&mut b)
            .map_err(|e| format!("a record is cut off: {e}"))?;
        Ok(b[0])
    }
}

/// Read until `buf` is full or the input ends; how much was read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}
