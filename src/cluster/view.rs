//! The cluster view: a grid of nodes × GPUs coloured by the chosen metric, the totals, and one
//! node's GPUs in detail. [`ViewState`] holds what the keys change; [`render`] borrows the model
//! and the state and changes nothing.

use crate::text::printable;
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Row, Table};

use super::GridMetric;
use super::model::{ClusterModel, GpuCell, Node, NodeState};

/// How the nodes are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sort {
    Name,
    /// The chosen metric's node mean, highest first.
    MetricDesc,
    /// Nodes that do not answer first, then by name.
    State,
}

impl Sort {
    fn next(self) -> Sort {
        match self {
            Sort::Name => Sort::MetricDesc,
            Sort::MetricDesc => Sort::State,
            Sort::State => Sort::Name,
        }
    }
    fn word(self) -> &'static str {
        match self {
            Sort::Name => "name",
            Sort::MetricDesc => "metric",
            Sort::State => "state",
        }
    }
}

/// What the keys change.
#[derive(Debug, Clone)]
pub struct ViewState {
    pub metric: GridMetric,
    pub sort: Sort,
    /// Nodes whose name contains this (case-insensitive).
    pub filter: String,
    /// Typing a filter now.
    pub editing_filter: bool,
    /// Index into the visible (sorted, filtered) nodes.
    pub selected: usize,
    /// The node shown in detail (its instance).
    pub detail: Option<String>,
    /// Where the data comes from, for the title.
    pub source: String,
    /// The newest query error, if the newest round failed.
    pub error: Option<String>,
    /// Seconds since the newest answer (None: none yet).
    pub age_s: Option<f64>,
    /// The model's time, for ages.
    pub now_s: Option<f64>,
    pub color: bool,
    /// `a` asked for the console on this host (the loop takes it and runs `attach --host`).
    pub attach: Option<String>,
    /// What the last attach said: how it ended, or why it failed.
    pub notice: Option<Notice>,
}

/// A line about the last attach, shown under the header until the next key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    Info(String),
    Error(String),
}

/// A key's effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    Char(char),
    Up,
    Down,
    Enter,
    Esc,
    Backspace,
}

impl ViewState {
    pub fn new(source: &str, metric: GridMetric) -> ViewState {
        ViewState {
            metric,
            sort: Sort::Name,
            filter: String::new(),
            editing_filter: false,
            selected: 0,
            detail: None,
            source: source.to_string(),
            error: None,
            age_s: None,
            now_s: None,
            color: true,
            attach: None,
            notice: None,
        }
    }

