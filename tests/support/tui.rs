//! Hand-built console fixtures: a node's snapshots over two minutes, fed into an `App` with a
//! fixed frame time. Nothing here reads the wall clock, so every frame is reproducible.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use gpupilot::protocol::{LogStream, NodeEvent, NodeEventRecord, RunInfo};
use gpupilot::supervisor::RunStatus;
use gpupilot::telemetry::{GpuProcess, GpuSample, HostSample, NodeInfo, Snapshot, throttle};
use gpupilot::tui::App;
use gpupilot::tui::feed::{Link, Update};
use gpupilot::tui::keymap::Keymap;
use gpupilot::tui::screen::Screen;
use gpupilot::tui::theme::Theme;
use ratatui::Terminal;
use ratatui::backend::{Backend, ClearType, TestBackend, WindowSize};
use ratatui::buffer::Cell;
use ratatui::layout::{Position, Size};
use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

/// Start of the fixture's time (seconds since the epoch).
pub const T0: f64 = 1_700_000_000.0;
/// Seconds of history the fixture records, one snapshot per second.
pub const SECONDS: usize = 120;
const GIB: u64 = 1 << 30;

/// What the node looks like at second `s`: GPU 0 trains normally, GPU 1 is held at its power
/// cap, GPU 2 is an older part that reports less (no fan, no PCIe, no processes list) and goes
/// stale near the end, GPU 3 falls off the bus at 100 s. Extra GPUs (for the 8-GPU fixture)
/// train like GPU 0 with a phase shift.
pub fn gpu_at(i: usize, s: usize) -> GpuSample {
    let t = T0 + s as f64;
    let x = s as f64 / 10.0 + i as f64;
    let util = (80.0 + 15.0 * x.sin()).round();
    let mut g = GpuSample {
        index: i as u32,
        name: Some("NVIDIA H100 80GB HBM3".into()),
        uuid: Some(format!("GPU-0000000{i}-aaaa-bbbb-cccc-ddddeeeeffff")),
        pci_bus_id: Some(format!("00000000:{:02X}:00.0", 0x18 + i * 0x10)),
        time_s: t,
        util_gpu_pct: Some(util),
        util_mem_pct: Some((util * 0.6).round()),
        memory_used_bytes: Some(54 * GIB + (i as u64) * GIB / 4),
        memory_total_bytes: Some(80 * GIB),
        temperature_c: Some((45.0 + 20.0 * (1.0 - (-(s as f64) / 40.0).exp()) + i as f64).round()),
        temp_slowdown_c: Some(87.0),
        temp_shutdown_c: Some(92.0),
        temp_gpu_max_c: Some(85.0),
        power_w: Some((150.0 + 5.5 * util).round()),
        power_limit_w: Some(700.0),
        power_enforced_w: Some(700.0),
        power_default_w: Some(700.0),
        power_min_w: Some(200.0),
        power_max_w: Some(700.0),
        energy_j: Some(3.6e6 * 12.5 + s as f64 * 600.0),
        sm_clock_mhz: Some(1980 - (s as u32 % 7) * 15),
        sm_clock_max_mhz: Some(1980),
        mem_clock_mhz: Some(2619),
        mem_clock_max_mhz: Some(2619),
        fan_pct: None,
        pstate: Some(0),
        throttle_reasons: Some(0),
        pcie_rx_kbps: Some(950_000),
        pcie_tx_kbps: Some(19_000),
        pcie_gen: Some(5),
        pcie_width: Some(16),
        ecc_corrected: Some(0),
        ecc_uncorrected: Some(0),
        persistence: Some(true),
        processes: Some(vec![GpuProcess {
            pid: 40_000 + i as u32,
            name: Some("python train.py --model resnet50".into()),
            used_memory_bytes: Some(53 * GIB),
            owner: None,
        }]),
        ..GpuSample::default()
    };
    match i {
        1 => {
            g.power_limit_w = Some(450.0);
            g.power_enforced_w = Some(450.0);
            g.power_w = Some(449.0 - (s % 3) as f64);
            g.sm_clock_mhz = Some(1410 + (s as u32 % 5) * 10);
            g.throttle_reasons = Some(throttle::SW_POWER_CAP);
        }
        2 => {
            g.name = Some("Tesla V100-SXM2-32GB".into());
            g.memory_total_bytes = Some(32 * GIB);
            g.memory_used_bytes = Some(30 * GIB);
            g.temperature_c = Some(82.0 + (s % 4) as f64);
            g.temp_slowdown_c = Some(83.0);
            g.throttle_reasons =
                Some(throttle::HW_THERMAL_SLOWDOWN | throttle::SW_THERMAL_SLOWDOWN);
            g.power_limit_w = Some(300.0);
            g.power_max_w = Some(300.0);
            g.power_w = Some(260.0);
            g.pcie_rx_kbps = None;
            g.pcie_tx_kbps = None;
            g.processes = None;
            g.ecc_corrected = None;
            g.energy_j = None;
        }
        _ => {}
    }
    g
}

