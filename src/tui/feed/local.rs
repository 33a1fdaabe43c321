//! The demo's feed: a sampler over an in-process source. There is no daemon, so requests
//! about runs are answered with where runs come from.

use super::{Feed, Link, Request, Update, channels};
use crate::telemetry::{Sampler, SamplerConfig, Source};
use crossbeam_channel::select;
use std::sync::Arc;
use std::time::Duration;

/// What the demo says when asked to act on a run.
pub const NO_RUNS: &str =
    "the demo has no daemon and no runs: `gpupilot run -- CMD…` starts a supervised run";

/// What the demo says when asked to change a GPU setting.
pub const NO_DAEMON: &str = "changing a power cap needs the daemon, and this console samples \
     in-process: quit and start `gpupilot` (it starts the daemon), or use `gpupilot power cap \
     WATTS --gpu I`";

/// Sample `source` every `refresh` on a thread of its own. The thread (and the sampler) end
/// when the feed is dropped.
pub fn start(source: Arc<dyn Source>, refresh: Duration) -> Feed {
    let (tx, requests, feed) = channels();
    std::thread::Builder::new()
        .name("tui-local-feed".into())
        .spawn(move || {
            if tx.blocking_send(Update::Link(Link::Local)).is_err() {
                return;
            }
            // Sampler::start takes up to one period for a complete first snapshot; the
            // console has drawn its first frame already.
            let sampler = Sampler::start(source, SamplerConfig::every(refresh));
            let snapshots = sampler.subscribe();
            if tx.blocking_send(Arc::unwrap_or_clone(sampler.latest()).into()).is_err() {
                return;
            }
            loop {
                select! {
                    recv(snapshots) -> s => match s {
                        Ok(s) => if tx.blocking_send(Arc::unwrap_or_clone(s).into()).is_err() { return },
                        Err(_) => return,
                    },
                    recv(requests) -> r => match r {
                        Ok(Request::Watch(_) | Request::Advise(_)) => {}
                        Ok(Request::PowerCap { .. } | Request::PowerReset { .. }) => {
                            let answer = Update::Answer { ok: false, text: NO_DAEMON.into() };
                            if tx.blocking_send(answer).is_err() {
                                return;
                            }
                        }
                        Ok(_) => {
                            let answer = Update::Answer { ok: false, text: NO_RUNS.into() };
                            if tx.blocking_send(answer).is_err() {
                                return;
                            }
                        }
                        Err(_) => return,
                    },
                }
            }
        })
        .expect("spawning the console's sampler thread");
    feed
}
