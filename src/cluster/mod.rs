//! `gpupilot cluster`: many nodes at once, read from Prometheus's HTTP query API — from
//! gpupilot daemons' `/metrics` ([`crate::exporter`]) or from dcgm-exporter alike, by
//! dcgm-exporter's metric names.
//!
//! - [`query`]: a minimal blocking client of `/api/v1/query` (instant vectors).
//! - [`model`]: query answers → nodes × GPUs, node states (up, stale, down, missing), totals.
//!   Pure.
//! - [`jobs`]: the local daemon's live Slurm jobs on the grid's nodes. Pure, but for the
//!   thread that reads the runs.
//! - [`view`]: the grid, the totals and one node in detail; keys change a [`view::ViewState`].
//! - [`Poller`]: the queries on a thread of their own, once per interval, each with timeouts,
//!   so a slow Prometheus (or a node that stops answering it) never holds up drawing.

pub mod jobs;
pub mod model;
pub mod query;
pub mod view;

use std::io::Read as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use model::{Answers, ClusterModel};
use query::{Prometheus, QueryError};

/// The metric that colours the grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GridMetric {
    /// GPU utilization, percent.
    Util,
    /// Power draw, watts (coloured against the GPU's cap).
    Power,
    /// Temperature, °C.
    Temp,
    /// Memory used, percent.
    Mem,
}

impl GridMetric {
    pub fn word(self) -> &'static str {
        match self {
            GridMetric::Util => "util %",
            GridMetric::Power => "power W",
            GridMetric::Temp => "temp °C",
            GridMetric::Mem => "mem %",
        }
    }

    pub fn next(self) -> GridMetric {
        match self {
            GridMetric::Util => GridMetric::Power,
            GridMetric::Power => GridMetric::Temp,
            GridMetric::Temp => GridMetric::Mem,
            GridMetric::Mem => GridMetric::Util,
        }
    }
}

/// One round of queries (fields, `up`, `timestamp(up)`) into a model.
pub fn fetch(
    prom: &Prometheus,
    previous: Option<&ClusterModel>,
    now_s: f64,
) -> Result<ClusterModel, QueryError> {
    let fields = prom.query(&model::fields_query())?;
    let up = prom.query("up")?;
    let scraped = prom.query("timestamp(up)")?;
    Ok(ClusterModel::build(
        &Answers {
            fields: &fields,
            up: &up,
            scraped: &scraped,
        },
        now_s,
        previous,
    ))
}

/// What the poller sends.
#[derive(Debug)]
pub enum Polled {
    Model(Box<ClusterModel>),
    Failed(String),
}

/// The query thread: one round per interval; ends when the receiver is dropped.
pub struct Poller {
    pub rx: mpsc::Receiver<Polled>,
}

impl Poller {
    pub fn start(prom: Prometheus, every: Duration) -> Poller {
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("cluster-query".into())
            .spawn(move || {
                let mut previous: Option<ClusterModel> = None;
                loop {
                    let started = Instant::now();
                    let update = match fetch(&prom, previous.as_ref(), crate::telemetry::now_s()) {
                        Ok(m) => {
                            previous = Some(m.clone());
                            Polled::Model(Box::new(m))
                        }
                        Err(e) => Polled::Failed(e.to_string()),
                    };
                    if tx.send(update).is_err() {
                        return;
                    }
                    std::thread::sleep(every.saturating_sub(started.elapsed()));
                }
            })
            .expect("spawning the cluster query thread");
        Poller { rx }
    }
}

/// `gpupilot attach --host HOST` by this very binary: what `a` runs on the selected node.
pub fn attach_command(exe: &Path, host: &str) -> Command {
    let mut cmd = Command::new(exe);
    cmd.arg("attach").arg("--host").arg(host);
    cmd
}

/// Run `cmd` (an [`attach_command`]) on the terminal and wait for it. Its stderr is read
/// here: Ok with what it said last when it succeeds (`detached; run … goes on`), Err with
/// what it said (why ssh failed) when it does not.
pub fn run_attach(mut cmd: Command) -> Result<String, String> {
    let mut child = cmd
        .stdin(Stdio::inherit())
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("running {}: {e}", cmd.get_program().to_string_lossy()))?;
    let mut said = String::new();
    if let Some(mut err) = child.stderr.take() {
        let _ = err.read_to_string(&mut said);
    }
    let status = child
        .wait()
        .map_err(|e| format!("waiting for attach: {e}"))?;
    let lines: Vec<&str> = said
        .lines()
        .map(|l| l.trim())
        .map(|l| l.strip_prefix("gpupilot: ").unwrap_or(l))
        .filter(|l| !l.is_empty())
        .collect();
    if status.success() {
        Ok(lines.last().map_or(String::new(), |l| l.to_string()))
    } else if lines.is_empty() {
        Err(format!("attach ended with {status}"))
    } else {
        Err(lines.join(" "))
    }
}

