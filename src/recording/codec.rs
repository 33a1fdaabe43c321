//! The records inside a recording's zstd stream, and the delta encoding of state.
//!
//! A record is `kind` (one byte), the time since the record before in milliseconds (a zigzag
//! varint), the payload's length (a varint, at most [`MAX_PAYLOAD`]) and the payload. A reader
//! skips a kind it does not know, so a later gpupilot may add kinds without a new format.
//!
//! Every record but the two above is a value (a snapshot, the run list, the control status, an
//! event, a run's new reports, a trainer's state) in its JSON form, taken apart into its
//! leaves: a path (`gpus`, 3, `power_w`) and a scalar. Each path is declared once, in a
//! [`kind::PATH`] record, and named by its number after that. A state record holds the leaves
//! that changed since the last record of the same kind, and the paths that went away; the
//! reader keeps the leaves and puts the value together again. (Floats travel as their bits, so
//! a value reads back exactly, which JSON text would not promise.) Integers are written as the
//! difference from the path's last integer (energy counters, memory bytes: a few bytes), floats
//! as their bits XOR the path's last float, big-endian (same sign and exponent: leading zero
//! bytes).

use serde_json::{Map, Number, Value};
use std::collections::{BTreeMap, HashMap};

/// Record kinds.
pub mod kind {
    /// A file closed cleanly ends with this (no payload).
    pub const END: u8 = 0;
    /// A path's declaration: its segments as a JSON array (strings and indices).
    pub const PATH: u8 = 1;
    pub const SNAPSHOT: u8 = 2;
    pub const RUNS: u8 = 3;
    pub const CONTROL: u8 = 4;
    /// A node event.
    pub const EVENT: u8 = 5;
    /// `{"run": …, "points": […]}`.
    pub const METRICS: u8 = 6;
    /// `{"run": …, "trainer": {…}}`.
    pub const TRAINER: u8 = 7;
}

/// The longest payload a reader accepts: far above a snapshot of many GPUs; a longer one is
/// damage.
pub const MAX_PAYLOAD: usize = 16 << 20;

/// The most paths a reader keeps: far above what a node's state has; more is damage.
pub const MAX_PATHS: usize = 1 << 20;

/// One step of a path.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Seg {
    Key(String),
    Index(u32),
}

/// A scalar at the end of a path (an empty array or object is one too).
#[derive(Debug, Clone, PartialEq)]
pub enum Leaf {
    Null,
    Bool(bool),
    Int(i64),
    /// An integer above `i64::MAX`.
    Big(u64),
    Float(f64),
    Str(String),
    EmptyArray,
    EmptyObject,
}

impl Leaf {
    fn of(v: &Value) -> Leaf {
        match v {
            Value::Null => Leaf::Null,
            Value::Bool(b) => Leaf::Bool(*b),
            Value::Number(n) => match (n.as_i64(), n.as_u64()) {
                (Some(i), _) => Leaf::Int(i),
                (None, Some(u)) => Leaf::Big(u),
                _ => Leaf::Float(n.as_f64().unwrap_or(0.0)),
            },
            Value::String(s) => Leaf::Str(s.clone()),
            Value::Array(_) => Leaf::EmptyArray,
            Value::Object(_) => Leaf::EmptyObject,
        }
    }

    fn value(&self) -> Value {
        match self {
            Leaf::Null => Value::Null,
            Leaf::Bool(b) => Value::Bool(*b),
            Leaf::Int(i) => Value::from(*i),
            Leaf::Big(u) => Value::from(*u),
            Leaf::Float(f) => Number::from_f64(*f).map_or(Value::Null, Value::Number),
            Leaf::Str(s) => Value::String(s.clone()),
            Leaf::EmptyArray => Value::Array(Vec::new()),
            Leaf::EmptyObject => Value::Object(Map::new()),
        }
    }

    /// The same leaf, bit for bit (a float that did not change is not written again).
    fn same(&self, other: &Leaf) -> bool {
        match (self, other) {
            (Leaf::Float(a), Leaf::Float(b)) => a.to_bits() == b.to_bits(),
            (a, b) => a == b,
        }
    }
}

/// Every leaf of `v` with its path, depth first.
pub fn leaves(v: &Value) -> Vec<(Vec<Seg>, Leaf)> {
    fn walk(v: &Value, path: &mut Vec<Seg>, out: &mut Vec<(Vec<Seg>, Leaf)>) {
        match v {
            Value::Array(a) if !a.is_empty() => {
                for (i, x) in a.iter().enumerate() {
                    path.push(Seg::Index(i as u32));
                    walk(x, path, out);
                    path.pop();
                }
            }
            Value::Object(o) if !o.is_empty() => {
                for (k, x) in o {
                    path.push(Seg::Key(k.clone()));
                    walk(x, path, out);
                    path.pop();
                }
            }
            leaf => out.push((path.clone(), Leaf::of(leaf))),
        }
    }
    let mut out = Vec::new();
    walk(v, &mut Vec::new(), &mut out);
    out
}