    /// The nodes shown, in order.
    pub fn visible<'m>(&self, model: &'m ClusterModel) -> Vec<&'m Node> {
        let f = self.filter.to_lowercase();
        let mut v: Vec<&Node> = model
            .nodes
            .iter()
            .filter(|n| f.is_empty() || n.name.to_lowercase().contains(&f))
            .collect();
        match self.sort {
            Sort::Name => v.sort_by(|a, b| a.name.cmp(&b.name)),
            Sort::MetricDesc => v.sort_by(|a, b| {
                let (x, y) = (a.mean(self.metric), b.mean(self.metric));
                y.partial_cmp(&x)
                    .unwrap_or(std::cmp::Ordering::Equal)
                    .then_with(|| a.name.cmp(&b.name))
            }),
            Sort::State => {
                v.sort_by(|a, b| b.state.cmp(&a.state).then_with(|| a.name.cmp(&b.name)))
            }
        }
        v
    }

    /// Apply a key; true when the view should end (q).
    pub fn key(&mut self, key: Key, model: &ClusterModel) -> bool {
        if self.editing_filter {
            match key {
                Key::Enter | Key::Esc => self.editing_filter = false,
                Key::Backspace => {
                    self.filter.pop();
                }
                Key::Char(c) => self.filter.push(c),
                _ => {}
            }
            self.selected = 0;
            return false;
        }
        let n = self.visible(model).len();
        self.notice = None;
        match key {
            Key::Char('q') => return true,
            Key::Esc if self.detail.is_some() => self.detail = None,
            Key::Esc if !self.filter.is_empty() => self.filter.clear(),
            Key::Char('u') => self.metric = GridMetric::Util,
            Key::Char('p') => self.metric = GridMetric::Power,
            Key::Char('t') => self.metric = GridMetric::Temp,
            Key::Char('m') => self.metric = GridMetric::Mem,
            Key::Char('\t') | Key::Char('c') => self.metric = self.metric.next(),
            Key::Char('s') => self.sort = self.sort.next(),
            Key::Char('/') => {
                self.editing_filter = true;
                self.detail = None;
            }
            Key::Up | Key::Char('k') => self.selected = self.selected.saturating_sub(1),
            Key::Down | Key::Char('j') => {
                self.selected = (self.selected + 1).min(n.saturating_sub(1))
            }
            Key::Char('a') => {
                let node = match &self.detail {
                    Some(i) => model.nodes.iter().find(|n| &n.instance == i),
                    None => self
                        .visible(model)
                        .get(self.selected.min(n.saturating_sub(1)))
                        .copied(),
                };
                self.attach = node.map(super::jobs::ssh_host);
            }
            Key::Enter => {
                self.detail = self
                    .visible(model)
                    .get(self.selected)
                    .map(|n| n.instance.clone());
            }
            _ => {}
        }
        false
    }
}

/// Green (cool) → yellow → red (hot).
fn heat_color(x: f64) -> Color {
    let x = x.clamp(0.0, 1.0);
    let (r, g) = if x < 0.5 {
        ((x * 2.0 * 220.0) as u8, 180)
    } else {
        (220, ((1.0 - x) * 2.0 * 180.0) as u8)
    };
    Color::Rgb(r, g, 40)
}

fn fmt(v: Option<f64>, width: usize) -> String {
    match v {
        Some(v) if v >= 9999.5 => format!("{:>w$.0}k", v / 1000.0, w = width - 1),
        Some(v) => format!("{v:>width$.0}"),
        None => format!("{:>width$}", "N/A"),
    }
}

fn kw(w: f64) -> String {
    if w >= 1000.0 {
        format!("{:.1} kW", w / 1000.0)
    } else {
        format!("{w:.0} W")
    }
}

/// Draw the view.
pub fn render(frame: &mut Frame<'_>, model: &ClusterModel, state: &ViewState) {
    let area = frame.area();
    if area.width < 40 || area.height < 8 {
        frame.render_widget(
            Paragraph::new("terminal too small for the cluster view (40×8 at least)"),
            area,
        );
        return;
    }
    // An attach's message wraps over up to three lines (SSH's reasons are long).
    let notice_lines = state.notice.as_ref().map_or(0, |n| {
        let len = match n {
            Notice::Info(m) => m.chars().count(),
            Notice::Error(m) => m.chars().count() + "attach failed: ".len(),
        };
        len.div_ceil(area.width as usize).clamp(1, 3) as u16
    });
    let head_lines = 2 + u16::from(state.error.is_some()) + notice_lines;
    let [head, body, foot] = Layout::vertical([
        Constraint::Length(head_lines),
        Constraint::Min(1),
        Constraint::Length(1),
    ])
    .areas(area);
    frame.render_widget(
        Paragraph::new(header(model, state)).wrap(ratatui::widgets::Wrap { trim: false }),
        head,
    );
    let detail = state
        .detail
        .as_ref()
        .and_then(|i| model.nodes.iter().find(|n| &n.instance == i));
    match detail {
        Some(node) => render_detail(frame, body, node, state),
        None => render_grid(frame, body, model, state),
    }
    let keys = if state.editing_filter {
        format!("filter: {}▏  Enter/Esc done", state.filter)
    } else if detail.is_some() {
        "Esc back · u/p/t/m metric · a attach · q quit".to_string()
    } else {
        "u/p/t/m metric · s sort · / filter · ↑↓ select · Enter node · a attach · q quit"
            .to_string()
    };
    frame.render_widget(
        Paragraph::new(keys).style(Style::default().add_modifier(Modifier::DIM)),
        foot,
    );
}

