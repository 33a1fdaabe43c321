//! The bytes a frame costs: a backend that says each change in as few as it can.
//!
//! ratatui's crossterm backend moves the cursor with an absolute `CSI row;col H` before every
//! cell that does not follow the last one, sets both colours in the 256-colour form
//! (`CSI 38;5;10;49m`) whenever either changes, and ends every frame by resetting colours and
//! attributes in three sequences. Over SSH on a slow link those bytes are the console's cost:
//! a sparkline that moves one column is a few dozen cells, each a move, a colour and a glyph.
//!
//! [`AnsiBackend`] writes the same cells with the shortest of the moves a terminal offers
//! (none, `CR`, `LF`, relative `CSI n C`/`D`/`A`/`B`, or absolute), only the colour or
//! attribute that changed, the 16 standard colours in their short forms (`CSI 92m` rather than
//! `CSI 38;5;10m`), and one `CSI m` at the end of a frame. Everything but `draw` is
//! crossterm's. It needs the terminal in raw mode (no output processing: `LF` moves down
//! without returning the carriage), which the console always is.

use std::io::{self, Write};

use ratatui::backend::{Backend, ClearType, CrosstermBackend, WindowSize};
use ratatui::buffer::Cell;
use ratatui::layout::{Position, Size};
use ratatui::style::{Color, Modifier};
use unicode_width::UnicodeWidthStr;

use super::tty::KnownSize;

/// A backend for a raw-mode terminal that writes each frame in as few bytes as it can (see
/// the module doc).
pub struct AnsiBackend<W: Write> {
    inner: CrosstermBackend<W>,
    /// The terminal's size as the console knows it: a cell printed in the last column leaves
    /// the cursor where only an absolute move is safe.
    size: KnownSize,
    /// Reused for each frame's bytes.
    out: Vec<u8>,
}

/// What the terminal's cursor and pen are, as far as this frame has set them.
#[derive(Debug, Clone, Copy)]
struct Pen {
    /// Where the cursor is, when known.
    at: Option<(u16, u16)>,
    fg: Color,
    bg: Color,
    modifier: Modifier,
}

impl<W: Write> AnsiBackend<W> {
    pub fn new(writer: W, size: KnownSize) -> AnsiBackend<W> {
        AnsiBackend {
            inner: CrosstermBackend::new(writer),
            size,
            out: Vec::with_capacity(16 << 10),
        }
    }
}

/// Encode `cells` (in any order; the console sends them in screen order) onto `out`, for a
/// terminal `width` columns wide (`None`: unknown), starting from an unknown cursor and the
/// default pen, and ending with the default pen.
pub fn encode<'a>(
    out: &mut Vec<u8>,
    width: Option<u16>,
    cells: impl Iterator<Item = (u16, u16, &'a Cell)>,
) {
    let mut pen = Pen {
        at: None,
        fg: Color::Reset,
        bg: Color::Reset,
        modifier: Modifier::empty(),
    };
    for (x, y, cell) in cells {
        move_to(out, pen.at, x, y);
        set_style(out, &mut pen, cell);
        let symbol = cell.symbol();
        out.extend_from_slice(symbol.as_bytes());
        let w = symbol_width(symbol);
        // A cell in the last column leaves the cursor waiting to wrap: only an absolute move
        // from there lands where it is meant to.
        let next = x.saturating_add(w);
        pen.at = match width {
            Some(width) if next < width => Some((next, y)),
            _ => None,
        };
    }
    if pen.fg != Color::Reset || pen.bg != Color::Reset || !pen.modifier.is_empty() {
        out.extend_from_slice(b"\x1b[m");
    }
}

/// Whether `c` takes one plain terminal column as a grapheme of its own: printable ASCII, and
/// the characters the console draws with (Latin-1 signs and letters but the soft hyphen,
/// dashes, quotes, bullet and ellipsis, arrows, box drawing, block elements, braille). None of
/// them joins its neighbours into a grapheme.
pub fn narrow_char(c: char) -> bool {
    matches!(
        c,
        ' '..='~'
            | '\u{A1}'..='\u{AC}'
            | '\u{AE}'..='\u{FF}'
            | '\u{2010}'..='\u{2027}'
            | '\u{2190}'..='\u{21FF}'
            | '\u{2500}'..='\u{259F}'
            | '\u{2800}'..='\u{28FF}'
    )
}

