//! The real terminal's input and size, kept cheap for a console that runs for days.
//!
//! Input is read on a thread of its own that blocks in `crossterm::event::read` and hands each
//! event to the event loop: the loop wakes only when there is input. (crossterm's
//! `EventStream` polls the terminal again on every wake-up of the loop, and contends for its
//! reader's lock with its own waker thread each time.)
//!
//! The terminal's size is asked once and then learnt from the resize events that thread sees,
//! instead of opening `/dev/tty` for an `ioctl` before every frame (ratatui checks the size on
//! each draw).

use crossterm::event::Event;
use futures::Stream;
use ratatui::backend::{Backend, ClearType, WindowSize};
use ratatui::buffer::Cell;
use ratatui::layout::{Position, Size};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use tokio::sync::mpsc;

/// The terminal size as the input thread last saw it: `width << 16 | height`, 0 when unknown.
#[derive(Debug, Clone, Default)]
pub struct KnownSize(Arc<AtomicU32>);

impl KnownSize {
    /// A size known from the start (a terminal that is not asked, as in a benchmark).
    pub fn of(size: Size) -> KnownSize {
        let k = KnownSize::default();
        k.set(size.width, size.height);
        k
    }

    pub fn get(&self) -> Option<Size> {
        match self.0.load(Ordering::Relaxed) {
            0 => None,
            v => Some(Size::new((v >> 16) as u16, v as u16)),
        }
    }

    fn set(&self, width: u16, height: u16) {
        self.0.store(
            (u32::from(width) << 16) | u32::from(height),
            Ordering::Relaxed,
        );
    }

    /// Note the size an event carries (a resize), if it carries one.
    pub fn learn(&self, ev: &Event) {
        if let Event::Resize(w, h) = *ev {
            self.set(w, h);
        }
    }
}

/// The terminal's input as a stream, read on the thread `tui-input`. The stream ends after a
/// read error (the terminal is gone). The thread stays blocked in its read once the stream is
/// dropped, until the next input or the end of the process: nothing else in the process may
/// read terminal input after the console.
pub fn input(size: KnownSize) -> impl Stream<Item = std::io::Result<Event>> + Unpin {
    let (tx, mut rx) = mpsc::channel(256);
    let spawned = std::thread::Builder::new()
        .name("tui-input".into())
        .spawn(move || {
            loop {
                let ev = crossterm::event::read();
                let failed = ev.is_err();
                if let Ok(e) = &ev {
                    size.learn(e);
                }
                if tx.blocking_send(ev).is_err() || failed {
                    break;
                }
            }
        });
    if let Err(e) = spawned {
        // The stream then ends at once, which ends the console with the input closed.
        tracing::error!("spawning the console's input thread: {e}");
    }
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// A backend whose `size` is the one [`KnownSize`] holds (asked of the terminal only while
/// unknown).
pub struct SizedBackend<B> {
    inner: B,
    size: KnownSize,
}

impl<B> SizedBackend<B> {
    pub fn new(inner: B, size: KnownSize) -> Self {
        SizedBackend { inner, size }
    }
}

impl<B: Backend> Backend for SizedBackend<B> {
    type Error = B::Error;

    fn draw<'a, I>(&mut self, content: I) -> Result<(), Self::Error>
    where
        I: Iterator<Item = (u16, u16, &'a Cell)>,
    {
        self.inner.draw(content)
    }

    fn append_lines(&mut self, n: u16) -> Result<(), Self::Error> {
        self.inner.append_lines(n)
    }

    fn hide_cursor(&mut self) -> Result<(), Self::Error> {
        self.inner.hide_cursor()
    }

    fn show_cursor(&mut self) -> Result<(), Self::Error> {
        self.inner.show_cursor()
    }

    fn get_cursor_position(&mut self) -> Result<Position, Self::Error> {
        self.inner.get_cursor_position()
    }

    fn set_cursor_position<P: Into<Position>>(&mut self, position: P) -> Result<(), Self::Error> {
        self.inner.set_cursor_position(position)
    }

    fn clear(&mut self) -> Result<(), Self::Error> {
        self.inner.clear()
    }

    fn clear_region(&mut self, clear_type: ClearType) -> Result<(), Self::Error> {
        self.inner.clear_region(clear_type)
    }

    fn size(&self) -> Result<Size, Self::Error> {
        if let Some(s) = self.size.get() {
            return Ok(s);
        }
        let s = self.inner.size()?;
        self.size.set(s.width, s.height);
        Ok(s)
    }

    fn window_size(&mut self) -> Result<WindowSize, Self::Error> {
        self.inner.window_size()
    }

    fn flush(&mut self) -> Result<(), Self::Error> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::backend::TestBackend;

    #[test]
    fn the_size_is_asked_once_then_learnt_from_resizes() {
        let known = KnownSize::default();
        let b = SizedBackend::new(TestBackend::new(80, 24), known.clone());
        assert_eq!(b.size().unwrap(), Size::new(80, 24), "asked while unknown");
        known.learn(&Event::Resize(200, 50));
        assert_eq!(
            b.size().unwrap(),
            Size::new(200, 50),
            "the resize, not the terminal"
        );
        known.learn(&Event::FocusGained);
        assert_eq!(
            b.size().unwrap(),
            Size::new(200, 50),
            "other events change nothing"
        );
        known.learn(&Event::Resize(u16::MAX, 1));
        assert_eq!(b.size().unwrap(), Size::new(u16::MAX, 1));
    }
}
