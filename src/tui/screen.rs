//! The console's terminal: what it shows, and the cheapest way to change it.
//!
//! ratatui's `Terminal` builds every frame whole: it clears a screen-sized buffer, renders
//! every widget into it, and compares all of it with the last frame. For an overview of eight
//! GPUs at 200×50 that is 10,000 cells cleared, drawn and compared each second, to send the
//! terminal the few that changed. [`Screen`] does the same for every frame that needs it (any
//! other view, anything over the overview, a resize), but an overview with nothing over it is
//! drawn piece by piece ([`ui::piecewise`]): each row around it only when its [`ui::Row`]
//! changed, and each GPU block only when its [`BlockModel`] changed (most frames, one or two
//! of them, or none). Only what was drawn is compared with what the terminal shows.

use super::ansi::narrow_char;
use super::app::App;
use super::layout::Areas;
use super::theme::Theme;
use super::ui;
use super::views::overview::{BlockModel, block_models};
use super::widgets::{Bars, eighths_symbol};
use ratatui::backend::Backend;
use ratatui::buffer::{Buffer, Cell, CellDiffOption};
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::widgets::Widget;

/// A terminal for the console (see the module doc).
pub struct Screen<B: Backend> {
    backend: B,
    /// The cells the terminal shows, as of the last frame drawn whole.
    shown: Buffer,
    /// A screen-sized buffer for whole frames, kept for its memory.
    spare: Buffer,
    /// Where the pieces of the last frame went, when it was drawn piece by piece or could
    /// have been.
    areas: Option<ui::Pieces>,
    /// The rows around the view, then the GPU blocks by position, since the last whole frame:
    /// what each shows now (which `shown` does not follow meanwhile).
    pieces: Vec<Option<Piece>>,
    /// The theme the pieces were drawn with.
    theme: Option<Theme>,
    cursor_hidden: bool,
    last: FrameStats,
    /// The cells a frame drawn piece by piece changes, sent together at its end: each call
    /// of the backend's `draw` ends by resetting the colours, which costs bytes per call.
    changed: Vec<(u16, u16, Cell)>,
    /// The order to send `changed` in, kept for its memory.
    order: Vec<u64>,
    /// Two buffers to draw a part of a block into and to compare it with, kept for their
    /// memory.
    scratch: [Buffer; 2],
}

/// One piece of a frame drawn piece by piece.
struct Piece {
    /// The cells the terminal shows on the piece's area.
    shown: Buffer,
    /// A buffer of the same area to draw the next version into, kept for its memory.
    spare: Buffer,
    /// What the piece was drawn from.
    model: Option<Model>,
}

/// What a piece shows: equal models on the same area draw the same cells.
#[derive(Debug, Clone, PartialEq)]
enum Model {
    Row(ui::Row),
    Block(BlockModel),
}

/// How the last frame was drawn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FrameStats {
    /// Whole (every cell drawn and compared), or piece by piece.
    pub whole: bool,
    /// GPU blocks drawn (on a frame drawn piece by piece).
    pub blocks: usize,
    /// Cells sent to the terminal.
    pub cells: usize,
}

/// The rows around the view come first among the pieces.
const CHROME: usize = 4;

