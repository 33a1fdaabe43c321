//! The Events view: the node's `events.jsonl` as the daemon keeps it, newest first: when, who,
//! what, old → new, and why. Scrolls with the keys of the `[[events]]` keymap section.

use super::Ctx;
use crate::protocol::{NodeEvent, NodeEventRecord};
use crate::text::printable;
use crate::tui::action::Action;
use crate::tui::feed::Link;
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Padding, Paragraph, Row, Table, Widget, Wrap};

/// How far the list is scrolled: the number of newer events above the first row shown.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventsState {
    pub scroll: usize,
}

impl EventsState {
    /// Carry out a scrolling action over `n` events with `page` rows on screen.
    pub fn apply(&mut self, a: Action, n: usize, page: usize) {
        let step = page.saturating_sub(1).max(1);
        let last = n.saturating_sub(page.max(1));
        self.scroll = match a {
            Action::ScrollDown => self.scroll + 1,
            Action::ScrollUp => self.scroll.saturating_sub(1),
            Action::PageDown => self.scroll + step,
            Action::PageUp => self.scroll.saturating_sub(step),
            Action::Top => 0,
            Action::Bottom => last,
            _ => self.scroll,
        }
        .min(last);
    }
}

/// Rows of events the view shows in `body` (a bordered table with a header row).
pub fn page_rows(body: Rect) -> usize {
    body.height.saturating_sub(3) as usize
}