/// Run the view in the terminal until q.
pub fn run_terminal(prom: Prometheus, metric: GridMetric, every: Duration) -> anyhow::Result<()> {
    use crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
    let poller = Poller::start(prom.clone(), every);
    let (runs_tx, runs_rx) = mpsc::channel();
    let paths = crate::config::Paths::from_env();
    std::thread::Builder::new()
        .name("cluster-runs".into())
        .spawn(move || jobs::poll_runs(paths, jobs::RUNS_EVERY, runs_tx))?;
    let mut state = view::ViewState::new(&prom.base, metric);
    state.color = !crate::config::theme::no_color_env();
    // Prometheus's model, the daemon's runs, and the two together (what is drawn).
    let mut prom_model = ClusterModel::default();
    let mut runs: Vec<crate::protocol::RunInfo> = Vec::new();
    let mut model = ClusterModel::default();
    let mut last_answer: Option<Instant> = None;
    let mut terminal = ratatui::init();
    let result = (|| -> anyhow::Result<()> {
        let mut dirty = true;
        let mut last_draw = Instant::now();
        loop {
            let mut changed = false;
            while let Ok(u) = poller.rx.try_recv() {
                match u {
                    Polled::Model(m) => {
                        state.now_s = Some(m.time_s);
                        prom_model = *m;
                        state.error = None;
                        last_answer = Some(Instant::now());
                        changed = true;
                    }
                    Polled::Failed(e) => state.error = Some(e),
                }
                dirty = true;
            }
            while let Ok(r) = runs_rx.try_recv() {
                changed |= r != runs;
                runs = r;
            }
            if changed {
                model = jobs::mark(prom_model.clone(), &runs);
                dirty = true;
            }
            if let Some(host) = state.attach.take() {
                // The console takes the terminal; the view comes back when it quits.
                ratatui::restore();
                let done = match std::env::current_exe() {
                    Ok(exe) => run_attach(attach_command(&exe, &host)),
                    Err(e) => Err(format!("finding the gpupilot binary: {e}")),
                };
                terminal = ratatui::init();
                terminal.clear()?;
                state.notice = Some(match done {
                    Ok(said) if said.is_empty() => view::Notice::Info(format!("back from {host}")),
                    Ok(said) => view::Notice::Info(format!("back from {host}: {said}")),
                    Err(e) => view::Notice::Error(e),
                });
                dirty = true;
            }
            // The age line moves once a second even without answers.
            if last_draw.elapsed() >= Duration::from_secs(1) {
                dirty = true;
            }
            if dirty {
                state.age_s = last_answer.map(|t| t.elapsed().as_secs_f64());
                terminal.draw(|f| view::render(f, &model, &state))?;
                last_draw = Instant::now();
                dirty = false;
            }
            if event::poll(Duration::from_millis(200))? {
                let Event::Key(k) = event::read()? else {
                    dirty = true;
                    continue;
                };
                if k.kind != KeyEventKind::Press {
                    continue;
                }
                let key = match k.code {
                    KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => {
                        return Ok(());
                    }
                    KeyCode::Char(c) => view::Key::Char(c),
                    KeyCode::Tab => view::Key::Char('\t'),
                    KeyCode::Up => view::Key::Up,
                    KeyCode::Down => view::Key::Down,
                    KeyCode::Enter => view::Key::Enter,
                    KeyCode::Esc => view::Key::Esc,
                    KeyCode::Backspace => view::Key::Backspace,
                    _ => continue,
                };
                if state.key(key, &model) {
                    return Ok(());
                }
                dirty = true;
            }
        }
    })();
    ratatui::restore();
    result
}

#[cfg(test)]
mod attach_tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.arg("-c").arg(script).stdin(Stdio::null());
        c
    }

    #[test]
    fn attach_says_how_it_ended() {
        assert_eq!(
            run_attach(sh("echo 'gpupilot: detached; run r goes on' >&2")),
            Ok("detached; run r goes on".into())
        );
        assert_eq!(run_attach(sh("true")), Ok(String::new()));
        assert_eq!(
            run_attach(sh(
                "echo 'gpupilot: no gpupilot daemon reachable' >&2; exit 1"
            )),
            Err("no gpupilot daemon reachable".into())
        );
        let e = run_attach(sh("exit 3")).unwrap_err();
        assert!(e.contains("attach ended with") && e.contains('3'), "{e}");
        let e = run_attach(Command::new("/nonexistent/gpupilot")).unwrap_err();
        assert!(e.starts_with("running /nonexistent/gpupilot: "), "{e}");
    }

    #[test]
    fn the_command_is_attach_host() {
        let c = attach_command(Path::new("/usr/bin/gpupilot"), "gpu-node-07");
        assert_eq!(c.get_program(), "/usr/bin/gpupilot");
        let args: Vec<_> = c.get_args().collect();
        assert_eq!(args, ["attach", "--host", "gpu-node-07"]);
    }
}