impl<B: Backend> Screen<B> {
    pub fn new(backend: B) -> Screen<B> {
        Screen {
            backend,
            shown: Buffer::empty(Rect::ZERO),
            spare: Buffer::empty(Rect::ZERO),
            areas: None,
            pieces: Vec::new(),
            theme: None,
            cursor_hidden: false,
            last: FrameStats::default(),
            changed: Vec::new(),
            order: Vec::new(),
            scratch: [Buffer::empty(Rect::ZERO), Buffer::empty(Rect::ZERO)],
        }
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    /// How the last frame was drawn.
    pub fn last_frame(&self) -> FrameStats {
        self.last
    }

    /// Clear the terminal: the next frame is drawn whole (Ctrl-L, after something else wrote
    /// to the terminal).
    pub fn clear(&mut self) -> Result<(), B::Error> {
        self.backend.clear()?;
        self.shown.reset();
        self.pieces.clear();
        self.areas = None;
        Ok(())
    }

    /// Draw `app` and flush; the frame's area (the terminal's size).
    pub fn draw(&mut self, app: &App) -> Result<Rect, B::Error> {
        let size = self.backend.size()?;
        let area = Rect::new(0, 0, size.width, size.height);
        if area != self.shown.area {
            // A new size: the terminal redraws from blank, as ratatui's resize does. (The
            // first frame finds it blank: a fresh alternate screen.)
            if self.shown.area != Rect::ZERO {
                self.backend.clear()?;
            }
            self.shown = Buffer::empty(area);
            self.spare = Buffer::empty(area);
            self.pieces.clear();
            self.areas = None;
        }
        if !self.cursor_hidden {
            self.backend.hide_cursor()?;
            self.cursor_hidden = true;
        }
        if self.theme.as_ref() != Some(&app.theme) {
            self.theme = Some(app.theme.clone());
            self.areas = None;
        }
        let areas = ui::piecewise(app, area);
        let piecewise = matches!(areas, Some(a) if self.areas == Some(a));
        self.last = FrameStats {
            whole: !piecewise,
            ..FrameStats::default()
        };
        match areas {
            Some(a) if piecewise => self.draw_pieces(app, &a.areas)?,
            _ => self.draw_whole(app, area)?,
        }
        self.areas = areas;
        self.backend.flush()?;
        Ok(area)
    }

    fn draw_whole(&mut self, app: &App, area: Rect) -> Result<(), B::Error> {
        // What the pieces drew since the last whole frame is what the terminal shows.
        for p in self.pieces.drain(..).flatten() {
            copy(&p.shown, &mut self.shown);
        }
        self.spare.reset();
        app.render(area, &mut self.spare);
        let changes = changes(&self.shown, &self.spare);
        self.last.cells += changes.len();
        if !changes.is_empty() {
            self.backend.draw(changes.into_iter())?;
        }
        std::mem::swap(&mut self.shown, &mut self.spare);
        Ok(())
    }

    fn draw_pieces(&mut self, app: &App, a: &Areas) -> Result<(), B::Error> {
        for (i, (rect, row_of)) in ui::chrome(a).into_iter().enumerate() {
            let row = row_of(app, rect);
            if self.shows(i, rect, |m| matches!(m, Model::Row(r) if *r == row)) {
                continue;
            }
            self.put(i, rect, Model::Row(row), |next, model| {
                ui::base(app, rect, next);
                if let Model::Row(r) = model {
                    r.draw(rect, next);
                }
            });
        }
        // A cell of a piece where nothing is drawn over the base.
        let mut blank = Cell::EMPTY;
        if let Some(style) = ui::base_style(app) {
            blank.set_style(style);
        }
        let pieces = &self.pieces;
        let last = |pos: usize| match pieces.get(CHROME + pos) {
            Some(Some(Piece {
                model: Some(Model::Block(m)),
                ..
            })) => Some(m),
            _ => None,
        };
        for (pos, rect, model) in block_models(app.ctx(), app.selected, a.body, last) {
            let i = CHROME + pos;
            if self.shows(i, rect, |m| matches!(m, Model::Block(b) if *b == model)) {
                continue;
            }
            if let Some(Some(p)) = self.pieces.get_mut(i) {
                if p.shown.area == rect {
                    let parts = match &p.model {
                        Some(Model::Block(m)) => m.changed_parts(&model, rect),
                        _ => None,
                    };
                    if let Some(parts) = parts {
                        // The border and titles stand: only the parts of meters that
                        // changed (gauges, values, sparklines) are drawn again.
                        self.last.blocks += 1;
                        let [next, was] = &mut self.scratch;
                        for (r, part) in parts {
                            // A sparkline is compared cell by cell with what the piece shows,
                            // without drawing it into a buffer first.
                            if let Some(now) = model.part_bars(rect, part) {
                                // What the piece shows there: the bars of the model it was
                                // drawn from.
                                let before = match &p.model {
                                    Some(Model::Block(m)) => m.part_bars(rect, part),
                                    _ => None,
                                };
                                let taken = take_bars(
                                    &mut self.changed,
                                    &mut p.shown,
                                    r,
                                    &blank,
                                    now,
                                    before,
                                );
                                if taken {
                                    continue;
                                }
                            }
                            next.resize(r);
                            next.reset();
                            ui::base(app, r, next);
                            model.draw_part(&app.theme, rect, part, next);
                            if !take_changes(&mut self.changed, &mut p.shown, next) {
                                was.resize(r);
                                copy(&p.shown, was);
                                note_changes(&mut self.changed, was, next);
                                copy(next, &mut p.shown);
                            }
                        }
                        p.model = Some(Model::Block(model));
                        continue;
                    }
                }
            }
            self.last.blocks += 1;
            self.put(i, rect, Model::Block(model), |next, model| {
                ui::base(app, rect, next);
                if let Model::Block(m) = model {
                    m.draw(&app.theme, rect, next);
                }
            });
        }
        // In screen order, so that the cursor moves as little as it can, and in the order they
        // came where two are for one cell: each change's position and place in `changed`, as
        // one number, sorted (the cells themselves stay where they are).
        self.order.clear();
        self.order.extend(
            self.changed
                .iter()
                .enumerate()
                .map(|(i, (x, y, _))| (u64::from(*y) << 48) | (u64::from(*x) << 32) | i as u64),
        );
        self.order.sort_unstable();
        self.last.cells = self.changed.len();
        if !self.changed.is_empty() {
            let changed = &self.changed;
            self.backend.draw(self.order.iter().map(|&k| {
                let (x, y, c) = &changed[(k & u64::from(u32::MAX)) as usize];
                (*x, *y, c)
            }))?;
            self.changed.clear();
        }
        Ok(())
    }

    /// Whether piece `i` shows, on `rect`, a model that `same` says is the one to show.
    fn shows(&self, i: usize, rect: Rect, same: impl FnOnce(&Model) -> bool) -> bool {
        match self.pieces.get(i) {
            Some(Some(p)) => p.shown.area == rect && p.model.as_ref().is_some_and(same),
            _ => false,
        }
    }

    /// Draw piece `i` on `rect` with `draw` (given the piece's model), note what differs from
    /// what the terminal shows there (in `changed`), and keep it as shown.
    fn put(&mut self, i: usize, rect: Rect, model: Model, draw: impl FnOnce(&mut Buffer, &Model)) {
        // The pieces are laid out inside the frame's area (`layout::Areas`).
        if rect.is_empty() || rect.intersection(self.shown.area) != rect {
            debug_assert!(rect.is_empty(), "a piece outside the screen: {rect:?}");
            return;
        }
        if self.pieces.len() <= i {
            self.pieces.resize_with(i + 1, || None);
        }
        let piece = match &mut self.pieces[i] {
            Some(p) if p.shown.area == rect => p,
            slot => {
                // New since the last whole frame (pieces do not move without one: see
                // `ui::Pieces`): what the terminal shows on it is in `shown`.
                let mut was = Buffer::empty(rect);
                copy(&self.shown, &mut was);
                slot.insert(Piece {
                    shown: was,
                    spare: Buffer::empty(rect),
                    model: None,
                })
            }
        };
        piece.spare.reset();
        draw(&mut piece.spare, piece.model.insert(model));
        note_changes(&mut self.changed, &piece.shown, &piece.spare);
        std::mem::swap(&mut piece.shown, &mut piece.spare);
    }
}

/// Add the cells of `next` that differ from `was` (same area) to `changed`.
fn note_changes(changed: &mut Vec<(u16, u16, Cell)>, was: &Buffer, next: &Buffer) {
    changed.extend(
        changes(was, next)
            .into_iter()
            .map(|(x, y, c)| (x, y, c.clone())),
    );
}

/// Where `next` lies inside `shown` and its changes are plain (see [`changes`]): add the cells
/// of `next` that differ from `shown` to `changed` and put them into `shown`, with no copy of
/// the rest; true. Otherwise nothing is done; false.
fn take_changes(changed: &mut Vec<(u16, u16, Cell)>, shown: &mut Buffer, next: &Buffer) -> bool {
    let r = next.area;
    if r.is_empty() || shown.area.intersection(r) != r {
        return false;
    }
    let w = usize::from(r.width);
    let row = |b: &Buffer, y: u16| b.index_of(r.x, y)..b.index_of(r.x, y) + w;
    let from = changed.len();
    for y in r.top()..r.bottom() {
        let (was, now) = (&shown.content[row(shown, y)], &next.content[row(next, y)]);
        // Left of the part, the piece shows what stays.
        let left_of_part = &shown.content[shown.index_of(shown.area.x, y)..row(shown, y).start];
        let plain = was.iter().zip(now).enumerate().all(|(i, (a, b))| {
            if !plain_option(b) {
                return false;
            }
            if a == b {
                return true;
            }
            let before = now[..i].iter().rev().chain(left_of_part.iter().rev());
            if !plain_change(a, b, before) {
                return false;
            }
            changed.push((r.x + i as u16, y, b.clone()));
            true
        });
        if !plain {
            changed.truncate(from);
            return false;
        }
    }
    for (x, y, c) in &changed[from..] {
        let i = shown.index_of(*x, *y);
        shown.content[i].clone_from(c);
    }
    true
}

/// [`take_changes`] for a sparkline part `r`: `bars` drawn on `at` (the part less its blank
/// first column) in `style`, over `blank` (an empty cell in the base style). Its cells are
/// compared with `shown` where they are made, with no buffer drawn. `before`, the bars `shown`
/// has on the part (drawn the same way over the same `blank`), says which cell of the palette
/// each shown cell is, so that no cell of `shown` is read to compare it.
/// Where a cell it replaces is not narrow, nothing is done; false.
fn take_bars(
    changed: &mut Vec<(u16, u16, Cell)>,
    shown: &mut Buffer,
    r: Rect,
    blank: &Cell,
    (bars, at, style): (&Bars, Rect, Style),
    before: Option<(&Bars, Rect, Style)>,
) -> bool {
    if r.is_empty() || shown.area.intersection(r) != r {
        return false;
    }
    // The cells a sparkline is made of: blank, then 0 to 8 eighths filled.
    let palette: [Cell; 10] = std::array::from_fn(|i| {
        let mut c = blank.clone();
        if let Some(e) = i.checked_sub(1) {
            c.set_symbol(eighths_symbol(e as u16)).set_style(style);
        }
        c
    });
    // Every bar's symbol is narrow (see `eighths_symbol`): only the blank is asked.
    if !palette.iter().all(plain_option) || !narrow_cell(blank) {
        return false;
    }
    // Cells of the palette differ where their indices do, but for a blank and an empty bar
    // in the base style (every bar's symbol is its own: see `eighths_symbol`).
    let empty_is_blank = palette[1] == palette[0];
    let same = |k: usize| if k == 1 && empty_is_blank { 0 } else { k };
    // Each column's bar, as `Bars::eighths_at` finds it: the newest `at.width` of them.
    fn columns(b: &Bars, at: Rect) -> &[Option<u16>] {
        &b.ticks[b.ticks.len().saturating_sub(usize::from(at.width))..]
    }
    let now = columns(bars, at);
    let was = before
        .filter(|&(_, was_at, was_style)| (was_at, was_style) == (at, style))
        .map(|(b, ..)| columns(b, at));
    // The cell of the palette a column's bar draws `below` rows above the bottom one: blank
    // for a column with nothing drawn (left of `at`, or right of the data).
    let cell = |bar: Option<Option<u16>>, below: u16| {
        bar.map_or(0, |t| {
            usize::from(t.map_or(0, |t| t.saturating_sub(8 * below).min(8))) + 1
        })
    };
    let bar_at = |ticks: &[Option<u16>], x: u16| {
        x.checked_sub(at.x)
            .and_then(|x| ticks.get(usize::from(x)).copied())
    };
    // The columns to look at, as offsets into the part. A column whose bar is the one shown
    // draws, row by row, what the piece shows: where the bars shown are known, only the
    // others are listed. (A part wider than the list is drawn and compared instead.)
    let mut look = [0u16; 256];
    if usize::from(r.width) > look.len() {
        return false;
    }
    let mut n = 0;
    for x in r.left()..r.right() {
        if was.is_none_or(|was| bar_at(was, x) != bar_at(now, x)) {
            look[n] = x - r.x;
            n += 1;
        }
    }
    let from = changed.len();
    for y in r.top()..r.bottom() {
        let below = at.height.saturating_sub(y.saturating_sub(at.y) + 1);
        let start = shown.index_of(r.x, y);
        // Left of the part, the piece shows what stays.
        let left_of_part = &shown.content[shown.index_of(shown.area.x, y)..start];
        for &offset in &look[..n] {
            let (x, i) = (r.x + offset, usize::from(offset));
            let k = cell(bar_at(now, x), below);
            let (next, was_cell) = (&palette[k], &shown.content[start + i]);
            match was.map(|was| same(cell(bar_at(was, x), below))) {
                // What the piece shows there is the palette's cell of the bar it was drawn
                // with: the same cell, or another (narrow, as every cell of the palette).
                Some(w) => {
                    debug_assert_eq!(
                        was_cell, &palette[w],
                        "the piece shows other bars than it was drawn with"
                    );
                    if w == same(k) {
                        continue;
                    }
                }
                None if was_cell == next => continue,
                None if !narrow_cell(was_cell) => {
                    changed.truncate(from);
                    return false;
                }
                None => {}
            }
            // Every cell drawn is narrow: only those left of the part can reach a change.
            if i < REACH && !left_of_part.iter().rev().take(REACH - i).all(narrow_cell) {
                changed.truncate(from);
                return false;
            }
            changed.push((x, y, next.clone()));
        }
    }
    for (x, y, c) in &changed[from..] {
        let i = shown.index_of(*x, *y);
        shown.content[i].clone_from(c);
    }
    true
}

/// How many cells to the left a glyph can reach: the widest a terminal cell's grapheme is
/// taken to be, less one.
const REACH: usize = 3;

/// The cells of `next` that differ from `was`: what ratatui's `Buffer::diff` finds, without
/// its cost where it cannot matter. It asks Unicode the width of every cell, equal or not, to
/// handle wide glyphs. Where every cell that differs is narrow on both sides, with narrow
/// cells to its left (the console's digits, gauges, sparkline bars, borders: every frame but
/// one with a wide glyph changing), the changes are simply the cells that differ, and only
/// those are asked; anything else goes through `Buffer::diff`.
fn changes<'a>(was: &Buffer, next: &'a Buffer) -> Vec<(u16, u16, &'a Cell)> {
    if was.area == next.area {
        let width = usize::from(next.area.width.max(1));
        let mut out = Vec::new();
        let plain = was
            .content
            .iter()
            .zip(&next.content)
            .enumerate()
            .all(|(i, (a, b))| {
                if !plain_option(b) {
                    return false;
                }
                if a == b {
                    return true;
                }
                let x = i % width;
                if !plain_change(a, b, next.content[i - x..i].iter().rev()) {
                    return false;
                }
                out.push((next.area.x + x as u16, next.area.y + (i / width) as u16, b));
                true
            });
        if plain {
            return out;
        }
    }
    was.diff(next)
}

