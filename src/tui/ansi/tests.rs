use super::*;
use proptest::prelude::*;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Style;

/// What a terminal shows after `bytes` (vt100 as the terminal).
fn terminal(w: u16, h: u16) -> vt100::Parser {
    vt100::Parser::new(h, w, 0)
}

fn vt_colour(c: Color) -> vt100::Color {
    match c {
        Color::Reset => vt100::Color::Default,
        Color::Black => vt100::Color::Idx(0),
        Color::Red => vt100::Color::Idx(1),
        Color::Green => vt100::Color::Idx(2),
        Color::Yellow => vt100::Color::Idx(3),
        Color::Blue => vt100::Color::Idx(4),
        Color::Magenta => vt100::Color::Idx(5),
        Color::Cyan => vt100::Color::Idx(6),
        Color::Gray => vt100::Color::Idx(7),
        Color::DarkGray => vt100::Color::Idx(8),
        Color::LightRed => vt100::Color::Idx(9),
        Color::LightGreen => vt100::Color::Idx(10),
        Color::LightYellow => vt100::Color::Idx(11),
        Color::LightBlue => vt100::Color::Idx(12),
        Color::LightMagenta => vt100::Color::Idx(13),
        Color::LightCyan => vt100::Color::Idx(14),
        Color::White => vt100::Color::Idx(15),
        Color::Indexed(i) => vt100::Color::Idx(i),
        Color::Rgb(r, g, b) => vt100::Color::Rgb(r, g, b),
    }
}

/// Every cell of `buf` is on the terminal, glyph, colours and the attributes vt100 keeps.
fn assert_shows(vt: &vt100::Parser, buf: &Buffer) {
    let screen = vt.screen();
    for y in 0..buf.area.height {
        for x in 0..buf.area.width {
            let want = &buf[(x, y)];
            let got = screen.cell(y, x).expect("on screen");
            // The column a wide glyph on its left takes.
            if got.is_wide_continuation() {
                continue;
            }
            let shown = if got.contents().is_empty() {
                " "
            } else {
                got.contents()
            };
            assert_eq!(shown, want.symbol(), "glyph at ({x}, {y})");
            assert_eq!(got.fgcolor(), vt_colour(want.fg), "fg at ({x}, {y})");
            assert_eq!(got.bgcolor(), vt_colour(want.bg), "bg at ({x}, {y})");
            let m = want.modifier;
            assert_eq!(got.bold(), m.contains(Modifier::BOLD), "bold at ({x}, {y})");
            assert_eq!(got.dim(), m.contains(Modifier::DIM), "dim at ({x}, {y})");
            assert_eq!(
                got.italic(),
                m.contains(Modifier::ITALIC),
                "italic at ({x}, {y})"
            );
            assert_eq!(
                got.underline(),
                m.contains(Modifier::UNDERLINED),
                "underline at ({x}, {y})"
            );
            assert_eq!(
                got.inverse(),
                m.contains(Modifier::REVERSED),
                "reversed at ({x}, {y})"
            );
        }
    }
}

const COLOURS: [Color; 9] = [
    Color::Reset,
    Color::Red,
    Color::Gray,
    Color::DarkGray,
    Color::LightGreen,
    Color::White,
    Color::Indexed(10),
    Color::Indexed(208),
    Color::Rgb(1, 200, 30),
];
const MODS: [Modifier; 5] = [
    Modifier::empty(),
    Modifier::BOLD,
    Modifier::DIM,
    Modifier::REVERSED,
    Modifier::BOLD.union(Modifier::UNDERLINED),
];
const GLYPHS: [&str; 8] = [" ", "a", "7", "▁", "▇", "─", "│", "%"];

/// A cell's look from four small numbers.
fn look(g: usize, fg: usize, bg: usize, m: usize) -> (String, Style) {
    let style = Style::new()
        .fg(COLOURS[fg % COLOURS.len()])
        .bg(COLOURS[bg % COLOURS.len()])
        .add_modifier(MODS[m % MODS.len()]);
    (GLYPHS[g % GLYPHS.len()].to_string(), style)
}

fn paint(buf: &mut Buffer, x: u16, y: u16, (glyph, style): (String, Style)) {
    buf[(x, y)].reset();
    buf[(x, y)].set_symbol(&glyph).set_style(style);
}

