//! The daemon's client as the energy tuner's [`TunerDaemon`]: the session of
//! `control::tuner::session` reads the run, the snapshots, the reports and the power limits,
//! and sets caps, through these requests.

use super::Client;
use crate::control::PowerLimits;
use crate::control::tuner::session::{Reports, RunSeen, TunerDaemon};
use crate::protocol::{Request, Response, TargetGpus};
use crate::supervisor::RunStatus;
use crate::telemetry::Snapshot;

impl TunerDaemon for Client {
    fn run(&self, spec: &str) -> anyhow::Result<RunSeen> {
        let info = Client::run(self, spec)?;
        Ok(RunSeen {
            id: info.id,
            dir: info.dir,
            gpus: info.gpus,
            running: matches!(info.status, RunStatus::Running),
        })
    }

    fn snapshot(&self) -> anyhow::Result<Option<Snapshot>> {
        Ok(self.status()?.snapshot)
    }

    fn reports(&self, run: &str, since: u64) -> anyhow::Result<Reports> {
        let m = self.run_metrics(run, since)?;
        Ok(Reports {
            points: m.points,
            next: m.next,
            trainer: m.trainer,
        })
    }

    fn power_limits(&self) -> anyhow::Result<Vec<(u32, Option<PowerLimits>)>> {
        let Response::Power { gpus, .. } = self.request(Request::Power {})? else {
            anyhow::bail!("the daemon answered `power` with something else");
        };
        Ok(gpus.into_iter().map(|g| (g.index, g.power)).collect())
    }

    fn set_cap(&self, gpus: Vec<u32>, watts: f64, why: &str) -> anyhow::Result<()> {
        let request = Request::PowerCap {
            gpus: TargetGpus::Some(gpus),
            watts,
            why: Some(why.to_string()),
        };
        self.request(request)?;
        Ok(())
    }
}