fn header(model: &ClusterModel, state: &ViewState) -> Vec<Line<'static>> {
    let t = model.totals();
    let mut nodes = format!("{} nodes ({} up", t.nodes, t.nodes_up);
    for (n, w) in [
        (t.nodes_stale, "stale"),
        (t.nodes_down, "down"),
        (t.nodes_missing, "missing"),
    ] {
        if n > 0 {
            nodes.push_str(&format!(", {n} {w}"));
        }
    }
    nodes.push(')');
    let first = Line::from(vec![
        Span::styled("cluster ", Style::default().add_modifier(Modifier::BOLD)),
        Span::raw(format!(
            "{nodes} · {} GPUs: {} busy, {} idle · {} · {:.1} kWh",
            t.gpus,
            t.gpus_busy,
            t.gpus_idle,
            kw(t.power_w),
            t.energy_kwh
        )),
    ]);
    let status = match (&state.error, state.age_s) {
        (Some(e), _) => Span::styled(
            format!("query failed: {}", printable(e)),
            Style::default().fg(Color::Red),
        ),
        (None, None) => Span::raw("waiting for the first answer…".to_string()),
        (None, Some(a)) => Span::raw(format!("updated {a:.0}s ago")),
    };
    let mut filter = String::new();
    if !state.filter.is_empty() {
        filter = format!(" · filter \"{}\"", printable(&state.filter));
    }
    // A failure takes the whole line (it names the URL): what to fix comes first.
    let second = if state.error.is_some() {
        Line::from(vec![status])
    } else {
        Line::from(vec![
            Span::raw(format!(
                "{} · colour: {} · sort: {}{filter} · ",
                state.source,
                state.metric.word(),
                state.sort.word()
            )),
            status,
        ])
    };
    let mut lines = vec![first, second];
    match &state.notice {
        Some(Notice::Info(m)) => lines.push(Line::raw(printable(m))),
        Some(Notice::Error(m)) => lines.push(Line::styled(
            format!("attach failed: {}", printable(m)),
            Style::default().fg(Color::Red),
        )),
        None => {}
    }
    lines
}

/// The grid's job column: each live Slurm job on the node, `run #job`.
fn jobs_label(n: &Node) -> String {
    printable(
        &n.jobs
            .iter()
            .map(|j| j.label())
            .collect::<Vec<_>>()
            .join(", "),
    )
}

fn state_style(s: NodeState) -> Style {
    match s {
        NodeState::Up => Style::default(),
        NodeState::Stale => Style::default().fg(Color::Yellow),
        NodeState::Down | NodeState::Missing => Style::default().fg(Color::Red),
    }
}

fn cell_span(g: &GpuCell, metric: GridMetric, node_state: NodeState, color: bool) -> Span<'static> {
    const W: usize = 4;
    if g.lost {
        return Span::styled(format!("{:>W$} ", "LOST"), Style::default().fg(Color::Red));
    }
    let text = format!("{} ", fmt(g.value(metric), W));
    let current = node_state == NodeState::Up && !g.stale;
    let style = match (color, current, g.heat(metric)) {
        (true, true, Some(h)) => Style::default().fg(Color::Black).bg(heat_color(h)),
        (_, false, _) => Style::default().add_modifier(Modifier::DIM),
        _ => Style::default(),
    };
    Span::styled(text, style)
}

