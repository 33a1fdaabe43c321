//! The Run view's rank table, for a run of several ranks (a data-parallel job): one row per
//! rank with where it trains (host, GPU), how far it is (step, step time, data wait) and what
//! its GPU shows in the console's newest snapshot (utilization, SM clock against its maximum,
//! temperature, power against its cap, throttle reasons). The slowest rank, where it stands
//! out from the others, is marked `▸` and highlighted; the title carries the job's figures
//! (samples/s summed, the slowest rank's step time, rank 0's loss) and the bottom border a
//! change in flight (`batch_size → 64 at step 1234 (3/4 ranks agreed)`), else the daemon's
//! straggler alert on the job (its cause and the command that acts on it).
//!
//! A rank on another host has no telemetry here (`N/A`): the snapshot is this node's. Where
//! the rows do not all fit, the slowest rank stays among those shown and the border says how
//! many are left out; where the columns do not fit, the least telling go first (host, then
//! the clocks, …). Render only reads.

use crate::control::alerts::AlertKind;
use crate::protocol::{JobFigures, RankInfo, RankSpec, StagedChange, TrainerInfo};
use crate::telemetry::{GpuSample, Snapshot, throttle, throttle_reason_badges};
use crate::tui::data::Data;
use crate::tui::format::{NA, fit};
use crate::tui::metrics::Series;
use crate::tui::theme::Theme;
use crate::tui::widgets::level;
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Row, Table, Widget};

/// Rows the table needs besides its ranks: two borders and the header.
const CHROME: u16 = 3;
/// The least worth drawing: the chrome and one rank.
pub const MIN_ROWS: u16 = CHROME + 1;

/// The trainer of a run of several ranks: its world size says so, or several ranks attached.
pub fn is_multi(t: &TrainerInfo) -> bool {
    !t.ranks.is_empty() && (t.world_size.unwrap_or(1) >= 2 || t.ranks.len() >= 2)
}

/// The trainer whose ranks the table shows for `run`, if it has several.
pub fn trainer_of<'a>(data: &'a Data, run: &str) -> Option<&'a TrainerInfo> {
    data.metrics
        .of(run)?
        .trainer
        .as_ref()
        .filter(|t| is_multi(t))
}

/// Rows the table would take with every rank shown (0: the run has no ranks to show).
pub fn wanted_rows(data: &Data, run: &str) -> u16 {
    trainer_of(data, run).map_or(0, |t| CHROME + t.ranks.len().min(u16::MAX as usize) as u16)
}

/// A change to several ranks in flight, as the table's border and the knob panel say it:
/// `batch_size → 64 at step 1234 (3/4 ranks agreed)`, then `(all agreed; 1/4 applied)`, or
/// `batch_size = 64 called off`.
pub fn staged_text(s: &StagedChange) -> String {
    let n = s.ranks.len();
    match s.committed {
        None => format!(
            "{} → {} at step {} ({}/{n} ranks agreed)",
            s.knob,
            s.value,
            s.apply_step,
            s.ready.len()
        ),
        Some(true) => format!(
            "{} → {} at step {} (all agreed; {}/{n} applied)",
            s.knob,
            s.value,
            s.apply_step,
            s.applied.len()
        ),
        Some(false) => format!("{} = {} called off", s.knob, s.value),
    }
}

/// Whether `host` (as a rank said it) is the node the snapshot is from; `gpu-node-07` and
/// `gpu-node-07.cluster.local` are the same node.
fn same_host(host: &str, node: &str) -> bool {
    let short = |h: &str| h.split('.').next().unwrap_or(h).to_ascii_lowercase();
    short(host) == short(node)
}

/// The GPU a rank trains on, in `snap`: by UUID where the rank gave one, else by index on this
/// node (a rank that names no host is taken to be local). None: another node, or not found.
pub fn gpu_of<'a>(snap: Option<&'a Snapshot>, spec: &RankSpec) -> Option<&'a GpuSample> {
    let snap = snap?;
    if let Some(uuid) = &spec.gpu_uuid {
        return snap.gpus.iter().find(|g| g.uuid.as_deref() == Some(uuid));
    }
    let local = spec
        .host
        .as_deref()
        .is_none_or(|h| same_host(h, &snap.node.hostname));
    let index = spec.gpu?;
    local
        .then(|| snap.gpus.iter().find(|g| g.index == index))
        .flatten()
}

