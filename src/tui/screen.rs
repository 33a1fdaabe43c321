//! The console's terminal: what it shows, and the cheapest way to change it.
//!
//! ratatui's `Terminal` builds every frame whole: it clears a screen-sized buffer, renders
//! every widget into it, and compares all of it with the last frame. For an overview of eight
//! GPUs at 200×50 that is 10,000 cells cleared, drawn and compared each second, to send the
//! terminal the few that changed. [`Screen`] does the same for every frame that needs it (any
//! other view, anything over the overview, a resize), but an overview with nothing over it is
//! drawn piece by piece ([`ui::piecewise`]): the rows around it on every frame, and each GPU
//! block only when its [`BlockModel`] changed (most frames, one or two of them, or none). Only
//! what was drawn is compared with what the terminal shows.

use super::app::App;
use super::ui;
use super::views::overview::{BlockModel, block_models};
use crate::config::theme::Theme;
use ratatui::backend::Backend;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::widgets::Widget;

/// A terminal for the console (see the module doc).
pub struct Screen<B: Backend> {
    backend: B,
    /// The cells the terminal shows.
    shown: Buffer,
    /// A screen-sized buffer for whole frames, kept for its memory.
    spare: Buffer,
    /// The areas of the last frame, when it was drawn piece by piece or could have been.
    pieces: Option<ui::Areas>,
    /// Per GPU position: the area and model its block was last drawn from, on those areas.
    blocks: Vec<Option<(Rect, BlockModel)>>,
    /// The theme the blocks were drawn with.
    theme: Option<Theme>,
    cursor_hidden: bool,
    last: FrameStats,
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

impl<B: Backend> Screen<B> {
    pub fn new(backend: B) -> Screen<B> {
        Screen {
            backend,
            shown: Buffer::empty(Rect::ZERO),
            spare: Buffer::empty(Rect::ZERO),
            pieces: None,
            blocks: Vec::new(),
            theme: None,
            cursor_hidden: false,
            last: FrameStats::default(),
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
        self.pieces = None;
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
            self.pieces = None;
        }
        if !self.cursor_hidden {
            self.backend.hide_cursor()?;
            self.cursor_hidden = true;
        }
        if self.theme.as_ref() != Some(&app.theme) {
            self.theme = Some(app.theme.clone());
            self.pieces = None;
        }
        let pieces = ui::piecewise(app, area);
        self.last = FrameStats {
            whole: !matches!(pieces, Some(a) if self.pieces == Some(a)),
            ..FrameStats::default()
        };
        match pieces {
            Some(a) if self.pieces == Some(a) => self.draw_pieces(app, &a)?,
            _ => {
                self.draw_whole(app, area)?;
                self.blocks.clear();
            }
        }
        self.pieces = pieces;
        self.backend.flush()?;
        Ok(area)
    }

    fn draw_whole(&mut self, app: &App, area: Rect) -> Result<(), B::Error> {
        self.spare.reset();
        app.render(area, &mut self.spare);
        let changes = self.shown.diff(&self.spare);
        self.last.cells += changes.len();
        if !changes.is_empty() {
            self.backend.draw(changes.into_iter())?;
        }
        std::mem::swap(&mut self.shown, &mut self.spare);
        Ok(())
    }

    fn draw_pieces(&mut self, app: &App, a: &ui::Areas) -> Result<(), B::Error> {
        for (rect, render) in ui::chrome(a) {
            let mut next = Buffer::empty(rect);
            ui::base(app, rect, &mut next);
            render(app, rect, &mut next);
            self.put(&next)?;
        }
        for (pos, rect, model) in block_models(app, a.body) {
            if self.blocks.len() <= pos {
                self.blocks.resize(pos + 1, None);
            }
            if let Some((r, m)) = &self.blocks[pos] {
                if *r == rect && *m == model {
                    continue;
                }
            }
            let mut next = Buffer::empty(rect);
            ui::base(app, rect, &mut next);
            model.draw(&app.theme, rect, &mut next);
            self.put(&next)?;
            self.last.blocks += 1;
            self.blocks[pos] = Some((rect, model));
        }
        Ok(())
    }

    /// Send what differs between `next` and the cells shown on its area, and keep it as shown.
    fn put(&mut self, next: &Buffer) -> Result<(), B::Error> {
        let r = next.area;
        // The pieces are laid out inside the frame's area (`ui::Areas`).
        debug_assert_eq!(
            r.intersection(self.shown.area),
            r,
            "a piece outside the screen"
        );
        if r.is_empty() || r.intersection(self.shown.area) != r {
            return Ok(());
        }
        let mut was = Buffer::empty(r);
        for y in r.top()..r.bottom() {
            let (from, to) = (self.shown.index_of(r.x, y), was.index_of(r.x, y));
            let w = r.width as usize;
            was.content[to..to + w].clone_from_slice(&self.shown.content[from..from + w]);
        }
        let changes = was.diff(next);
        self.last.cells += changes.len();
        if !changes.is_empty() {
            self.backend.draw(changes.into_iter())?;
        }
        for y in r.top()..r.bottom() {
            let (to, from) = (self.shown.index_of(r.x, y), next.index_of(r.x, y));
            let w = r.width as usize;
            self.shown.content[to..to + w].clone_from_slice(&next.content[from..from + w]);
        }
        Ok(())
    }
}

impl<B: Backend> Drop for Screen<B> {
    fn drop(&mut self) {
        if self.cursor_hidden {
            let _ = self.backend.show_cursor();
        }
    }
}