fn render_grid(frame: &mut Frame<'_>, area: Rect, model: &ClusterModel, state: &ViewState) {
    let nodes = state.visible(model);
    if nodes.is_empty() {
        let msg = if model.nodes.is_empty() {
            "no GPU series in Prometheus yet (DCGM_FI_DEV_GPU_UTIL…): are the daemons' /metrics \
             (or dcgm-exporters) in its scrape configuration?"
        } else {
            "no node matches the filter (Esc clears it)"
        };
        frame.render_widget(
            Paragraph::new(msg).wrap(ratatui::widgets::Wrap { trim: true }),
            area,
        );
        return;
    }
    let name_w = nodes
        .iter()
        .map(|n| printable(&n.name).chars().count())
        .max()
        .unwrap_or(4)
        .clamp(4, (area.width as usize / 4).max(8));
    let rows = area.height as usize;
    let selected = state.selected.min(nodes.len() - 1);
    let first = selected.saturating_sub(rows.saturating_sub(1));
    let mut lines = Vec::with_capacity(rows);
    // The job column, when a visible node has a job: as wide as the widest label, within a
    // quarter of the width.
    let job_w = nodes
        .iter()
        .map(|n| jobs_label(n).chars().count())
        .max()
        .unwrap_or(0)
        .min(area.width as usize / 4);
    let job_room = if job_w > 0 { job_w + 3 } else { 0 };
    let cells_room = (area.width as usize).saturating_sub(name_w + 8 + 12 + job_room) / 5;
    for (i, n) in nodes.iter().enumerate().skip(first).take(rows) {
        let mut name: String = printable(&n.name).chars().take(name_w).collect();
        while name.chars().count() < name_w {
            name.push(' ');
        }
        let mark = if i == selected { "▶" } else { " " };
        let mut spans = vec![
            Span::styled(
                format!("{mark}{name} "),
                if i == selected {
                    Style::default().add_modifier(Modifier::BOLD)
                } else {
                    Style::default()
                },
            ),
            Span::styled(format!("{:<7} ", n.state.word()), state_style(n.state)),
        ];
        for g in n.gpus.iter().take(cells_room) {
            spans.push(cell_span(g, state.metric, n.state, state.color));
        }
        if n.gpus.len() > cells_room {
            spans.push(Span::raw(format!("+{} ", n.gpus.len() - cells_room)));
        }
        spans.push(Span::raw(format!(
            "│ {:>8}",
            n.power_w().map_or("N/A".to_string(), kw)
        )));
        lines.push((spans, n));
    }
    // The job column lines up after the widest row (a node with fewer GPUs, or none).
    let widest = lines
        .iter()
        .map(|(spans, _)| spans.iter().map(|s| s.width()).sum::<usize>())
        .max()
        .unwrap_or(0);
    let lines: Vec<Line> = lines
        .into_iter()
        .map(|(mut spans, n)| {
            if !n.jobs.is_empty() {
                let w: usize = spans.iter().map(|s| s.width()).sum();
                let label: String = jobs_label(n).chars().take(job_w).collect();
                spans.push(Span::raw(format!("{:pad$} │ ", "", pad = widest - w)));
                spans.push(Span::styled(label, Style::default().fg(Color::Cyan)));
            }
            Line::from(spans)
        })
        .collect();
    frame.render_widget(Paragraph::new(lines), area);
}