/// What slows the slowest rank, as far as its report and its GPU tell: a data wait that takes
/// a quarter of its step or more, else its GPU held down by temperature or power.
pub fn straggler_cause(r: &RankInfo, gpu: Option<&GpuSample>) -> Option<&'static str> {
    let report = &r.last.as_ref()?.report;
    if let (Some(wait), Some(step)) = (report.data_wait_s, report.step_time_s) {
        if step > 0.0 && wait >= 0.25 * step {
            return Some("data wait");
        }
    }
    let bits = gpu?.throttle_reasons?;
    if throttle::thermal_limited(bits) {
        Some("thermal slowdown")
    } else if throttle::power_limited(bits) {
        Some("power cap")
    } else if bits & throttle::HW_SLOWDOWN != 0 {
        Some("hardware slowdown")
    } else {
        None
    }
}

/// The message of the daemon's straggler alert on `run`, while one is raised (the advisor's
/// verdict: which rank, by how much, the cause its GPU shows and the command that acts on it).
pub fn straggler_alert<'a>(data: &'a Data, run: &str) -> Option<&'a str> {
    data.control
        .as_ref()?
        .alerts
        .iter()
        .find(|a| a.kind == AlertKind::Straggler && a.run.as_deref() == Some(run))
        .map(|a| a.message.as_str())
        .filter(|m| !m.is_empty())
}

/// The slowest rank is marked only when it is slower than the others by this share of their
/// median step time or more: ranks in step (a job at one pace) have no slowest worth a look.
pub const SLOWEST_MARGIN: f64 = 0.02;

/// The rank to mark as the slowest: the job's slowest, when its step time stands out from the
/// others' (see [`SLOWEST_MARGIN`]).
pub fn marked_slowest(ranks: &[RankInfo], slowest: Option<u32>) -> Option<u32> {
    let step = |r: &RankInfo| {
        r.last
            .as_ref()?
            .report
            .step_time_s
            .filter(|s| s.is_finite())
    };
    let s = slowest?;
    let own = step(ranks.iter().find(|r| r.spec.rank == s)?)?;
    let mut others: Vec<f64> = ranks
        .iter()
        .filter(|r| r.spec.rank != s)
        .filter_map(step)
        .collect();
    if others.is_empty() {
        return None;
    }
    others.sort_by(f64::total_cmp);
    let n = others.len();
    let median = if n % 2 == 1 {
        others[n / 2]
    } else {
        (others[n / 2 - 1] + others[n / 2]) / 2.0
    };
    (own >= median * (1.0 + SLOWEST_MARGIN)).then_some(s)
}

/// The ranks to show in `rows` rows, by rank: all when they fit, else the lowest ones with the
/// slowest kept in (in place of the last that would fit).
pub fn shown(ranks: &[RankInfo], slowest: Option<u32>, rows: usize) -> Vec<&RankInfo> {
    let mut sorted: Vec<&RankInfo> = ranks.iter().collect();
    sorted.sort_by_key(|r| r.spec.rank);
    if sorted.len() <= rows {
        return sorted;
    }
    let mut out: Vec<&RankInfo> = sorted.iter().take(rows).copied().collect();
    if let Some(s) = slowest {
        let missing = !out.iter().any(|r| r.spec.rank == s);
        let slow = sorted.iter().find(|r| r.spec.rank == s);
        if let (true, Some(slow), Some(last)) = (missing, slow, out.last_mut()) {
            *last = slow;
        }
    }
    out
}