/// Writes varints and the leaves' delta encoding.
#[derive(Debug, Default)]
pub struct StateEncoder {
    /// The paths declared so far.
    ids: HashMap<Vec<Seg>, u32>,
    /// Per state kind, the leaves of its last record, by path.
    last: HashMap<u8, HashMap<u32, Leaf>>,
    /// Per path, the last integer and float bits written (shared by all kinds: paths are).
    ints: HashMap<u32, i64>,
    floats: HashMap<u32, u64>,
}

/// Reads what [`StateEncoder`] wrote.
#[derive(Debug, Default)]
pub struct StateDecoder {
    paths: Vec<Vec<Seg>>,
    current: HashMap<u8, BTreeMap<u32, Leaf>>,
    ints: HashMap<u32, i64>,
    floats: HashMap<u32, u64>,
}

/// A record body out of a state encoder: path declarations to write first, then the record.
pub struct Encoded {
    pub paths: Vec<Vec<u8>>,
    pub record: Vec<u8>,
}

impl StateEncoder {
    /// The delta of `value` against the last state of `kind`.
    pub fn encode(&mut self, kind: u8, value: &Value) -> Encoded {
        let mut paths = Vec::new();
        let mut changed = Vec::new();
        let mut now = HashMap::new();
        for (path, leaf) in leaves(value) {
            let id = match self.ids.get(&path) {
                Some(id) => *id,
                None => {
                    let id = self.ids.len() as u32;
                    let segs: Vec<Value> = path
                        .iter()
                        .map(|s| match s {
                            Seg::Key(k) => Value::String(k.clone()),
                            Seg::Index(i) => Value::from(*i),
                        })
                        .collect();
                    paths.push(serde_json::to_vec(&segs).unwrap_or_default());
                    self.ids.insert(path, id);
                    id
                }
            };
            let last = self.last.get(&kind).and_then(|m| m.get(&id));
            if last.is_none_or(|l| !l.same(&leaf)) {
                changed.push((id, leaf.clone()));
            }
            now.insert(id, leaf);
        }
        let mut gone: Vec<u32> = self
            .last
            .get(&kind)
            .map(|m| {
                m.keys()
                    .filter(|id| !now.contains_key(id))
                    .copied()
                    .collect()
            })
            .unwrap_or_default();
        gone.sort_unstable();
        changed.sort_by_key(|(id, _)| *id);
        let mut out = Vec::new();
        put_varint(&mut out, changed.len() as u64);
        for (id, leaf) in &changed {
            put_varint(&mut out, u64::from(*id));
            self.put_leaf(&mut out, *id, leaf);
        }
        put_varint(&mut out, gone.len() as u64);
        for id in gone {
            put_varint(&mut out, u64::from(id));
        }
        self.last.insert(kind, now);
        Encoded { paths, record: out }
    }

    fn put_leaf(&mut self, out: &mut Vec<u8>, id: u32, leaf: &Leaf) {
        match leaf {
            Leaf::Null => out.push(0),
            Leaf::Bool(false) => out.push(1),
            Leaf::Bool(true) => out.push(2),
            Leaf::Int(i) => {
                out.push(3);
                let last = self.ints.insert(id, *i).unwrap_or(0);
                put_varint(out, zigzag(i.wrapping_sub(last)));
            }
            Leaf::Big(u) => {
                out.push(4);
                put_varint(out, *u);
            }
            Leaf::Float(f) => {
                out.push(5);
                let bits = f.to_bits();
                let last = self.floats.insert(id, bits).unwrap_or(0);
                out.extend_from_slice(&(bits ^ last).to_be_bytes());
            }
            Leaf::Str(s) => {
                out.push(6);
                put_varint(out, s.len() as u64);
                out.extend_from_slice(s.as_bytes());
            }
            Leaf::EmptyArray => out.push(7),
            Leaf::EmptyObject => out.push(8),
        }
    }
}