/// The bytes for the changes from `was` to `next`, through `encode`.
fn frame(was: &Buffer, next: &Buffer) -> Vec<u8> {
    let mut out = Vec::new();
    encode(&mut out, Some(next.area.width), was.diff(next).into_iter());
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Frame after frame of random changes: the terminal always shows the last buffer.
    #[test]
    fn the_terminal_shows_every_frame_exactly(
        frames in proptest::collection::vec(
            proptest::collection::vec((0u16..40, 0u16..12, 0usize..8, 0usize..9, 0usize..9, 0usize..5), 0..80),
            1..6,
        ),
    ) {
        let area = Rect::new(0, 0, 40, 12);
        let mut vt = terminal(40, 12);
        let mut shown = Buffer::empty(area);
        for changes in frames {
            let mut next = shown.clone();
            for (x, y, g, fg, bg, m) in changes {
                paint(&mut next, x, y, look(g, fg, bg, m));
            }
            vt.process(&frame(&shown, &next));
            assert_shows(&vt, &next);
            shown = next;
        }
    }
}

#[test]
fn wide_glyphs_and_the_last_column_keep_the_cursor_where_it_is_thought_to_be() {
    let area = Rect::new(0, 0, 10, 3);
    let mut vt = terminal(10, 3);
    let blank = Buffer::empty(area);
    let mut next = blank.clone();
    next.set_string(0, 0, "ab漢字cd", Style::new().fg(Color::LightRed));
    next.set_string(9, 0, "z", Style::new());
    next.set_string(9, 1, "y", Style::new());
    next.set_string(0, 2, "x", Style::new().bg(Color::Blue));
    next.set_string(2, 2, "w", Style::new());
    vt.process(&frame(&blank, &next));
    assert_shows(&vt, &next);
}

#[test]
fn moves_are_the_shortest_and_colours_the_short_forms() {
    let area = Rect::new(0, 0, 80, 10);
    let was = Buffer::empty(area);
    let mut next = was.clone();
    let green = Style::new().fg(Color::LightGreen);
    next.set_string(10, 2, "▁▂", green);
    next.set_string(14, 2, "▃", green); // two columns on: CSI 2 C
    next.set_string(15, 3, "▄", green); // the next row, one column on from the cursor: LF
    next.set_string(2, 4, "9", Style::new()); // LF CR CSI 2 C ties with CSI 5;3 H: absolute
    let bytes = frame(&was, &next);
    let text = String::from_utf8(bytes).unwrap();
    assert_eq!(text, "\x1b[3;11H\x1b[92m▁▂\x1b[2C▃\n▄\x1b[5;3H\x1b[39m9");
    let mut vt = terminal(80, 10);
    vt.process(text.as_bytes());
    assert_shows(&vt, &next);
}

/// A sparkline that moves on by a column, as the console's do each second: every cell of it
/// changes. Against ratatui's crossterm backend, on the same cells.
#[test]
fn a_moving_sparkline_costs_fewer_bytes_than_through_crossterm() {
    let area = Rect::new(0, 0, 200, 50);
    let bars = ["▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"];
    let draw = |offset: usize| {
        let mut b = Buffer::empty(area);
        for row in 0..8u16 {
            for x in 0..60u16 {
                let i = (usize::from(x) + offset + usize::from(row) * 3) * 7 % 13 % 8;
                let colour = if i > 5 {
                    Color::LightRed
                } else {
                    Color::LightGreen
                };
                b[(20 + x, 2 + row * 6)].set_symbol(bars[i]).set_fg(colour);
            }
        }
        b
    };
    let (was, next) = (draw(0), draw(1));
    let ours = frame(&was, &next);
    let mut theirs = Vec::new();
    Backend::draw(
        &mut CrosstermBackend::new(&mut theirs),
        was.diff(&next).into_iter(),
    )
    .unwrap();
    let ratio = ours.len() as f64 / theirs.len() as f64;
    assert!(
        ratio < 0.8,
        "{} bytes against {} ({ratio:.2})",
        ours.len(),
        theirs.len()
    );
    let mut vt = terminal(200, 50);
    vt.process(&frame(&Buffer::empty(area), &was));
    vt.process(&ours);
    assert_shows(&vt, &next);
}
