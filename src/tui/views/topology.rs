//! The Topology view: how the node's GPUs are wired, as `nvidia-smi topo -m` shows it (NV#,
//! PIX, PXB, PHB, NODE, SYS; CPU and NUMA affinity), with each GPU's NVLink traffic now under
//! it, and each link's where the terminal is wide enough. The wiring comes from the node's
//! facts (read once by the daemon), the traffic from every snapshot.

use super::Ctx;
use crate::telemetry::nvlink::{NodeTopology, NvLinkSample, rate_text};
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Padding, Paragraph, Widget, Wrap};

/// Width of a matrix column.
const CELL: usize = 6;
/// Width of the traffic table's first column.
const LABEL: usize = 8;
/// Terminal width from which each link's traffic gets its own column.
const PER_LINK_MIN_WIDTH: u16 = 120;

/// The view: reads the node's topology and the newest samples, changes nothing.
pub struct TopologyView<'a> {
    pub ctx: Ctx<'a>,
}

impl Widget for TopologyView<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let t = self.ctx.theme;
        let snap = self.ctx.data.snapshot.as_ref();
        let topo = snap.and_then(|s| s.node.topology.as_ref());
        let block = Block::bordered()
            .border_style(t.border)
            .title(Span::styled(" Topology ", t.title))
            .padding(Padding::horizontal(1));
        let Some(topo) = topo else {
            let text = if snap.is_none() {
                self.ctx.data.no_snapshot_text()
            } else {
                "No topology for this node: NVML did not report NVLink, PCIe levels or CPU \
                 affinity (the simulator has none). On an NVLink node this shows the \
                 `nvidia-smi topo -m` matrix and each GPU's NVLink traffic."
                    .to_string()
            };
            Paragraph::new(text)
                .style(t.dim)
                .wrap(Wrap { trim: true })
                .block(block)
                .render(area, buf);
            return;
        };
        let gpus = snap.map(|s| s.gpus.as_slice()).unwrap_or_default();
        let mut lines = matrix_lines(&self.ctx, topo);
        let nvlinks: Vec<(u32, &NvLinkSample)> = gpus
            .iter()
            .filter_map(|g| g.nvlink.as_ref().map(|n| (g.index, n)))
            .collect();
        if !nvlinks.is_empty() {
            lines.push(Line::raw(""));
            lines.extend(traffic_lines(
                &self.ctx,
                &nvlinks,
                area.width >= PER_LINK_MIN_WIDTH,
            ));
        }
        let inner_rows = area.height.saturating_sub(2) as usize;
        if lines.len() + 2 <= inner_rows {
            lines.push(Line::raw(""));
            lines.push(Line::styled(
                "NV# = # NVLinks (through NVSwitch: the fewer of the two GPUs' links up) · PIX one \
                 PCIe switch · PXB several · PHB a host bridge · NODE within a NUMA node · SYS \
                 across sockets",
                t.dim,
            ));
        }
        Paragraph::new(lines)
            .wrap(Wrap { trim: false })
            .block(block)
            .render(area, buf);
    }
}

/// The matrix: a header of GPUs, then one row per GPU with its cells, CPU affinity and NUMA node.
fn matrix_lines<'a>(ctx: &Ctx<'a>, topo: &'a NodeTopology) -> Vec<Line<'a>> {
    let t = ctx.theme;
    let n = topo.matrix.len();
    let mut header = vec![Span::styled(format!("{:<CELL$}", ""), t.dim)];
    for j in 0..n {
        header.push(Span::styled(format!("{:<CELL$}", format!("GPU{j}")), t.dim));
    }
    header.push(Span::styled(format!("{:<14}", "CPU Affinity"), t.dim));
    header.push(Span::styled("NUMA", t.dim));
    let mut lines = vec![Line::from(header)];
    for (i, row) in topo.matrix.iter().enumerate() {
        let mut spans = vec![Span::styled(format!("{:<CELL$}", format!("GPU{i}")), t.dim)];
        for cell in row {
            let style: Style = if cell.starts_with("NV") {
                t.ok
            } else if cell == "X" {
                t.dim
            } else if cell == "N/A" {
                t.na
            } else {
                t.text
            };
            spans.push(Span::styled(format!("{cell:<CELL$}"), style));
        }
        let place = topo.gpus.get(i);
        let cpus = place
            .and_then(|p| p.cpu_affinity.as_deref())
            .unwrap_or("N/A");
        let numa = place
            .and_then(|p| p.numa_node)
            .map_or("N/A".to_string(), |v| v.to_string());
        spans.push(Span::styled(format!("{cpus:<14}"), t.text));
        spans.push(Span::styled(numa, t.text));
        lines.push(Line::from(spans));
    }
    lines
}

/// Each GPU's NVLinks now: links up, TX and RX, the links down; with `per_link`, every link's
/// TX in GB/s (`--` where it is down).
fn traffic_lines<'a>(
    ctx: &Ctx<'a>,
    gpus: &[(u32, &NvLinkSample)],
    per_link: bool,
) -> Vec<Line<'a>> {
    let t = ctx.theme;
    let mut header = format!("{:<LABEL$}{:<7}{:>11}{:>11}  ", "NVLink", "up", "TX", "RX");
    if per_link {
        header.push_str("TX per link, GB/s");
    } else {
        header.push_str("down");
    }
    let mut lines = vec![Line::styled(header, t.dim)];
    for (i, n) in gpus {
        let down = n.down();
        let up_style = if down.is_empty() { t.ok } else { t.warn };
        let na = |v: Option<f64>| v.map_or("N/A".to_string(), rate_text);
        let mut spans = vec![
            Span::styled(format!("{:<LABEL$}", format!("GPU{i}")), t.dim),
            Span::styled(
                format!("{:<7}", format!("{}/{}", n.links_up, n.links)),
                up_style,
            ),
            Span::styled(format!("{:>11}", na(n.tx_bytes_s)), t.text),
            Span::styled(format!("{:>11}  ", na(n.rx_bytes_s)), t.text),
        ];
        if per_link {
            for l in &n.per_link {
                let (text, style) = match (l.up, l.tx_bytes_s) {
                    (Some(false), _) => ("--".to_string(), t.warn),
                    (_, Some(b)) => (format!("{:.1}", b / 1e9), t.text),
                    (_, None) => ("N/A".to_string(), t.na),
                };
                spans.push(Span::styled(format!("{text:<5}"), style));
            }
        } else if !down.is_empty() {
            let list = down
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",");
            let word = if down.len() == 1 { "link" } else { "links" };
            spans.push(Span::styled(format!("{word} {list}"), t.warn));
        }
        lines.push(Line::from(spans));
    }
    lines
}