/// The snapshot at second `s` for `n` GPUs (GPU 2 stale after 110 s, GPU 3 lost from 100 s).
pub fn snapshot_at(n: usize, s: usize) -> Snapshot {
    let gpus = (0..n)
        .map(|i| {
            if i == 3 && s >= 100 {
                return GpuSample {
                    index: 3,
                    lost: true,
                    time_s: T0 + s as f64,
                    ..GpuSample::default()
                };
            }
            if i == 2 && s >= 110 {
                let mut g = gpu_at(2, 110);
                g.stale = true;
                return g;
            }
            gpu_at(i, s)
        })
        .collect();
    Snapshot {
        time_s: T0 + s as f64 + 0.01,
        node: NodeInfo {
            hostname: "gpu-node-07".into(),
            source: "sim".into(),
            driver_version: Some("550.54.15".into()),
            cuda_driver_version: Some("12.4".into()),
            nvml_version: Some("12.550.54.15".into()),
            topology: None,
        },
        gpus,
        host: Some(HostSample {
            cpu_pct: Some(37.5),
            cpu_count: Some(64),
            memory_used_bytes: Some(187 * GIB),
            memory_total_bytes: Some(503 * GIB),
            load_1m: Some(12.31),
            load_5m: Some(11.9),
            load_15m: Some(10.02),
        }),
    }
}

/// An app with the fixture's history taken in, the frame time half a second after the last
/// snapshot.
pub fn app(n: usize) -> App {
    app_with_theme(n, Theme::default())
}

pub fn app_with_theme(n: usize, theme: Theme) -> App {
    let mut app = App::new(Keymap::defaults(), theme, Duration::from_secs(1));
    for s in 0..SECONDS {
        take(&mut app, snapshot_at(n, s));
    }
    app.data.now = T0 + SECONDS as f64 - 0.5;
    app
}

/// Take `snap` in as the console does: its clock (`now`) is the snapshot's time when it comes
/// (a source on the console's own clock, a moment after it sampled).
pub fn take(app: &mut App, snap: Snapshot) {
    app.data.now = snap.time_s;
    app.on_snapshot(snap);
}

/// Render the app once on a `w`×`h` test terminal.
pub fn render(app: &mut App, w: u16, h: u16) -> Terminal<TestBackend> {
    let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
    app.size = ratatui::layout::Rect::new(0, 0, w, h);
    term.draw(|f| f.render_widget(&*app, f.area())).unwrap();
    term
}

/// A key without modifiers, as the console's keymap takes it.
pub fn press(app: &mut App, code: KeyCode) {
    let ev = KeyEvent::new(code, KeyModifiers::NONE);
    if let Some(a) = app.action_for_key(&ev) {
        app.apply(a);
    }
}

