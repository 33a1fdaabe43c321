//! Reading a run's log a chunk at a time, for `logs` and `logs -f` through the protocol.
//!
//! The protocol carries text (JSON strings), the files hold bytes. A chunk never ends inside a
//! UTF-8 character: the cut character is left for the next chunk, so a follower that
//! concatenates chunks gets the file's text exactly (bytes that are not UTF-8 at all become
//! U+FFFD).

use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

/// One piece of a log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub data: String,
    /// Where the next chunk starts (bytes).
    pub next_offset: u64,
    /// The file's size when read.
    pub size: u64,
}

/// Up to `max` bytes of `path` from `offset` (`max` 0 just reports the size; below 4 it is
/// raised to 4, so that a chunk can always hold a whole character). A missing file is an empty
/// log. `at_end` says nothing more will be written: then a character cut off at the very end
/// of the file is returned (as U+FFFD) rather than waited for.
pub fn read_chunk(path: &Path, offset: u64, max: u64, at_end: bool) -> io::Result<Chunk> {
    let max = if max == 0 { 0 } else { max.max(4) };
    // The run writes its logs itself: a link or a FIFO in their place is refused, not read.
    let mut f = match crate::config::safe_fs::open_regular(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Ok(Chunk {
                data: String::new(),
                next_offset: offset,
                size: 0,
            });
        }
        Err(e) => return Err(e),
    };
    let size = f.metadata()?.len();
    if offset >= size || max == 0 {
        return Ok(Chunk {
            data: String::new(),
            next_offset: offset,
            size,
        });
    }
    f.seek(SeekFrom::Start(offset))?;
    let want = max.min(size - offset);
    let mut buf = Vec::with_capacity(want as usize);
    f.take(want).read_to_end(&mut buf)?;
    let reached_end = offset + buf.len() as u64 >= size;
    let keep = if at_end && reached_end {
        buf.len()
    } else {
        utf8_cut(&buf)
    };
    buf.truncate(keep);
    Ok(Chunk {
        next_offset: offset + buf.len() as u64,
        data: String::from_utf8_lossy(&buf).into_owned(),
        size,
    })
}

/// How many leading bytes of `buf` to keep so that it does not end inside a UTF-8 character
/// (an incomplete sequence of 2–4 bytes at the end is left out).
pub fn utf8_cut(buf: &[u8]) -> usize {
    let len = buf.len();
    for back in 1..=len.min(3) {
        let b = buf[len - back];
        if b & 0xC0 == 0x80 {
            continue; // a continuation byte: look further back for the lead
        }
        let needed = match b {
            0xF0..=0xF7 => 4,
            0xE0..=0xEF => 3,
            0xC0..=0xDF => 2,
            _ => 1,
        };
        return if needed > back { len - back } else { len };
    }
    len
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_never_split_a_character() {
        let text = "a€b😀"; // 1 + 3 + 1 + 4 bytes
        let b = text.as_bytes();
        assert_eq!(utf8_cut(b), b.len());
        assert_eq!(utf8_cut(&b[..2]), 1, "inside €");
        assert_eq!(utf8_cut(&b[..3]), 1, "inside €");
        assert_eq!(utf8_cut(&b[..4]), 4);
        assert_eq!(utf8_cut(&b[..8]), 5, "inside the emoji");
        assert_eq!(
            utf8_cut(b"\xff\xfe"),
            2,
            "not UTF-8 at all: kept, shown as U+FFFD"
        );
        assert_eq!(utf8_cut(b""), 0);
    }

    #[test]
    fn chunks_concatenate_to_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("out.log");
        let text = "line 1 €\nline 2 😀\n".repeat(50);
        std::fs::write(&path, &text).unwrap();
        for max in [1, 2, 3, 5, 64, 10_000] {
            let mut got = String::new();
            let mut off = 0;
            loop {
                let c = read_chunk(&path, off, max, false).unwrap();
                assert_eq!(c.size, text.len() as u64);
                if off == c.size {
                    break;
                }
                assert!(c.next_offset > off, "progress at {off} with max {max}");
                got.push_str(&c.data);
                off = c.next_offset;
            }
            assert_eq!(got, text, "max {max}");
        }
        let missing = read_chunk(&tmp.path().join("none"), 0, 10, false).unwrap();
        assert_eq!((missing.size, missing.data.as_str()), (0, ""));
    }

    /// The run writes its logs itself: what it puts in their place is refused at once, never
    /// followed or waited on (a FIFO with no writer would hold a blocking open forever).
    #[test]
    fn a_link_or_fifo_in_a_logs_place_is_refused_at_once() {
        let tmp = tempfile::tempdir().unwrap();
        let link = tmp.path().join("stdout.log");
        std::os::unix::fs::symlink("/etc/hostname", &link).unwrap();
        let e = read_chunk(&link, 0, 100, false).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        let fifo = tmp.path().join("stderr.log");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let e = read_chunk(&fifo, 0, 100, false).unwrap_err();
        assert!(e.to_string().contains("FIFO"), "{e}");
    }

    #[test]
    fn a_cut_character_at_the_end_waits_unless_finished() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("out.log");
        std::fs::write(&path, b"ok\xe2\x82").unwrap(); // "ok" + 2 of €'s 3 bytes
        let c = read_chunk(&path, 0, 100, false).unwrap();
        assert_eq!((c.data.as_str(), c.next_offset), ("ok", 2));
        let c = read_chunk(&path, 0, 100, true).unwrap();
        assert_eq!((c.data.as_str(), c.next_offset), ("ok\u{FFFD}", 4));
    }
}
