//! The console's cost per frame: the overview of 8 simulated H100s at 200×50, each frame on a
//! new snapshot (every number moves, as at a 1 s refresh), after ten minutes of history.
//!
//! `cargo bench --bench render [-- FRAMES]` (default 2,000). Prints `key=value` pairs: the
//! median and p90 time to render the app into a buffer, to draw a whole frame through
//! ratatui's terminal (render, diff against the last frame, crossterm's escape codes into
//! memory), and to draw the same frame through the console's own terminal (`tui::screen`,
//! which redraws only the GPU blocks that changed), and the bytes each sends per frame.

use gpupilot::telemetry::open::{SimSpec, SourceKind, open_source};
use gpupilot::telemetry::{NodeInfo, Snapshot};
use gpupilot::tui::App;
use gpupilot::tui::keymap::Keymap;
use gpupilot::tui::screen::Screen;
use gpupilot::tui::theme::Theme;
use gpupilot::tui::tty::{KnownSize, SizedBackend};
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::widgets::Widget;
use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// A terminal that counts what it is sent.
struct Counter(Rc<Cell<usize>>);

impl std::io::Write for Counter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.set(self.0.get() + b.len());
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

const GPUS: u32 = 8;
const HISTORY_S: usize = 600;

fn main() {
    let frames: usize = std::env::args()
        .skip(1)
        .find(|a| a != "--bench")
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    let source = open_source(
        SourceKind::Sim,
        None,
        &SimSpec {
            gpus: GPUS,
            model: "h100-sxm".into(),
            workload: "resnet50".into(),
            seed: 0,
            counters: None,
        },
    )
    .expect("simulator");
    let node = NodeInfo {
        hostname: "gpu-node-07".into(),
        ..source.node_info()
    };
    // Snapshots one simulated second apart (the source runs on the wall clock: the time is
    // rewritten, the values are the simulator's).
    let t0 = 1.8e9;
    let snapshot = |s: usize| {
        let time_s = t0 + s as f64;
        let gpus = (0..GPUS as usize)
            .map(|i| {
                let mut g = source.sample_gpu(i);
                g.time_s = time_s;
                g
            })
            .collect();
        Snapshot {
            time_s,
            node: node.clone(),
            gpus,
            host: None,
        }
    };
    let mut app = App::new(Keymap::defaults(), Theme::default(), Duration::from_secs(1));
    for s in 0..HISTORY_S {
        app.on_snapshot(snapshot(s));
    }
    let area = Rect::new(0, 0, 200, 50);
    app.size = area;
    // Each measurement goes on from where the last one ended, a simulated second a frame.
    let mut second = HISTORY_S;
    let mut next = |app: &mut App| {
        app.on_snapshot(snapshot(second));
        app.data.now = t0 + second as f64 + 0.5;
        second += 1;
    };

    // Rendering alone, into a buffer reset for each frame (as ratatui does).
    let mut buf = Buffer::empty(area);
    let mut render_us = Vec::with_capacity(frames);
    for _ in 0..frames {
        next(&mut app);
        let t = Instant::now();
        buf.reset();
        (&app).render(area, &mut buf);
        render_us.push(t.elapsed().as_secs_f64() * 1e6);
    }

    // Whole frames through ratatui's terminal, and the same frames through the console's own
    // terminal, each into memory.
    let (written, screen_written) = (Rc::new(Cell::new(0usize)), Rc::new(Cell::new(0usize)));
    let mut term = Terminal::with_options(
        CrosstermBackend::new(Counter(Rc::clone(&written))),
        ratatui::TerminalOptions {
            viewport: ratatui::Viewport::Fixed(area),
        },
    )
    .expect("terminal");
    let mut screen = Screen::new(SizedBackend::new(
        CrosstermBackend::new(Counter(Rc::clone(&screen_written))),
        KnownSize::of(area.as_size()),
    ));
    let mut frame_us = Vec::with_capacity(frames);
    let mut bytes = Vec::with_capacity(frames);
    let mut screen_us = Vec::with_capacity(frames);
    let mut screen_bytes = Vec::with_capacity(frames);
    let mut blocks = 0usize;
    for _ in 0..frames {
        next(&mut app);
        written.set(0);
        let t = Instant::now();
        term.draw(|f| f.render_widget(&app, f.area()))
            .expect("draw");
        frame_us.push(t.elapsed().as_secs_f64() * 1e6);
        bytes.push(written.get() as f64);
        screen_written.set(0);
        let t = Instant::now();
        screen.draw(&app).expect("draw");
        screen_us.push(t.elapsed().as_secs_f64() * 1e6);
        screen_bytes.push(screen_written.get() as f64);
        blocks += screen.last_frame().blocks;
    }
    // The first frame draws every cell: leave it out.
    let (frame_us, bytes) = (&mut frame_us[1..], &mut bytes[1..]);
    let (screen_us, screen_bytes) = (&mut screen_us[1..], &mut screen_bytes[1..]);
    println!(
        "frames={frames} render_p50_us={:.0} render_p90_us={:.0} frame_p50_us={:.0} frame_p90_us={:.0} bytes_p50={:.0} bytes_mean={:.0} screen_p50_us={:.0} screen_p90_us={:.0} screen_bytes_mean={:.0} blocks_per_frame={:.2}",
        pct(&mut render_us, 0.5),
        pct(&mut render_us, 0.9),
        pct(frame_us, 0.5),
        pct(frame_us, 0.9),
        pct(bytes, 0.5),
        bytes.iter().sum::<f64>() / bytes.len() as f64,
        pct(screen_us, 0.5),
        pct(screen_us, 0.9),
        screen_bytes.iter().sum::<f64>() / screen_bytes.len() as f64,
        blocks as f64 / frames as f64,
    );
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}
