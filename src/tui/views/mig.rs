//! MIG in the console: a GPU's instances under it — a summary on the overview block's info
//! line, and a table of the instances (address `GPU:GI`, profile, memory, processes) above the
//! processes in GPU detail. Render only: reads the sample, changes nothing.

use crate::telemetry::GpuSample;
use crate::telemetry::mig::MigState;
use crate::tui::format;
use crate::tui::theme::Theme;
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Rect};
use ratatui::text::Span;
use ratatui::widgets::{Block, Row, Table, Widget};

/// `MIG 3g.40gb 1g.10gb×3` (the instances' profiles, each with its count), `MIG on (no
/// instances)`, `MIG: reset to apply` while a mode change waits; None off MIG.
pub fn summary(g: &GpuSample) -> Option<String> {
    let m = g.mig.as_ref()?;
    if m.change_pending() {
        return Some(format!(
            "MIG {} at reset: reset to apply",
            if m.pending { "on" } else { "off" }
        ));
    }
    if !m.enabled {
        return None;
    }
    if m.instances.is_empty() {
        return Some("MIG on (no instances)".into());
    }
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for i in &m.instances {
        let p = i.profile.as_deref().unwrap_or(format::NA);
        match counts.iter_mut().find(|(q, _)| *q == p) {
            Some((_, n)) => *n += 1,
            None => counts.push((p, 1)),
        }
    }
    let parts: Vec<String> = counts
        .iter()
        .map(|(p, n)| {
            if *n == 1 {
                (*p).to_string()
            } else {
                format!("{p}×{n}")
            }
        })
        .collect();
    Some(format!("MIG {}", parts.join(" ")))
}

/// The instances of a GPU in MIG mode, if it is in MIG mode with instances.
pub fn instances(g: &GpuSample) -> Option<&MigState> {
    g.mig
        .as_ref()
        .filter(|m| m.enabled && !m.instances.is_empty())
}

/// Rows the instance table wants: a border above and below, a header, one per instance.
pub fn table_height(m: &MigState) -> u16 {
    m.instances.len() as u16 + 3
}

/// The instance table: `GPU:GI`, profile, compute instance, memory used/total, pids.
pub fn render_table(g: &GpuSample, m: &MigState, t: &Theme, area: Rect, buf: &mut Buffer) {
    let block = Block::bordered().border_style(t.border).title(Span::styled(
        format!(" MIG instances ({}) ", m.instances.len()),
        t.title,
    ));
    let inner = block.inner(area);
    block.render(area, buf);
    let rows = m.instances.iter().map(|i| {
        let pids = if i.pids.is_empty() {
            "-".to_string()
        } else {
            i.pids
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        Row::new(vec![
            i.address(g.index).unwrap_or_else(|| format::NA.into()),
            i.profile.clone().unwrap_or_else(|| format::NA.into()),
            i.compute_instance_id
                .map_or_else(|| format::NA.into(), |c| c.to_string()),
            format::memory(i.memory_used_bytes, i.memory_total_bytes),
            pids,
        ])
    });
    Table::new(
        rows,
        [
            Constraint::Length(6),
            Constraint::Length(9),
            Constraint::Length(3),
            Constraint::Length(16),
            Constraint::Fill(1),
        ],
    )
    .header(Row::new(vec!["GPU:GI", "profile", "CI", "memory", "pids"]).style(t.dim))
    .style(t.text)
    .render(inner, buf);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::mig::MigInstance;

    fn gpu(enabled: bool, pending: bool, profiles: &[&str]) -> GpuSample {
        GpuSample {
            mig: Some(MigState {
                enabled,
                pending,
                instances: profiles
                    .iter()
                    .map(|p| MigInstance {
                        profile: Some((*p).into()),
                        ..MigInstance::default()
                    })
                    .collect(),
            }),
            ..GpuSample::default()
        }
    }

    #[test]
    fn summary_counts_profiles_and_says_when_a_reset_waits() {
        assert_eq!(
            summary(&gpu(
                true,
                true,
                &["3g.40gb", "1g.10gb", "1g.10gb", "1g.10gb"]
            ))
            .as_deref(),
            Some("MIG 3g.40gb 1g.10gb×3")
        );
        assert_eq!(
            summary(&gpu(false, true, &[])).as_deref(),
            Some("MIG on at reset: reset to apply")
        );
        assert_eq!(summary(&gpu(false, false, &[])), None);
        assert_eq!(summary(&GpuSample::default()), None);
    }
}