/// Keys typed into a dialog or prompt, one character at a time.
pub fn typed(app: &mut App, s: &str) {
    for c in s.chars() {
        press(app, KeyCode::Char(c));
    }
}

/// The screen as text, one line per row.
pub fn text(term: &Terminal<TestBackend>) -> String {
    let buf = term.backend().buffer();
    let mut out = String::new();
    for y in 0..buf.area.height {
        for x in 0..buf.area.width {
            out.push_str(buf[(x, y)].symbol());
        }
        out.push('\n');
    }
    out
}

/// A run as the daemon lists it.
pub fn run_info(id: &str, status: RunStatus) -> RunInfo {
    RunInfo {
        id: id.into(),
        name: id.splitn(3, '-').nth(2).unwrap_or(id).into(),
        status,
        pid: Some(51_234),
        attempt: 0,
        restarts: 0,
        started_at: "2023-11-14T22:13:20.000Z".into(),
        ended_at: None,
        uptime_s: Some(303.0),
        exit_code: None,
        signal_name: None,
        description: None,
        command: vec![
            "python3".into(),
            "train.py".into(),
            "--model".into(),
            "resnet50".into(),
        ],
        cwd: "/home/alice/exp".into(),
        gpus: "0,1".into(),
        adopted: false,
        dir: "/home/alice/.local/state/gpupilot/runs/x".into(),
        energy: None,
        slurm: None,
    }
}

/// Three runs, oldest first: a data prep that succeeded, an evaluation that failed after two
/// restarts, and the training run, live.
pub fn runs() -> Vec<RunInfo> {
    let mut prep = run_info("20231114-210000-prep", RunStatus::Succeeded);
    prep.command = vec!["sh".into(), "prep.sh".into()];
    prep.exit_code = Some(0);
    prep.description = Some("exit 0".into());
    prep.uptime_s = Some(1260.0);
    prep.ended_at = Some("2023-11-14T21:21:00.000Z".into());
    let mut eval = run_info("20231114-215000-eval", RunStatus::Failed);
    eval.command = vec!["python3".into(), "eval.py".into()];
    eval.restarts = 2;
    eval.attempt = 2;
    eval.exit_code = Some(1);
    eval.description = Some("exit 1".into());
    eval.uptime_s = Some(95.0);
    let mut train = run_info("20231114-220820-train", RunStatus::Running);
    train.restarts = 1;
    train.attempt = 1;
    vec![prep, eval, train]
}

/// Forty lines of a training log; every fifth is a checkpoint.
pub fn train_log() -> String {
    (1..=40)
        .map(|i| {
            if i % 5 == 0 {
                format!("epoch 1 step {i:>4} checkpoint saved to ckpt/step{i}.pt\n")
            } else {
                format!(
                    "epoch 1 step {i:>4} loss {:.3} lr 0.100 throughput {} img/s\n",
                    2.5 - i as f64 * 0.03,
                    2400 + i * 7
                )
            }
        })
        .collect()
}

/// The node's events, oldest first.
pub fn events() -> Vec<NodeEventRecord> {
    let by = "alice (uid 1000) via gpupilot (pid 4242)".to_string();
    let at = |s: u32| format!("2023-11-14T22:{:02}:{:02}.000Z", s / 60, s % 60);
    let events = vec![
        NodeEvent::DaemonStarted {
            pid: 4100,
            version: "0.1.0".into(),
            readonly: false,
            telemetry: "nvml, 4 GPUs at 1 Hz".into(),
            adopted: 0,
        },
        NodeEvent::RunStarted {
            run: "20231114-220820-train".into(),
            by: by.clone(),
            command: vec!["python3".into(), "train.py".into()],
            why: Some("gpupilot run -- …".into()),
        },
        NodeEvent::RunStatus {
            run: "20231114-220820-train".into(),
            old: RunStatus::Running,
            new: RunStatus::Backoff,
            by: "daemon".into(),
            why: "exit 1; restart 1 of 3 in 1 s".into(),
        },
        NodeEvent::RunStatus {
            run: "20231114-220820-train".into(),
            old: RunStatus::Backoff,
            new: RunStatus::Running,
            by: "daemon".into(),
            why: "restart 1".into(),
        },
        NodeEvent::RunStatus {
            run: "20231114-215000-eval".into(),
            old: RunStatus::Running,
            new: RunStatus::Paused,
            by: by.clone(),
            why: "gpupilot console".into(),
        },
        NodeEvent::PeerRefused {
            uid: 1001,
            pid: Some(777),
            reason: "another user".into(),
        },
    ];
    events
        .into_iter()
        .enumerate()
        .map(|(i, event)| NodeEventRecord {
            seq: i as u64 + 1,
            time: at(8 * 60 + i as u32 * 13),
            event,
        })
        .collect()
}

