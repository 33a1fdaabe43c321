//! The console's power-cap changes, for the daemon feed: `power_cap` or `power_reset` for one
//! GPU, answered for the footer (`GPU 1: power limit 450 W → 250 W`, or the daemon's refusal:
//! out of range with the range, read-only, or no permission with the way to get it).

use super::{Done, Worker};
use crate::client::ClientError;
use crate::protocol::{ErrorCode, GpuChange, Request, Response, TargetGpus};
use crate::tui::feed::Update;

/// Why a change is made, as the node's events record it.
const WHY: &str = "gpupilot console";

impl Worker {
    /// Cap GPU `gpu` at `watts` (`None`: restore its recorded limit); say how it went.
    pub(super) fn power_cap(&mut self, gpu: u32, watts: Option<u32>) -> Result<(), Done> {
        let Some(client) = &self.client else {
            return self.send(Update::Answer {
                ok: false,
                text: "the daemon is gone: start it again with `gpupilot daemon --detach`".into(),
            });
        };
        let gpus = TargetGpus::Some(vec![gpu]);
        let why = Some(WHY.to_string());
        let request = match watts {
            Some(w) => Request::PowerCap {
                gpus,
                watts: f64::from(w),
                why,
            },
            None => Request::PowerReset { gpus, why },
        };
        match client.request(request) {
            Ok(Response::GpuChanged { changes, notes }) => self.send(Update::Answer {
                ok: true,
                text: answer_text(gpu, &changes, &notes),
            }),
            Ok(other) => self.send(Update::Answer {
                ok: false,
                text: format!("the daemon answered the power cap with {other:?}"),
            }),
            Err(e) if e.code() == Some(ErrorCode::NoPermission) => {
                // A system daemon that could do it is named, with the command to use it.
                let args = match watts {
                    Some(w) => format!("power cap {w} --gpu {gpu}"),
                    None => format!("power reset --gpu {gpu}"),
                };
                let args: Vec<String> = args.split(' ').map(String::from).collect();
                let text = crate::client::system::suggest_system(e, &args).to_string();
                self.send(Update::Answer { ok: false, text })
            }
            Err(e @ ClientError::Daemon { .. }) => self.send(Update::Answer {
                ok: false,
                text: format!("GPU {gpu}'s power cap is unchanged: {e}"),
            }),
            Err(e) => self.failed(e),
        }
    }
}

/// `GPU 1: power limit 450 W → 250 W`, and the daemon's notes; what a reset with nothing
/// recorded says.
pub(crate) fn answer_text(gpu: u32, changes: &[GpuChange], notes: &[String]) -> String {
    let mut parts: Vec<String> = changes
        .iter()
        .map(|c| {
            format!(
                "GPU {}: power limit {} → {}",
                c.gpu,
                c.old.as_deref().unwrap_or("?"),
                c.new.as_deref().unwrap_or("?")
            )
        })
        .collect();
    parts.extend(notes.iter().cloned());
    if parts.is_empty() {
        return format!("GPU {gpu}: nothing to change (no power limit recorded to restore)");
    }
    parts.join(" · ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_read_old_to_new() {
        let c = GpuChange {
            gpu: 1,
            what: "power_limit".into(),
            old: Some("450 W".into()),
            new: Some("250 W".into()),
        };
        assert_eq!(
            answer_text(1, &[c], &[]),
            "GPU 1: power limit 450 W → 250 W"
        );
        assert!(answer_text(2, &[], &[]).contains("nothing to change"));
        assert_eq!(
            answer_text(2, &[], &["GPU 2: no power limit recorded".into()]),
            "GPU 2: no power limit recorded"
        );
    }
}
