//! The advisor pane's hints, for the daemon feed: while the pane is open
//! ([`Request::Advise`](crate::tui::feed::Request::Advise)), every
//! [`ADVISE_EVERY`] at most, the advisor's input is gathered from the daemon as
//! `gpupilot advise` gathers it (each GPU's history over the window, each live run's metrics
//! and knob ranges) and the hints are sent as [`Update::Advice`].

use super::{Done, Worker};
use crate::advisor::Thresholds;
use crate::client::advise::gather;
use crate::tui::advisor::{ADVISE_EVERY, Advice};
use crate::tui::feed::Update;
use std::time::Instant;

/// Whether the pane wants hints, and when they were last computed.
#[derive(Debug, Default)]
pub(super) struct AdviseFeed {
    pub(super) on: bool,
    last: Option<Instant>,
}

impl Worker {
    /// The pane opened (compute at once) or closed (stop computing).
    pub(super) fn set_advise(&mut self, on: bool) -> Result<(), Done> {
        self.advise = AdviseFeed { on, last: None };
        self.advise_if_due()
    }

    /// Compute and send the hints if the pane is open and they are due.
    pub(super) fn advise_if_due(&mut self) -> Result<(), Done> {
        if !self.advise.on || self.advise.last.is_some_and(|t| t.elapsed() < ADVISE_EVERY) {
            return Ok(());
        }
        let Some(client) = &self.client else {
            return Ok(());
        };
        self.advise.last = Some(Instant::now());
        let th = Thresholds::default();
        let advice = match gather(client, &th) {
            Ok(input) => Advice::compute(&input, &th),
            Err(e) => Advice::unavailable(crate::telemetry::now_s(), format!("{e:#}")),
        };
        self.send(Update::Advice(Box::new(advice)))
    }
}