/// Whether `next` is drawn by its own content alone: not skipped, no diff option of its own.
fn plain_option(next: &Cell) -> bool {
    #[allow(deprecated)] // what `Buffer::diff` still honours
    let skip = next.skip;
    !skip && next.diff_option == CellDiffOption::None
}

/// Whether a cell that changes from `was` to `next` is a plain change: both narrow, and the
/// cells `before` it on its row (nearest first, as they will be shown) narrow as far as a
/// glyph can reach.
fn plain_change<'a>(was: &Cell, next: &Cell, before: impl Iterator<Item = &'a Cell>) -> bool {
    narrow_cell(was) && narrow_cell(next) && before.take(REACH).all(narrow_cell)
}

/// Whether every cell of `buf` is one plain column wide (see [`narrow_cell`]), none skipped,
/// none with a diff option of its own.
#[cfg(test)]
fn all_narrow(buf: &Buffer) -> bool {
    buf.content
        .iter()
        .all(|c| plain_option(c) && narrow_cell(c))
}

/// Whether `c` is one plain column wide: one [`narrow_char`] (ASCII, or a character of the
/// blocks the console draws with).
fn narrow_cell(c: &Cell) -> bool {
    let s = c.symbol();
    match s.as_bytes() {
        [b] => b.is_ascii() && !b.is_ascii_control(),
        _ => {
            let mut chars = s.chars();
            matches!((chars.next(), chars.next()), (Some(c), None) if narrow_char(c))
        }
    }
}