/// Columns a cell's symbol takes: 1 for a [`narrow_char`] (ASCII, and the signs, borders and
/// bars the console is made of) without asking Unicode, else what Unicode says, counted as at
/// least 1 (as ratatui's own backend does: it moves the cursor unless the cell is the one
/// right after the last).
fn symbol_width(symbol: &str) -> u16 {
    let mut chars = symbol.chars();
    match (chars.next(), chars.next()) {
        (Some(c), None) if c.is_ascii() || narrow_char(c) => 1,
        _ => symbol.width().clamp(1, 2) as u16,
    }
}

/// The shortest way from `from` to `(x, y)`: absolute, or vertically first (LF keeps the
/// column in raw mode; `CSI n B`/`A` likewise), then across from that column or from column 0
/// after a CR. Lengths are counted first, so only the move chosen is written.
fn move_to(out: &mut Vec<u8>, from: Option<(u16, u16)>, x: u16, y: u16) {
    let Some((cx, cy)) = from else {
        return absolute(out, x, y);
    };
    if (cx, cy) == (x, y) {
        return;
    }
    let down_by_lf = y > cy && y - cy <= 3;
    let vertical = if down_by_lf {
        usize::from(y - cy)
    } else if y != cy {
        csi_n_len(y.abs_diff(cy))
    } else {
        0
    };
    let across = |col: u16| {
        if x == col {
            0
        } else {
            csi_n_len(x.abs_diff(col))
        }
    };
    let (stay, via_cr) = (vertical + across(cx), vertical + 1 + across(0));
    let absolute_len = 4 + digits(u32::from(y) + 1) + digits(u32::from(x) + 1);
    if absolute_len <= stay.min(via_cr) {
        return absolute(out, x, y);
    }
    if down_by_lf {
        out.extend(std::iter::repeat_n(b'\n', usize::from(y - cy)));
    } else if y > cy {
        csi_n(out, y - cy, b'B');
    } else if y < cy {
        csi_n(out, cy - y, b'A');
    }
    let col = if via_cr < stay {
        out.push(b'\r');
        0
    } else {
        cx
    };
    if x > col {
        csi_n(out, x - col, b'C');
    } else if x < col {
        csi_n(out, col - x, b'D');
    }
}

/// The length of [`csi_n`]'s sequence for `n`.
fn csi_n_len(n: u16) -> usize {
    3 + if n == 1 { 0 } else { digits(u32::from(n)) }
}

fn digits(n: u32) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

/// `CSI row;col H`, 1-based.
fn absolute(out: &mut Vec<u8>, x: u16, y: u16) {
    out.extend_from_slice(b"\x1b[");
    push_num(out, u32::from(y) + 1);
    out.push(b';');
    push_num(out, u32::from(x) + 1);
    out.push(b'H');
}

/// `CSI n <c>`, with the 1 left out (it is the default).
fn csi_n(out: &mut Vec<u8>, n: u16, c: u8) {
    out.extend_from_slice(b"\x1b[");
    if n != 1 {
        push_num(out, u32::from(n));
    }
    out.push(c);
}

