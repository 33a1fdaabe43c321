//! The daemon's client as the benchmarks' [`BenchNode`]: samples from the daemon's newest
//! snapshot, limits and caps through the same requests as `gpupilot power` (so each cap is
//! checked for rights, refused by a read-only daemon, and recorded in the node's events with
//! its reason), and the wall clock.

use std::time::Duration;

use anyhow::Context as _;

use super::Client;
use crate::control::PowerLimits;
use crate::control::bench::{BenchNode, Label, Refused};
use crate::control::tuner::session::TunerDaemon;
use crate::telemetry::GpuSample;

/// The node through its daemon.
pub struct DaemonBench {
    client: Client,
    source: String,
}

impl DaemonBench {
    /// The daemon `client` talks to, once it has GPU telemetry.
    pub fn open(client: Client) -> anyhow::Result<DaemonBench> {
        let snap = client.status()?.snapshot.context(
            "the daemon has no GPU telemetry (no GPU, or NVML did not load): nothing to benchmark",
        )?;
        Ok(DaemonBench {
            client,
            source: snap.node.source,
        })
    }

    /// Where the daemon's telemetry comes from: `nvml` or `sim`.
    pub fn source(&self) -> &str {
        &self.source
    }
}

impl BenchNode for DaemonBench {
    fn label(&self) -> Label {
        if self.source == "sim" {
            Label::Simulated
        } else {
            Label::Measured
        }
    }

    fn samples(&mut self) -> anyhow::Result<Vec<GpuSample>> {
        Ok(self
            .client
            .status()?
            .snapshot
            .context("the daemon lost its GPU telemetry")?
            .gpus)
    }

    fn limits(&mut self, gpu: u32) -> anyhow::Result<PowerLimits> {
        TunerDaemon::power_limits(&self.client)?
            .into_iter()
            .find(|(i, _)| *i == gpu)
            .ok_or_else(|| Refused(format!("the daemon reports no GPU {gpu}")))?
            .1
            .with_context(|| format!("GPU {gpu}'s power limits cannot be read"))
    }

    fn set_cap(&mut self, gpus: &[u32], watts: f64, why: &str) -> anyhow::Result<()> {
        TunerDaemon::set_cap(&self.client, gpus.to_vec(), watts, why)
    }

    fn wait(&mut self, seconds: f64) {
        std::thread::sleep(Duration::from_secs_f64(seconds.max(0.0)));
    }

    fn now_s(&self) -> f64 {
        crate::telemetry::now_s()
    }
}