/// The job's figures as the title says them, longest first (the slowest rank named where it is
/// `marked`); the caller takes the first that fits.
fn job_texts(job: &JobFigures, marked: Option<u32>, cause: Option<&str>) -> Vec<String> {
    let sps = job
        .samples_per_s
        .map_or_else(|| NA.to_string(), |v| Series::SamplesPerS.format(v));
    let step = job
        .step_time_s
        .map_or_else(|| NA.to_string(), |v| Series::StepTime.format(v));
    let loss = job
        .loss
        .map_or_else(|| NA.to_string(), |v| Series::Loss.format(v));
    let slowest = |long: bool| match (marked, cause) {
        (Some(r), Some(c)) if long => format!(" (slowest: rank {r}, {c})"),
        (Some(r), _) if long => format!(" (slowest: rank {r})"),
        (Some(r), _) => format!(" (rank {r})"),
        (None, _) => String::new(),
    };
    vec![
        format!(
            "job {sps} samples/s · step time {step}{} · loss {loss}",
            slowest(true)
        ),
        format!(
            "job {sps} samples/s · step {step}{} · loss {loss}",
            slowest(false)
        ),
        format!("job {sps} samples/s · step {step} · loss {loss}"),
    ]
}

/// One column of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Col {
    Rank,
    Host,
    Gpu,
    Step,
    StepTime,
    DataWait,
    Util,
    Sm,
    Temp,
    Power,
    Throttle,
}

impl Col {
    const ALL: [Col; 11] = [
        Col::Rank,
        Col::Host,
        Col::Gpu,
        Col::Step,
        Col::StepTime,
        Col::DataWait,
        Col::Util,
        Col::Sm,
        Col::Temp,
        Col::Power,
        Col::Throttle,
    ];

    /// Left out first when the table is too narrow: the host (the title names a single one),
    /// then the figures that tell least about a straggler.
    const DROP: [Col; 8] = [
        Col::Host,
        Col::Sm,
        Col::Util,
        Col::Power,
        Col::Temp,
        Col::Gpu,
        Col::Throttle,
        Col::DataWait,
    ];

    fn header(self) -> &'static str {
        match self {
            Col::Rank => "RANK",
            Col::Host => "HOST",
            Col::Gpu => "GPU",
            Col::Step => "STEP",
            Col::StepTime => "STEP TIME",
            Col::DataWait => "DATA WAIT",
            Col::Util => "UTIL",
            Col::Sm => "SM MHZ",
            Col::Temp => "TEMP",
            Col::Power => "POWER",
            Col::Throttle => "THROTTLE",
        }
    }

    /// Numbers are right-aligned under their header.
    fn right(self) -> bool {
        !matches!(self, Col::Rank | Col::Host | Col::Throttle)
    }
}

/// One rank's cells, with their styles.
struct RankRow {
    cells: Vec<(String, Style)>,
    style: Style,
}

fn rank_row(t: &Theme, r: &RankInfo, gpu: Option<&GpuSample>, slowest: bool) -> RankRow {
    let report = r.last.as_ref().map(|p| &p.report);
    let na = || (NA.to_string(), t.na);
    let or_na = |v: Option<String>, style: Style| v.map_or_else(na, |s| (s, style));
    // The rank's own figures take the row's style (text, the slowest's highlight, or dim).
    let plain = Style::default();
    let series = |s: Series, v: Option<f64>| or_na(v.map(|v| s.format(v)), plain);
    let live = gpu.filter(|g| !g.lost);
    let cells = Col::ALL
        .iter()
        .map(|c| match c {
            Col::Rank => (
                format!("{}{:>3}", if slowest { "▸" } else { " " }, r.spec.rank),
                plain,
            ),
            Col::Host => or_na(r.spec.host.clone(), plain),
            Col::Gpu => or_na(r.spec.gpu.map(|g| g.to_string()), plain),
            Col::Step => or_na(report.and_then(|p| p.step).map(|s| s.to_string()), plain),
            Col::StepTime => series(Series::StepTime, report.and_then(|p| p.step_time_s)),
            Col::DataWait => series(Series::DataWait, report.and_then(|p| p.data_wait_s)),
            Col::Util => or_na(
                live.and_then(|g| g.util_gpu_pct)
                    .map(|u| format!("{u:.0} %")),
                t.util,
            ),
            Col::Sm => match live.and_then(|g| g.sm_clock_mhz) {
                None => na(),
                Some(v) => match live.and_then(|g| g.sm_clock_max_mhz) {
                    Some(m) => (format!("{v}/{m}"), t.clock),
                    None => (v.to_string(), t.clock),
                },
            },
            Col::Temp => {
                let temp = live.and_then(|g| g.temperature_c);
                let limit = live.and_then(|g| g.temp_slowdown_c);
                or_na(
                    temp.map(|v| format!("{v:.0} °C")),
                    level(t, temp, limit, 0.9, 1.0),
                )
            }
            Col::Power => {
                let p = live.and_then(|g| g.power_w);
                let cap = live.and_then(|g| g.power_limit_w);
                let text = p.map(|p| match cap {
                    Some(c) => format!("{p:.0}/{c:.0} W"),
                    None => format!("{p:.0} W"),
                });
                or_na(text, level(t, p, cap, 0.95, 0.99))
            }
            Col::Throttle => throttle_cell(t, r, gpu),
        })
        .collect();
    let style = if !r.attached {
        t.dim
    } else if slowest {
        t.warn
    } else {
        t.text
    };
    RankRow { cells, style }
}