/// The 4-GPU fixture app connected to a daemon with [`runs`], the training run's log, and
/// [`events`].
pub fn app_with_runs() -> App {
    let mut app = app(4);
    app.on_update(Update::Link(Link::Daemon {
        pid: 4100,
        readonly: false,
        telemetry_error: None,
        rate_hz: 1.0,
    }));
    app.on_update(Update::Runs(runs()));
    app.on_update(Update::Log {
        run: "20231114-220820-train".into(),
        stream: LogStream::Stdout,
        data: train_log(),
        reset: true,
        from_start: true,
    });
    app.on_update(Update::Exits {
        run: "20231114-220820-train".into(),
        exits: vec!["exit 1".into()],
    });
    app.on_update(Update::Events {
        events: events(),
        reset: true,
    });
    app.take_requests();
    app
}

/// What reached the "terminal" of a [`Counting`] backend.
#[derive(Debug, Default)]
pub struct Counts {
    /// Frames (flushes).
    pub frames: usize,
    /// Cells written, per frame.
    pub cells: Vec<usize>,
    /// Calls of `draw`, per frame.
    pub draws: Vec<usize>,
    pub clears: usize,
}

/// TestBackend that counts frames, cells and `draw` calls per frame, and clears.
pub struct Counting {
    pub inner: TestBackend,
    counts: Rc<RefCell<Counts>>,
    pending_cells: usize,
    pending_draws: usize,
}

impl Backend for Counting {
    type Error = std::convert::Infallible;

    fn draw<'a, I>(&mut self, content: I) -> Result<(), Self::Error>
    where
        I: Iterator<Item = (u16, u16, &'a Cell)>,
    {
        let cells: Vec<_> = content.collect();
        self.pending_cells += cells.len();
        self.pending_draws += 1;
        self.inner.draw(cells.into_iter())
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
        self.counts.borrow_mut().clears += 1;
        self.inner.clear()
    }
    fn clear_region(&mut self, clear_type: ClearType) -> Result<(), Self::Error> {
        if clear_type == ClearType::All {
            self.counts.borrow_mut().clears += 1;
        }
        self.inner.clear_region(clear_type)
    }
    fn size(&self) -> Result<Size, Self::Error> {
        self.inner.size()
    }
    fn window_size(&mut self) -> Result<WindowSize, Self::Error> {
        self.inner.window_size()
    }
    fn flush(&mut self) -> Result<(), Self::Error> {
        let mut c = self.counts.borrow_mut();
        c.frames += 1;
        c.cells.push(std::mem::take(&mut self.pending_cells));
        c.draws.push(std::mem::take(&mut self.pending_draws));
        self.inner.flush()
    }
}

/// The console's terminal on a `w`×`h` counting test backend.
pub fn terminal(w: u16, h: u16) -> (Screen<Counting>, Rc<RefCell<Counts>>) {
    let counts = Rc::new(RefCell::new(Counts::default()));
    let backend = Counting {
        inner: TestBackend::new(w, h),
        counts: Rc::clone(&counts),
        pending_cells: 0,
        pending_draws: 0,
    };
    (Screen::new(backend), counts)
}