fn push_num(out: &mut Vec<u8>, n: u32) {
    let mut buf = [0u8; 10];
    let mut i = buf.len();
    let mut n = n;
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

/// One SGR sequence that takes the pen to `cell`'s style, or nothing when it is there.
fn set_style(out: &mut Vec<u8>, pen: &mut Pen, cell: &Cell) {
    if (pen.fg, pen.bg, pen.modifier) == (cell.fg, cell.bg, cell.modifier) {
        return;
    }
    out.extend_from_slice(b"\x1b[");
    let open = out.len();
    // Before each parameter but the first.
    let sep = |out: &mut Vec<u8>| {
        if out.len() > open {
            out.push(b';');
        }
    };
    let param = |out: &mut Vec<u8>, p: &[u8]| {
        sep(out);
        out.extend_from_slice(p);
    };
    let (mut fg, mut bg) = (pen.fg, pen.bg);
    let removed = pen.modifier - cell.modifier;
    let added = if removed.is_empty() {
        cell.modifier - pen.modifier
    } else {
        // Taking attributes off one by one has a code per attribute (and bold and dim share
        // one); a reset and the ones that stay is as short and cannot go wrong.
        param(out, b"0");
        fg = Color::Reset;
        bg = Color::Reset;
        cell.modifier
    };
    for (m, code) in MODIFIERS {
        if added.contains(m) {
            param(out, code);
        }
    }
    // Bold with one of the eight basic colours is drawn bright by some terminals only in the
    // short form: bold cells keep the 256-colour form.
    let bold = cell.modifier.contains(Modifier::BOLD);
    if cell.fg != fg {
        sep(out);
        colour(out, cell.fg, false, bold);
    }
    if cell.bg != bg {
        sep(out);
        colour(out, cell.bg, true, bold);
    }
    if out.len() > open {
        out.push(b'm');
    } else {
        out.truncate(open - 2);
    }
    pen.fg = cell.fg;
    pen.bg = cell.bg;
    pen.modifier = cell.modifier;
}

const MODIFIERS: [(Modifier, &[u8]); 9] = [
    (Modifier::BOLD, b"1"),
    (Modifier::DIM, b"2"),
    (Modifier::ITALIC, b"3"),
    (Modifier::UNDERLINED, b"4"),
    (Modifier::SLOW_BLINK, b"5"),
    (Modifier::RAPID_BLINK, b"6"),
    (Modifier::REVERSED, b"7"),
    (Modifier::HIDDEN, b"8"),
    (Modifier::CROSSED_OUT, b"9"),
];

/// The SGR parameters of a colour, foreground or background, onto `out`.
fn colour(out: &mut Vec<u8>, c: Color, background: bool, bold: bool) {
    let basic = match c {
        Color::Reset => {
            out.extend_from_slice(if background { b"49" } else { b"39" });
            return;
        }
        Color::Rgb(r, g, b) => {
            out.extend_from_slice(if background { b"48;2;" } else { b"38;2;" });
            for (i, v) in [r, g, b].into_iter().enumerate() {
                if i > 0 {
                    out.push(b';');
                }
                push_num(out, u32::from(v));
            }
            return;
        }
        named_or_indexed => u32::from(super::theme::ansi_index(named_or_indexed).unwrap_or(0)),
    };
    match basic {
        0..=7 if !bold => push_num(out, basic + if background { 40 } else { 30 }),
        8..=15 if !bold => push_num(out, basic - 8 + if background { 100 } else { 90 }),
        _ => {
            out.extend_from_slice(if background { b"48;5;" } else { b"38;5;" });
            push_num(out, basic);
        }
    }
}

impl<W: Write> Backend for AnsiBackend<W> {
    type Error = io::Error;

    fn draw<'a, I>(&mut self, content: I) -> io::Result<()>
    where
        I: Iterator<Item = (u16, u16, &'a Cell)>,
    {
        self.out.clear();
        encode(&mut self.out, self.size.get().map(|s| s.width), content);
        self.inner.write_all(&self.out)
    }

    fn append_lines(&mut self, n: u16) -> io::Result<()> {
        self.inner.append_lines(n)
    }

    fn hide_cursor(&mut self) -> io::Result<()> {
        self.inner.hide_cursor()
    }

    fn show_cursor(&mut self) -> io::Result<()> {
        self.inner.show_cursor()
    }

    fn get_cursor_position(&mut self) -> io::Result<Position> {
        self.inner.get_cursor_position()
    }

    fn set_cursor_position<P: Into<Position>>(&mut self, position: P) -> io::Result<()> {
        self.inner.set_cursor_position(position)
    }

    fn clear(&mut self) -> io::Result<()> {
        self.inner.clear()
    }

    fn clear_region(&mut self, clear_type: ClearType) -> io::Result<()> {
        self.inner.clear_region(clear_type)
    }

    fn size(&self) -> io::Result<Size> {
        self.inner.size()
    }

    fn window_size(&mut self) -> io::Result<WindowSize> {
        self.inner.window_size()
    }

    fn flush(&mut self) -> io::Result<()> {
        Backend::flush(&mut self.inner)
    }
}

#[cfg(test)]
mod tests;