/// One event in the view's columns: who, what (the run, for a run's events), old → new, why.
pub fn columns(e: &NodeEvent) -> [String; 4] {
    let or_dash = |s: &Option<String>| s.clone().unwrap_or_default();
    match e {
        NodeEvent::DaemonStarted {
            pid,
            version,
            telemetry,
            adopted,
            readonly,
        } => [
            "daemon".into(),
            format!("daemon started (pid {pid}, {version})"),
            String::new(),
            format!(
                "{telemetry}; {adopted} run{} adopted{}",
                if *adopted == 1 { "" } else { "s" },
                if *readonly { "; read-only" } else { "" }
            ),
        ],
        NodeEvent::DaemonStopped { pid, reason } => [
            "daemon".into(),
            format!("daemon stopped (pid {pid})"),
            String::new(),
            reason.clone(),
        ],
        NodeEvent::RunStarted { run, by, why, .. } => {
            [by.clone(), run.clone(), "→ running".into(), or_dash(why)]
        }
        NodeEvent::RunAdopted { run, pid, status } => [
            "daemon".into(),
            run.clone(),
            format!("adopted, {}", status.as_str()),
            pid.map_or(String::new(), |p| format!("pid {p}")),
        ],
        NodeEvent::RunStatus {
            run,
            old,
            new,
            by,
            why,
        } => [
            by.clone(),
            run.clone(),
            format!("{} → {}", old.as_str(), new.as_str()),
            why.clone(),
        ],
        NodeEvent::PeerRefused { uid, pid, reason } => [
            match pid {
                Some(p) => format!("uid {uid} (pid {p})"),
                None => format!("uid {uid}"),
            },
            "refused".into(),
            String::new(),
            reason.clone(),
        ],
        NodeEvent::Trainer {
            run,
            attached,
            pid,
            rank,
        } => [
            "trainer".into(),
            run.clone(),
            match (rank, attached) {
                (Some(r), true) => format!("rank {r} attached"),
                (Some(r), false) => format!("rank {r} detached"),
                (None, true) => "attached".into(),
                (None, false) => "detached".into(),
            },
            pid.map_or(String::new(), |p| format!("pid {p}")),
        ],
        NodeEvent::RankRefused {
            run,
            rank,
            world_size,
            reason,
            ..
        } => [
            "trainer".into(),
            run.clone(),
            format!("rank {rank} of {world_size} refused"),
            reason.clone(),
        ],
        NodeEvent::RelayOpened {
            run, node, rank, ..
        } => [
            "trainer".into(),
            run.clone(),
            match rank {
                Some(r) => format!("rank {r} relayed to {node}"),
                None => format!("relayed to {node}"),
            },
            String::new(),
        ],
        NodeEvent::RelayFailed {
            run,
            node,
            rank,
            reason,
            ..
        } => [
            "trainer".into(),
            run.clone(),
            match rank {
                Some(r) => format!("rank {r}: no relay to {node}"),
                None => format!("no relay to {node}"),
            },
            reason.clone(),
        ],
        NodeEvent::KnobStaged {
            run,
            knob,
            value,
            apply_step,
            ranks,
            rtt_ms,
            ..
        } => [
            "trainer".into(),
            run.clone(),
            format!("{knob} → {value} agreed by all {ranks} ranks"),
            format!("every rank applies it at step {apply_step}; agreed in {rtt_ms:.1} ms"),
        ],
        NodeEvent::KnobStray {
            run, rank, what, ..
        } => [
            "trainer".into(),
            run.clone(),
            rank.map_or("a rank".to_string(), |r| format!("rank {r}")),
            what.clone(),
        ],
        NodeEvent::KnobChanged {
            run,
            knob,
            old,
            new,
            via,
            by,
            why,
            ..
        } => [
            by.clone(),
            run.clone(),
            format!(
                "{knob} {} → {new}",
                old.map_or("?".to_string(), |o| o.to_string())
            ),
            match via {
                crate::protocol::KnobVia::Trainer => or_dash(why),
                crate::protocol::KnobVia::Restart => format!("by restart; {}", or_dash(why)),
            },
        ],
        NodeEvent::KnobApplied {
            run,
            knob,
            value,
            rtt_ms,
            ranks,
            step,
            ..
        } => [
            "trainer".into(),
            run.clone(),
            match (ranks, step) {
                (Some(n), Some(s)) => format!("{knob} = {value} applied on {n} ranks at step {s}"),
                _ => format!("{knob} = {value} applied"),
            },
            format!("round trip {rtt_ms:.1} ms"),
        ],
        NodeEvent::KnobRejected {
            run,
            knob,
            value,
            reason,
            kept,
            rank,
            ..
        } => match reason.strip_prefix("called off on every rank: ") {
            // A change to several ranks that a rank refused (or that timed out): no rank
            // changed.
            Some(why) => [
                "trainer".into(),
                run.clone(),
                format!("{knob} = {value} called off"),
                match kept {
                    Some(k) => format!("{why}; every rank keeps {k}"),
                    None => why.to_string(),
                },
            ],
            None if rank.is_some() => [
                "trainer".into(),
                run.clone(),
                format!("{knob} = {value} not applied by every rank"),
                reason.clone(),
            ],
            None => [
                "trainer".into(),
                run.clone(),
                format!("{knob} = {value} rejected"),
                reason.clone(),
            ],
        },
        NodeEvent::TrainerError { run, kind, message } => [
            "trainer".into(),
            run.clone(),
            format!("error: {kind}"),
            or_dash(message),
        ],
        NodeEvent::GpuChanged {
            gpu,
            what,
            old,
            new,
            by,
            why,
        } => [
            by.clone(),
            format!("GPU {gpu}"),
            format!(
                "{} {} → {}",
                what.replace('_', " "),
                old.as_deref().unwrap_or("?"),
                new.as_deref().unwrap_or("?")
            ),
            or_dash(why),
        ],
        NodeEvent::PowerChangedOutside {
            gpu, old_w, new_w, ..
        } => [
            "outside gpupilot".into(),
            format!("GPU {gpu}"),
            format!(
                "power limit {} → {}",
                crate::control::power::watts(*old_w),
                crate::control::power::watts(*new_w)
            ),
            "changed outside gpupilot (power reset restores the limit before)".into(),
        ],
        NodeEvent::Xid {
            gpu,
            xid,
            name,
            repeats,
            ..
        } => {
            let info = crate::telemetry::xid::explain(*xid);
            [
                "driver".into(),
                format!("GPU {gpu}: XID {xid}"),
                repeats.map_or(String::new(), |n| format!("{n} more in a storm")),
                format!("{name}: {}; {}", info.meaning, info.action),
            ]
        }
        // Events of the control loops and anything newer: their name and fields as they are
        // in events.jsonl, so no event is ever hidden from the view.
        #[allow(unreachable_patterns)]
        other => generic_columns(other),
    }
}