/// The last column: a rank that left, a GPU that fell off the bus, else its throttle reasons.
fn throttle_cell(t: &Theme, r: &RankInfo, gpu: Option<&GpuSample>) -> (String, Style) {
    if !r.attached {
        return ("detached".into(), t.dim);
    }
    let Some(g) = gpu else {
        return (NA.into(), t.na);
    };
    if g.lost {
        return ("LOST".into(), t.lost);
    }
    match g.throttle_reasons {
        None => (NA.into(), t.na),
        Some(0) => ("-".into(), t.dim),
        Some(bits) => {
            let style = if throttle::held(bits).any() {
                t.badge_warn
            } else {
                t.badge
            };
            (throttle_reason_badges(bits).join(" "), style)
        }
    }
}

/// The columns that fit `width`, with their widths (the last takes what is left).
fn columns(rows: &[RankRow], width: u16) -> Vec<(usize, u16)> {
    let natural: Vec<u16> = Col::ALL
        .iter()
        .enumerate()
        .map(|(i, c)| {
            rows.iter()
                .map(|r| r.cells[i].0.chars().count())
                .chain([c.header().len()])
                .max()
                .unwrap_or(0)
                .min(24) as u16
        })
        .collect();
    let mut keep: Vec<usize> = (0..Col::ALL.len()).collect();
    let need = |keep: &[usize]| -> u16 {
        keep.iter().map(|&i| natural[i]).sum::<u16>() + keep.len().saturating_sub(1) as u16
    };
    // The throttle column may be cut to its header's width before anything is left out.
    let throttle = Col::ALL.len() - 1;
    let floor = |keep: &[usize]| -> u16 {
        need(keep) - natural[throttle] + natural[throttle].min(Col::Throttle.header().len() as u16)
    };
    for drop in Col::DROP {
        let fits = if keep.contains(&throttle) {
            floor(&keep) <= width
        } else {
            need(&keep) <= width
        };
        if fits {
            break;
        }
        let i = Col::ALL.iter().position(|c| *c == drop).unwrap_or(0);
        keep.retain(|&k| k != i);
    }
    let used: u16 = keep
        .iter()
        .filter(|&&i| i != throttle)
        .map(|&i| natural[i] + 1)
        .sum();
    keep.iter()
        .map(|&i| {
            if i == throttle {
                (i, width.saturating_sub(used))
            } else {
                (i, natural[i])
            }
        })
        .collect()
}