fn render_detail(frame: &mut Frame<'_>, area: Rect, node: &Node, state: &ViewState) {
    let scrape = match (node.last_scrape_s, state.now_s) {
        (Some(t), Some(now)) => format!(" · scraped {:.0}s ago", (now - t).max(0.0)),
        _ => String::new(),
    };
    let mut title_text = vec![
        Line::from(vec![
            Span::styled(
                printable(&node.name),
                Style::default().add_modifier(Modifier::BOLD),
            ),
            Span::raw(" · "),
            Span::styled(node.state.word().to_string(), state_style(node.state)),
            Span::raw(format!(
                " · target {} · job {}{scrape}",
                printable(&node.instance),
                printable(node.job.as_deref().unwrap_or("?"))
            )),
        ]),
        Line::raw(format!(
            "{} GPUs{} · {} · mean {} {}",
            node.gpus.len(),
            models(node),
            node.power_w().map_or("N/A".to_string(), kw),
            state.metric.word(),
            fmt(node.mean(state.metric), 1).trim()
        )),
    ];
    for j in &node.jobs {
        title_text.push(Line::styled(
            printable(&format!(
                "Slurm job {} ({}{}) · run {} ({})",
                j.job_id,
                j.state.as_deref().unwrap_or("state unknown"),
                j.partition
                    .as_deref()
                    .map_or(String::new(), |p| format!(", partition {p}")),
                j.run,
                j.run_id
            )),
            Style::default().fg(Color::Cyan),
        ));
    }
    if node.gpus.is_empty() && !node.jobs.is_empty() {
        title_text.push(Line::raw(
            "a job's node that Prometheus does not have: is its gpupilot daemon (or dcgm-exporter) \
             in the scrape configuration?",
        ));
    }
    title_text.truncate(6);
    let [title, table] = Layout::vertical([
        Constraint::Length(title_text.len() as u16),
        Constraint::Min(1),
    ])
    .areas(area);
    frame.render_widget(Paragraph::new(title_text), title);
    let header = Row::new(vec![
        "GPU",
        "util %",
        "mem GiB",
        "temp °C",
        "power W",
        "SM MHz",
        "energy kWh",
        "state",
        "UUID",
    ])
    .style(Style::default().add_modifier(Modifier::BOLD));
    let rows: Vec<Row> = node
        .gpus
        .iter()
        .map(|g| {
            let gib = |m: f64| m / 1024.0;
            let mem = match (g.mem_used_mib, g.mem_total_mib) {
                (Some(u), Some(t)) => format!("{:.1}/{:.1}", gib(u), gib(t)),
                (Some(u), None) => format!("{:.1}", gib(u)),
                _ => "N/A".into(),
            };
            let power = match (g.power_w, g.power_limit_w) {
                (Some(p), Some(c)) => format!("{p:.0}/{c:.0}"),
                (Some(p), None) => format!("{p:.0}"),
                _ => "N/A".into(),
            };
            let st = if g.lost {
                "LOST"
            } else if g.stale {
                "stale"
            } else {
                node.state.word()
            };
            Row::new(vec![
                g.index.to_string(),
                fmt(g.util_pct, 6),
                mem,
                fmt(g.temp_c, 7),
                power,
                fmt(g.sm_clock_mhz, 6),
                g.energy_mj
                    .map_or("N/A".to_string(), |e| format!("{:>10.2}", e / 3.6e9)),
                st.to_string(),
                g.uuid.as_deref().map_or_else(|| "N/A".into(), printable),
            ])
        })
        .collect();
    let widths = [
        Constraint::Length(3),
        Constraint::Length(6),
        Constraint::Length(11),
        Constraint::Length(7),
        Constraint::Length(8),
        Constraint::Length(6),
        Constraint::Length(10),
        Constraint::Length(7),
        Constraint::Min(12),
    ];
    frame.render_widget(Table::new(rows, widths).header(header), table);
}

/// ` (NVIDIA H100 80GB HBM3)`, or the models and their counts when they differ.
fn models(node: &Node) -> String {
    let mut seen: Vec<(&str, usize)> = Vec::new();
    for g in &node.gpus {
        let m = g.model.as_deref().unwrap_or("N/A");
        match seen.iter_mut().find(|(x, _)| *x == m) {
            Some((_, n)) => *n += 1,
            None => seen.push((m, 1)),
        }
    }
    match seen.as_slice() {
        [] => String::new(),
        [(m, _)] => format!(" ({})", printable(m)),
        many => {
            let parts: Vec<String> = many
                .iter()
                .map(|(m, n)| format!("{n}× {}", printable(m)))
                .collect();
            format!(" ({})", parts.join(", "))
        }
    }
}