/// Any event as `daemon | <event name> | | key=value …`.
fn generic_columns(e: &NodeEvent) -> [String; 4] {
    let value = serde_json::to_value(e).unwrap_or_default();
    let name = value["event"].as_str().unwrap_or("event").replace('_', " ");
    let by = value["by"].as_str().unwrap_or("daemon").to_string();
    let fields = value
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| !matches!(k.as_str(), "event" | "by"))
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => format!("{k}={s}"),
            v => format!("{k}={v}"),
        })
        .collect::<Vec<_>>()
        .join(" ");
    [by, name, String::new(), fields]
}

/// `2026-11-30T04:07:55.652Z` as `11-30 04:07:55` (the column says UTC).
fn short_time(rfc3339: &str) -> String {
    match (rfc3339.get(5..10), rfc3339.get(11..19)) {
        (Some(d), Some(t)) => format!("{d} {t}"),
        _ => rfc3339.to_string(),
    }
}

/// The Events view, borrowed for one frame.
pub struct EventsView<'a> {
    pub ctx: Ctx<'a>,
    pub state: &'a EventsState,
}

impl Widget for EventsView<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let t = self.ctx.theme;
        let events = &self.ctx.data.events;
        let title = Span::styled(format!(" Events ({}) ", events.len()), t.title);
        let block = Block::bordered()
            .border_style(t.border)
            .title(title)
            .title(Line::styled(" newest first ", t.dim).right_aligned());
        if events.is_empty() {
            let text = match &self.ctx.data.link {
                Link::Local => {
                    "The demo has no daemon, so no event log. On a real node this lists the \
                     node's events.jsonl: runs started and stopped, daemons started, refused \
                     connections — who, when, old → new, and why."
                }
                Link::Gone { .. } => "The daemon is gone; its events come back when it does.",
                _ => "No events yet.",
            };
            Paragraph::new(text)
                .style(t.dim)
                .wrap(Wrap { trim: true })
                .block(block.padding(Padding::horizontal(1)))
                .render(area, buf);
            return;
        }
        let page = page_rows(area);
        let scroll = self
            .state
            .scroll
            .min(events.len().saturating_sub(page.max(1)));
        // Narrow terminals get the time of day and the user's name; wide ones everything.
        let (narrow, wide) = (area.width < 120, area.width >= 160);
        let rows: Vec<Row> = events
            .iter()
            .rev()
            .skip(scroll)
            .take(page)
            .map(|e: &NodeEventRecord| {
                // Who and why are a peer's words, and so may be a run's name.
                let [who, what, change, why] = columns(&e.event).map(|c| printable(&c));
                let (time, who) = if narrow {
                    let name = who.split(" (uid").next().unwrap_or(&who).to_string();
                    (e.time.get(11..19).unwrap_or(&e.time).to_string(), name)
                } else {
                    (short_time(&e.time), who)
                };
                Row::new(vec![
                    Cell::from(Span::styled(time, t.dim)),
                    Cell::from(who),
                    Cell::from(what),
                    Cell::from(change),
                    Cell::from(Span::styled(why, t.dim)),
                ])
            })
            .collect();
        let widths = match (narrow, wide) {
            (true, _) => [8, 12, 25, 19],
            (false, false) => [14, 24, 30, 20],
            (false, true) => [14, 42, 34, 22],
        }
        .map(Constraint::Length);
        let widths = [
            widths[0],
            widths[1],
            widths[2],
            widths[3],
            Constraint::Fill(1),
        ];
        let mut block = block;
        if events.len() > page {
            let more = format!(
                " {}–{} of {}  j/k PgUp/PgDn ",
                scroll + 1,
                (scroll + page).min(events.len()),
                events.len()
            );
            block = block.title_bottom(Line::styled(more, t.dim).right_aligned());
        }
        Table::new(rows, widths)
            .header(
                Row::new(vec![
                    if narrow { "UTC" } else { "TIME (UTC)" },
                    "WHO",
                    "RUN / WHAT",
                    "CHANGE",
                    "WHY",
                ])
                .style(t.dim),
            )
            .column_spacing(1)
            .block(block)
            .render(area, buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrolling_stays_within_the_list() {
        let mut s = EventsState::default();
        s.apply(Action::ScrollUp, 30, 10);
        assert_eq!(s.scroll, 0);
        s.apply(Action::PageDown, 30, 10);
        assert_eq!(s.scroll, 9);
        s.apply(Action::PageDown, 30, 10);
        s.apply(Action::PageDown, 30, 10);
        assert_eq!(s.scroll, 20, "the last page is full");
        s.apply(Action::Top, 30, 10);
        assert_eq!(s.scroll, 0);
        s.apply(Action::Bottom, 5, 10);
        assert_eq!(s.scroll, 0, "all fit");
    }

    #[test]
    fn a_change_to_several_ranks_reads_as_agreed_applied_or_called_off() {
        use crate::protocol::KnobName;
        let knob = KnobName::BatchSize;
        let staged = NodeEvent::KnobStaged {
            run: "r".into(),
            change: 3,
            knob,
            value: 64,
            apply_step: 1234,
            ranks: 4,
            rtt_ms: 3.08,
        };
        assert_eq!(
            columns(&staged)[2..],
            [
                "batch_size → 64 agreed by all 4 ranks".to_string(),
                "every rank applies it at step 1234; agreed in 3.1 ms".into()
            ]
        );
        let applied = NodeEvent::KnobApplied {
            run: "r".into(),
            change: 3,
            knob,
            value: 64,
            rtt_ms: 9.0,
            ranks: Some(4),
            step: Some(1234),
        };
        assert_eq!(
            columns(&applied)[2],
            "batch_size = 64 applied on 4 ranks at step 1234"
        );
        let rejected = |reason: &str, rank| NodeEvent::KnobRejected {
            run: "r".into(),
            change: 3,
            knob,
            value: 64,
            kept: Some(32),
            reason: reason.into(),
            rtt_ms: 5.0,
            rank,
        };
        let off = rejected(
            "called off on every rank: rank 2 refused: out of memory",
            Some(2),
        );
        assert_eq!(
            columns(&off)[2..],
            [
                "batch_size = 64 called off".to_string(),
                "rank 2 refused: out of memory; every rank keeps 32".into()
            ]
        );
        let partial = rejected(
            "applied at step 1234 by 3 of 4 ranks (rank 1: gone)",
            Some(1),
        );
        assert_eq!(
            columns(&partial)[2],
            "batch_size = 64 not applied by every rank"
        );
        assert_eq!(
            columns(&rejected("out of memory", None))[2],
            "batch_size = 64 rejected"
        );
    }

    #[test]
    fn an_xid_reads_with_its_meaning_and_what_to_do() {
        let e = NodeEvent::Xid {
            gpu: 2,
            uuid: None,
            xid: 48,
            name: "Double Bit ECC Error".into(),
            action: String::new(),
            repeats: None,
        };
        let [who, what, change, why] = columns(&e);
        assert_eq!((who.as_str(), what.as_str()), ("driver", "GPU 2: XID 48"));
        assert_eq!(change, "");
        assert!(
            why.starts_with("Double Bit ECC Error: GPU memory returned"),
            "{why}"
        );
        assert!(why.ends_with("drain the GPU and reset it; replace it if it happens again"));
    }

    #[test]
    fn times_are_short() {
        assert_eq!(short_time("2026-11-30T04:07:55.652Z"), "11-30 04:07:55");
        assert_eq!(short_time("odd"), "odd");
    }
}