/// Draw the rank table of `trainer` (a run of several ranks) in `area`.
pub fn render(
    t: &Theme,
    data: &Data,
    run: &str,
    trainer: &TrainerInfo,
    area: Rect,
    buf: &mut Buffer,
) {
    let snap = data.snapshot.as_ref();
    let world = trainer
        .world_size
        .unwrap_or(trainer.ranks.len() as u32)
        .max(trainer.ranks.len() as u32);
    let attached = trainer.ranks.iter().filter(|r| r.attached).count() as u32;
    let slowest = trainer.job.as_ref().and_then(|j| j.slowest_rank);
    let marked = marked_slowest(&trainer.ranks, slowest);
    let rows_fit = area.height.saturating_sub(CHROME) as usize;
    let ranks = shown(&trainer.ranks, marked, rows_fit);
    let rows: Vec<RankRow> = ranks
        .iter()
        .map(|r| {
            let gpu = gpu_of(snap, &r.spec);
            rank_row(t, r, gpu, Some(r.spec.rank) == marked)
        })
        .collect();

    let hosts: Vec<&str> = {
        let mut h: Vec<&str> = trainer
            .ranks
            .iter()
            .filter_map(|r| r.spec.host.as_deref())
            .collect();
        h.sort_unstable();
        h.dedup();
        h
    };
    let mut left = if attached == world {
        format!(" {world} ranks ")
    } else {
        format!(" {attached}/{world} ranks attached ")
    };
    let inner_w = area.width.saturating_sub(2);
    let cols = columns(&rows, inner_w);
    let host_shown = cols.iter().any(|(i, _)| Col::ALL[*i] == Col::Host);
    if let [one] = hosts[..] {
        if !host_shown {
            left = format!("{}on {one} ", left);
        }
    }
    let cause = marked.and_then(|s| {
        let r = trainer.ranks.iter().find(|r| r.spec.rank == s)?;
        straggler_cause(r, gpu_of(snap, &r.spec))
    });
    let job = trainer.job.clone().unwrap_or_default();
    let room = (area.width as usize).saturating_sub(left.chars().count() + 4);
    let texts = job_texts(&job, marked, cause);
    let right = texts
        .iter()
        .find(|s| s.chars().count() + 2 <= room)
        .cloned()
        .unwrap_or_else(|| fit(&texts[texts.len() - 1], room.saturating_sub(2)));
    let mut block = Block::bordered()
        .border_style(t.border)
        .title(Span::styled(left, t.title));
    if !right.is_empty() {
        block = block.title(Line::styled(format!(" {right} "), t.text).right_aligned());
    }
    // The bottom border: a change in flight, else the daemon's straggler alert on the job.
    let said = match &trainer.staged {
        Some(s) => Some((
            staged_text(s),
            match s.committed {
                Some(false) => t.crit,
                Some(true) => t.ok,
                None => t.warn,
            },
        )),
        None => straggler_alert(data, run).map(|m| (m.to_string(), t.warn)),
    };
    let hidden = trainer.ranks.len().saturating_sub(ranks.len());
    let mut said_w = 0;
    if let Some((text, style)) = said {
        // What fits beside the count of hidden ranks, when there is one.
        let more_w = if hidden > 0 { 16 } else { 0 };
        let text = fit(&text, (area.width as usize).saturating_sub(6 + more_w));
        said_w = text.chars().count() + 3;
        block = block.title_bottom(Line::styled(format!(" {text} "), style));
    }
    if hidden > 0 {
        let more = if hidden == 1 {
            "+1 more rank".to_string()
        } else {
            format!("+{hidden} more ranks")
        };
        let long = format!(" {more}: gpupilot ps --json ");
        let short = format!(" {more} ");
        let room = (area.width as usize).saturating_sub(said_w + 2);
        if let Some(text) = [long, short]
            .into_iter()
            .find(|s| s.chars().count() <= room)
        {
            block = block.title_bottom(Line::styled(text, t.dim).right_aligned());
        }
    }

    let cell = |text: &str, style: Style, right: bool, w: u16| {
        let text = fit(text, w as usize);
        let line = Line::styled(text, style);
        Cell::from(if right { line.right_aligned() } else { line })
    };
    let header = Row::new(cols.iter().map(|&(i, w)| {
        let c = Col::ALL[i];
        cell(c.header(), t.dim, c.right(), w)
    }));
    let body: Vec<Row> = rows
        .iter()
        .map(|r| {
            Row::new(cols.iter().map(|&(i, w)| {
                let (text, style) = &r.cells[i];
                cell(text, *style, Col::ALL[i].right(), w)
            }))
            .style(r.style)
        })
        .collect();
    let widths: Vec<Constraint> = cols.iter().map(|&(_, w)| Constraint::Length(w)).collect();
    Table::new(body, widths)
        .header(header)
        .column_spacing(1)
        .block(block)
        .render(area, buf);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{KnobName, MetricsPoint, MetricsReport};
    use crate::telemetry::NodeInfo;

    fn rank(n: u32, host: &str, gpu: u32, step_time: f64, wait: f64) -> RankInfo {
        RankInfo {
            spec: RankSpec {
                rank: n,
                world_size: 4,
                local_rank: Some(n % 2),
                host: Some(host.into()),
                gpu: Some(gpu),
                gpu_uuid: None,
            },
            attached: true,
            pid: Some(100 + n),
            last: Some(MetricsPoint {
                n: n as u64,
                t: 0.0,
                from: "trainer".into(),
                rank: Some(n),
                report: MetricsReport {
                    step: Some(1200),
                    step_time_s: Some(step_time),
                    data_wait_s: Some(wait),
                    ..MetricsReport::default()
                },
            }),
            steps_per_s: None,
        }
    }

    fn snap() -> Snapshot {
        let gpu = |i: u32, uuid: &str, bits: u64| GpuSample {
            index: i,
            uuid: Some(uuid.into()),
            throttle_reasons: Some(bits),
            ..GpuSample::default()
        };
        Snapshot {
            node: NodeInfo {
                hostname: "node-a".into(),
                ..NodeInfo::default()
            },
            gpus: vec![
                gpu(0, "GPU-a0", 0),
                gpu(1, "GPU-a1", throttle::HW_THERMAL_SLOWDOWN),
            ],
            ..Snapshot::default()
        }
    }

    #[test]
    fn a_rank_finds_its_gpu_by_uuid_or_on_this_node_by_index() {
        let s = snap();
        let mut spec = rank(0, "node-a.cluster.local", 1, 0.1, 0.0).spec;
        assert_eq!(gpu_of(Some(&s), &spec).map(|g| g.index), Some(1));
        spec.host = Some("node-b".into());
        assert!(gpu_of(Some(&s), &spec).is_none(), "another node's GPU 1");
        spec.gpu_uuid = Some("GPU-a0".into());
        assert_eq!(
            gpu_of(Some(&s), &spec).map(|g| g.index),
            Some(0),
            "a UUID wins over the host and the index"
        );
        spec.gpu_uuid = Some("GPU-zz".into());
        assert!(gpu_of(Some(&s), &spec).is_none());
        spec.gpu_uuid = None;
        spec.host = None;
        assert_eq!(gpu_of(Some(&s), &spec).map(|g| g.index), Some(1));
        assert!(gpu_of(None, &spec).is_none());
    }

    #[test]
    fn the_slowest_rank_stays_shown_when_rows_run_short() {
        let ranks: Vec<RankInfo> = (0..8)
            .rev()
            .map(|n| rank(n, "node-a", n, 0.1, 0.0))
            .collect();
        let ids = |v: Vec<&RankInfo>| v.iter().map(|r| r.spec.rank).collect::<Vec<_>>();
        assert_eq!(ids(shown(&ranks, Some(6), 10)), [0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(ids(shown(&ranks, Some(6), 3)), [0, 1, 6]);
        assert_eq!(ids(shown(&ranks, Some(1), 3)), [0, 1, 2]);
        assert_eq!(ids(shown(&ranks, None, 2)), [0, 1]);
        assert!(shown(&ranks, Some(6), 0).is_empty());
    }

    #[test]
    fn the_slowest_rank_is_marked_only_when_it_stands_out() {
        let ranks: Vec<RankInfo> = [0.100, 0.101, 0.100, 0.1015]
            .iter()
            .enumerate()
            .map(|(n, &s)| rank(n as u32, "node-a", n as u32, s, 0.0))
            .collect();
        assert_eq!(marked_slowest(&ranks, Some(3)), None, "a job in step");
        let mut slow = ranks.clone();
        slow[2] = rank(2, "node-a", 2, 0.125, 0.0);
        assert_eq!(marked_slowest(&slow, Some(2)), Some(2));
        assert_eq!(marked_slowest(&slow, None), None);
        assert_eq!(
            marked_slowest(&slow[2..3], Some(2)),
            None,
            "no other to compare"
        );
    }

    #[test]
    fn the_straggler_is_named_with_what_its_gpu_or_its_report_shows() {
        let s = snap();
        let thermal = rank(1, "node-a", 1, 0.2, 0.01);
        assert_eq!(
            straggler_cause(&thermal, gpu_of(Some(&s), &thermal.spec)),
            Some("thermal slowdown")
        );
        let starved = rank(1, "node-a", 1, 0.2, 0.08);
        assert_eq!(
            straggler_cause(&starved, gpu_of(Some(&s), &starved.spec)),
            Some("data wait"),
            "a data wait of 40 % of the step comes first"
        );
        let plain = rank(0, "node-a", 0, 0.2, 0.0);
        assert_eq!(straggler_cause(&plain, gpu_of(Some(&s), &plain.spec)), None);
    }

    #[test]
    fn a_staged_change_reads_as_the_issue_says() {
        let mut s = StagedChange {
            seq: 3,
            knob: KnobName::BatchSize,
            value: 64,
            apply_step: 1234,
            ranks: vec![0, 1, 2, 3],
            ready: vec![0, 1, 3],
            committed: None,
            applied: vec![],
        };
        assert_eq!(
            staged_text(&s),
            "batch_size → 64 at step 1234 (3/4 ranks agreed)"
        );
        s.committed = Some(true);
        s.applied = vec![2];
        assert_eq!(
            staged_text(&s),
            "batch_size → 64 at step 1234 (all agreed; 1/4 applied)"
        );
        s.committed = Some(false);
        assert_eq!(staged_text(&s), "batch_size = 64 called off");
    }

    #[test]
    fn a_single_process_trainer_has_no_rank_table() {
        let mut t = TrainerInfo::default();
        assert!(!is_multi(&t));
        t.world_size = Some(1);
        t.ranks = vec![rank(0, "node-a", 0, 0.1, 0.0)];
        assert!(!is_multi(&t));
        t.world_size = Some(4);
        assert!(is_multi(&t), "one of four ranks attached so far");
    }

    #[test]
    fn narrow_tables_leave_the_host_out_first_and_always_keep_rank_and_step_time() {
        let t = Theme::default();
        let gpu = GpuSample {
            util_gpu_pct: Some(100.0),
            sm_clock_mhz: Some(1965),
            sm_clock_max_mhz: Some(1980),
            temperature_c: Some(63.0),
            power_w: Some(612.0),
            power_limit_w: Some(700.0),
            throttle_reasons: Some(throttle::SW_POWER_CAP),
            ..GpuSample::default()
        };
        let rows: Vec<RankRow> = (0..4)
            .map(|n| {
                let r = rank(n, "gpu-node-07", n, 0.144, 0.002);
                rank_row(&t, &r, Some(&gpu), false)
            })
            .collect();
        let names = |w| {
            columns(&rows, w)
                .iter()
                .map(|(i, _)| Col::ALL[*i])
                .collect::<Vec<_>>()
        };
        assert!(names(196).contains(&Col::Host));
        let narrow = names(78);
        assert!(!narrow.contains(&Col::Host), "{narrow:?}");
        assert!(narrow.contains(&Col::DataWait) && narrow.contains(&Col::Throttle));
        let tiny = names(20);
        assert!(
            tiny.contains(&Col::Rank) && tiny.contains(&Col::StepTime),
            "{tiny:?}"
        );
        // Rank, step and step time (19 columns) are never left out; past them it fits.
        for w in [19u16, 20, 40, 60, 78, 120, 196] {
            let total: u16 = columns(&rows, w).iter().map(|(_, w)| w + 1).sum::<u16>() - 1;
            assert!(total <= w, "{w}: {total}");
        }
    }
}