/// Copy the cells of `from` that lie on `to`'s area into `to`.
fn copy(from: &Buffer, to: &mut Buffer) {
    let r = from.area.intersection(to.area);
    if r.is_empty() {
        return;
    }
    let w = r.width as usize;
    for y in r.top()..r.bottom() {
        let (i, j) = (from.index_of(r.x, y), to.index_of(r.x, y));
        to.content[j..j + w].clone_from_slice(&from.content[i..i + w]);
    }
}

impl<B: Backend> Drop for Screen<B> {
    fn drop(&mut self) {
        if self.cursor_hidden {
            let _ = self.backend.show_cursor();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use ratatui::style::{Color, Style};

    const GLYPHS: [&str; 10] = [" ", "a", "7", "▁", "█", "─", "⣿", "°", "漢", "€"];

    fn buffer(cells: &[(u16, u16, usize, bool)]) -> Buffer {
        let mut b = Buffer::empty(Rect::new(3, 2, 20, 6));
        for &(x, y, g, red) in cells {
            let style = Style::new().fg(if red { Color::Red } else { Color::Reset });
            b.set_string(3 + x, 2 + y, GLYPHS[g], style);
        }
        b
    }

    proptest! {
        /// The same changes as ratatui's diff, whether the fast way applies (narrow glyphs
        /// only) or not (a wide or combined one anywhere).
        #[test]
        fn changes_are_ratatuis(
            a in proptest::collection::vec((0u16..19, 0u16..6, 0usize..10, any::<bool>()), 0..40),
            b in proptest::collection::vec((0u16..19, 0u16..6, 0usize..10, any::<bool>()), 0..40),
        ) {
            let (was, next) = (buffer(&a), buffer(&b));
            prop_assert_eq!(changes(&was, &next), was.diff(&next));
        }
    }

    proptest! {
        /// A part taken into what a piece shows changes the same cells, and leaves the same
        /// piece, as drawing it into a copy of the piece and comparing; it is taken wherever
        /// every glyph is narrow, and steps aside (false, nothing changed) where a wide glyph
        /// changes or stands next to a change.
        #[test]
        fn a_part_taken_in_place_is_a_part_compared_on_a_copy(
            a in proptest::collection::vec((0u16..19, 0u16..6, 0usize..10, any::<bool>()), 0..40),
            b in proptest::collection::vec((0u16..19, 0u16..6, 0usize..10, any::<bool>()), 0..40),
            (x, y, w, h) in (0u16..10, 0u16..3, 1u16..10, 1u16..4),
        ) {
            let shown = buffer(&a);
            let part = Rect::new(3 + x, 2 + y, w, h);
            let mut next = Buffer::empty(part);
            copy(&buffer(&b), &mut next);

            let mut was = Buffer::empty(part);
            copy(&shown, &mut was);
            let mut want = Vec::new();
            note_changes(&mut want, &was, &next);
            let mut want_shown = shown.clone();
            copy(&next, &mut want_shown);

            let (mut got, mut got_shown) = (Vec::new(), shown.clone());
            let taken = take_changes(&mut got, &mut got_shown, &next);
            if all_narrow(&shown) && all_narrow(&next) {
                prop_assert!(taken, "narrow glyphs only: taken in place");
            }
            if taken {
                prop_assert_eq!(got, want);
                prop_assert_eq!(got_shown, want_shown);
            } else {
                prop_assert!(got.is_empty());
                prop_assert_eq!(got_shown, shown);
            }
        }
    }

    proptest! {
        /// A sparkline compared cell by cell changes the same cells, and leaves the same piece,
        /// as the sparkline drawn into a buffer and taken in place; it is taken wherever the
        /// glyphs it replaces, and those left of it, are narrow.
        #[test]
        fn bars_taken_cell_by_cell_are_bars_drawn_and_taken(
            a in proptest::collection::vec((0u16..19, 0u16..6, 0usize..10, any::<bool>()), 0..40),
            ticks in proptest::collection::vec(proptest::option::of(0u16..40), 0..16),
            (x, y, w, h) in (0u16..10, 0u16..3, 2u16..10, 1u16..4),
            (red, based) in (any::<bool>(), any::<bool>()),
        ) {
            let shown = buffer(&a);
            let part = Rect::new(3 + x, 2 + y, w, h);
            let at = Rect::new(part.x + 1, part.y, w - 1, h);
            let bars = crate::tui::widgets::Bars { ticks, rows: h };
            let style = Style::new().fg(if red { Color::Red } else { Color::Green });
            let base = based.then(|| Style::new().bg(Color::Blue));

            let mut next = Buffer::empty(part);
            if let Some(b) = base {
                next.set_style(part, b);
            }
            bars.render(at, &mut next, style);
            let (mut want, mut want_shown) = (Vec::new(), shown.clone());
            let drawn = take_changes(&mut want, &mut want_shown, &next);

            let (mut got, mut got_shown) = (Vec::new(), shown.clone());
            let mut blank = Cell::EMPTY;
            if let Some(b) = base {
                blank.set_style(b);
            }
            let taken =
                take_bars(&mut got, &mut got_shown, part, &blank, (&bars, at, style), None);
            if all_narrow(&shown) {
                prop_assert!(taken, "narrow glyphs only: taken");
            }
            if taken {
                prop_assert!(drawn);
                prop_assert_eq!(got, want);
                prop_assert_eq!(got_shown, want_shown);
            } else {
                prop_assert!(got.is_empty());
                prop_assert_eq!(got_shown, shown);
            }
        }
    }

    proptest! {
        /// Bars compared against the bars the piece was drawn with change the same cells, and
        /// leave the same piece, as bars compared with every cell.
        #[test]
        fn bars_compared_with_the_bars_shown_are_bars_compared_cell_by_cell(
            a in proptest::collection::vec((0u16..19, 0u16..6, 0usize..10, any::<bool>()), 0..40),
            was in proptest::collection::vec(proptest::option::of(0u16..40), 0..16),
            now in proptest::collection::vec(proptest::option::of(0u16..40), 0..16),
            (x, y, w, h) in (0u16..10, 0u16..3, 2u16..10, 1u16..4),
            (red, based, restyled) in (any::<bool>(), any::<bool>(), any::<bool>()),
        ) {
            let part = Rect::new(3 + x, 2 + y, w, h);
            let at = Rect::new(part.x + 1, part.y, w - 1, h);
            let style = Style::new().fg(if red { Color::Red } else { Color::Green });
            let was_style = if restyled { style.bg(Color::Black) } else { style };
            let mut blank = Cell::EMPTY;
            if based {
                blank.set_style(Style::new().bg(Color::Blue));
            }
            // A piece that shows `was` on the part, drawn as the console draws it.
            let (was, now) = (Bars { ticks: was, rows: h }, Bars { ticks: now, rows: h });
            let mut shown = buffer(&a);
            let mut first = Vec::new();
            let put = take_bars(&mut first, &mut shown, part, &blank, (&was, at, was_style), None);
            prop_assume!(put, "a wide glyph beside the part: the bars went another way");

            let (mut want, mut want_shown) = (Vec::new(), shown.clone());
            let drawn = take_bars(&mut want, &mut want_shown, part, &blank, (&now, at, style), None);
            let (mut got, mut got_shown) = (Vec::new(), shown.clone());
            let before = Some((&was, at, was_style));
            let taken = take_bars(&mut got, &mut got_shown, part, &blank, (&now, at, style), before);
            prop_assert_eq!(taken, drawn);
            prop_assert_eq!(got, want);
            prop_assert_eq!(got_shown, want_shown);
        }
    }

    #[test]
    fn every_bar_height_has_a_symbol_of_its_own() {
        // `take_bars` tells the cells of its palette apart by index alone.
        let symbols: Vec<&str> = (0..=8).map(eighths_symbol).collect();
        for (i, a) in symbols.iter().enumerate() {
            assert!(!symbols[i + 1..].contains(a), "{a:?} twice");
        }
        assert_eq!(
            eighths_symbol(9),
            eighths_symbol(8),
            "a full block from 8 up"
        );
        // `take_bars` asks only its blank whether it is narrow.
        for s in symbols {
            let mut c = Cell::EMPTY;
            c.set_symbol(s);
            assert!(narrow_cell(&c), "{s:?}");
        }
    }

    #[test]
    fn the_console_s_glyphs_are_narrow_and_others_are_not() {
        let narrow = [
            (0, 0, 3, true),
            (1, 0, 5, false),
            (2, 0, 6, false),
            (3, 0, 7, false),
        ];
        assert!(all_narrow(&buffer(&narrow)));
        assert!(!all_narrow(&buffer(&[(0, 0, 8, false)])), "wide");
        assert!(
            !all_narrow(&buffer(&[(0, 0, 9, false)])),
            "outside the blocks the console draws with"
        );
    }
}