impl StateDecoder {
    /// Take in a path declaration.
    pub fn declare(&mut self, payload: &[u8]) -> Result<(), String> {
        if self.paths.len() >= MAX_PATHS {
            return Err(format!("more than {MAX_PATHS} paths"));
        }
        let segs: Vec<Value> =
            serde_json::from_slice(payload).map_err(|e| format!("a path declaration: {e}"))?;
        let path = segs
            .into_iter()
            .map(|s| match s {
                Value::String(k) => Ok(Seg::Key(k)),
                Value::Number(n) => n
                    .as_u64()
                    .and_then(|i| u32::try_from(i).ok())
                    .map(Seg::Index)
                    .ok_or_else(|| "a path index out of range".to_string()),
                _ => Err("a path segment that is neither a key nor an index".to_string()),
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.paths.push(path);
        Ok(())
    }

    /// Apply a state record of `kind`; the whole state after it.
    pub fn decode(&mut self, kind: u8, payload: &[u8]) -> Result<Value, String> {
        let mut r = Bytes(payload);
        let state = self.current.entry(kind).or_default();
        let n = r.varint()?;
        for _ in 0..n {
            let id = r.id(self.paths.len())?;
            let leaf = match r.byte()? {
                0 => Leaf::Null,
                1 => Leaf::Bool(false),
                2 => Leaf::Bool(true),
                3 => {
                    let d = unzigzag(r.varint()?);
                    let last = self.ints.get(&id).copied().unwrap_or(0);
                    let v = last.wrapping_add(d);
                    self.ints.insert(id, v);
                    Leaf::Int(v)
                }
                4 => Leaf::Big(r.varint()?),
                5 => {
                    let x = u64::from_be_bytes(r.array()?);
                    let bits = x ^ self.floats.get(&id).copied().unwrap_or(0);
                    self.floats.insert(id, bits);
                    Leaf::Float(f64::from_bits(bits))
                }
                6 => {
                    let len = r.varint()? as usize;
                    let s = r.take(len)?;
                    Leaf::Str(String::from_utf8(s.to_vec()).map_err(|_| "a string not in UTF-8")?)
                }
                7 => Leaf::EmptyArray,
                8 => Leaf::EmptyObject,
                t => return Err(format!("a leaf of unknown type {t}")),
            };
            state.insert(id, leaf);
        }
        let gone = r.varint()?;
        for _ in 0..gone {
            let id = r.id(self.paths.len())?;
            state.remove(&id);
        }
        if !r.0.is_empty() {
            return Err("bytes left over after a state record".into());
        }
        let paths = &self.paths;
        build(
            state
                .iter()
                .map(|(id, leaf)| (paths[*id as usize].as_slice(), leaf)),
        )
        .ok_or_else(|| "paths that contradict each other".to_string())
    }
}

/// The value made of these leaves; `None` when a path runs through a leaf or mixes keys and
/// indices at one level.
pub fn build<'a>(leaves: impl Iterator<Item = (&'a [Seg], &'a Leaf)>) -> Option<Value> {
    /// A value under construction: a node whose children are still coming, or a leaf.
    enum Node {
        Empty,
        Obj(BTreeMap<String, Node>),
        Arr(Vec<Node>),
        Leaf(Value),
    }
    fn finish(n: Node) -> Value {
        match n {
            Node::Empty => Value::Null,
            Node::Obj(m) => Value::Object(m.into_iter().map(|(k, v)| (k, finish(v))).collect()),
            Node::Arr(a) => Value::Array(a.into_iter().map(finish).collect()),
            Node::Leaf(v) => v,
        }
    }
    let mut root = Node::Empty;
    for (path, leaf) in leaves {
        let mut at = &mut root;
        for seg in path {
            if let Node::Empty = at {
                *at = match seg {
                    Seg::Key(_) => Node::Obj(BTreeMap::new()),
                    Seg::Index(_) => Node::Arr(Vec::new()),
                };
            }
            at = match (seg, at) {
                (Seg::Key(k), Node::Obj(m)) => m.entry(k.clone()).or_insert(Node::Empty),
                (Seg::Index(i), Node::Arr(a)) => {
                    let i = *i as usize;
                    if i >= MAX_PATHS {
                        return None;
                    }
                    if a.len() <= i {
                        a.resize_with(i + 1, || Node::Empty);
                    }
                    &mut a[i]
                }
                _ => return None,
            };
        }
        if !matches!(at, Node::Empty) {
            return None;
        }
        *at = Node::Leaf(leaf.value());
    }
    Some(finish(root))
}

/// LEB128, as protobuf writes it.
pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

pub fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// A cursor over a payload; every read is bounded by what is left.
pub struct Bytes<'a>(pub &'a [u8]);

impl<'a> Bytes<'a> {
    pub fn byte(&mut self) -> Result<u8, String> {
        let (b, rest) = self.0.split_first().ok_or("a record ends early")?;
        self.0 = rest;
        Ok(*b)
    }

    pub fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("a number longer than 64 bits".into())
    }

    fn id(&mut self, declared: usize) -> Result<u32, String> {
        let id = self.varint()?;
        if id >= declared as u64 {
            return Err(format!("path {id} used before it was declared"));
        }
        Ok(id as u32)
    }

    pub fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.0.len() {
            return Err("a record ends early".into());
        }
        let (a, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(a)
    }

    fn array(&mut self) -> Result<[u8; 8], String> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(a)
    }
}
