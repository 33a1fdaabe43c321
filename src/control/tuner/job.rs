//! What the tuner scores on a run: one process, or a data-parallel job of several ranks.
//!
//! A job runs at the pace of its slowest rank, so a cap is a decision for the whole job: the
//! search moves the caps of all its GPUs together (one cap for all) and scores the job, the
//! energy of all its GPUs against the samples of all its ranks. [`scope`] says which GPUs
//! those are (the ranks say which GPU each trains on); [`JobTally`] (in `training`, where
//! every output's job figures are made) counts the job's samples and its step (the slowest
//! rank's) from the ranks' reports; [`energy_of`] sums the GPUs' energy counters. A run of one process is the same with one rank.
//!
//! Pure: the caller ([`super::session`]) reads the daemon.

use std::collections::BTreeSet;

use crate::telemetry::GpuSample;
pub use crate::training::JobTally;
use crate::training::TrainerInfo;

/// What a search on a run tunes.
#[derive(Debug, Clone, PartialEq)]
pub enum Scope {
    /// One process (or a trainer that says nothing about ranks): the GPUs it sees.
    Run,
    /// A job of `ranks` ranks on `gpus` (ascending; empty when a rank does not say its GPU,
    /// and then the GPUs the run sees stand in).
    Job { gpus: Vec<u32>, ranks: u32 },
}

/// The scope of a search on a run whose trainer side is `t`. A job is tuned from this node
/// only when every one of its ranks reports here: its cost counts every GPU's energy, and a
/// rank on another node has its GPU out of this daemon's sight.
pub fn scope(t: &TrainerInfo) -> Result<Scope, String> {
    let world = t.world_size.unwrap_or(1);
    if world <= 1 {
        return Ok(Scope::Run);
    }
    let ranks: BTreeSet<u32> = t.ranks.iter().map(|r| r.spec.rank).collect();
    let hosts: BTreeSet<&str> = t
        .ranks
        .iter()
        .filter_map(|r| r.spec.host.as_deref())
        .collect();
    if hosts.len() > 1 || (ranks.len() as u32) < world {
        let on = if hosts.len() > 1 {
            format!(" on {}", hosts.into_iter().collect::<Vec<_>>().join(", "))
        } else {
            String::new()
        };
        return Err(format!(
            "the run is a job of {world} ranks and {} of them report to this daemon{on}: the \
             tuner scores a job on the energy of all its GPUs against all its samples, so it \
             tunes a job whose ranks all run on this node, once every rank has attached",
            ranks.len()
        ));
    }
    let gpus: Option<BTreeSet<u32>> = t.ranks.iter().map(|r| r.spec.gpu).collect();
    Ok(Scope::Job {
        gpus: gpus.map(|g| g.into_iter().collect()).unwrap_or_default(),
        ranks: world,
    })
}

/// Energy of `gpus` together in the newest snapshot's `samples`, joules.
pub fn energy_of(gpus: &[u32], samples: &[GpuSample]) -> Result<f64, String> {
    gpus.iter()
        .map(|i| {
            samples
                .iter()
                .find(|g| g.index == *i)
                .and_then(|g| g.energy_j)
                .ok_or_else(|| format!("GPU {i} reports no energy counter, which the tuner needs"))
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::training::{MetricsPoint, MetricsReport, RankInfo, RankSpec};

    fn rank(rank: u32, gpu: Option<u32>, host: &str) -> RankInfo {
        RankInfo {
            spec: RankSpec {
                rank,
                world_size: 4,
                local_rank: Some(rank),
                host: Some(host.into()),
                gpu,
                gpu_uuid: None,
            },
            attached: true,
            pid: None,
            last: None,
            steps_per_s: None,
        }
    }

    fn trainer(world: u32, ranks: Vec<RankInfo>) -> TrainerInfo {
        TrainerInfo {
            attached: true,
            world_size: Some(world),
            ranks,
            ..TrainerInfo::default()
        }
    }

    #[test]
    fn a_job_is_tuned_on_its_ranks_gpus() {
        assert_eq!(scope(&TrainerInfo::default()), Ok(Scope::Run));
        assert_eq!(
            scope(&trainer(1, vec![rank(0, Some(3), "a")])),
            Ok(Scope::Run)
        );
        let all = vec![
            rank(2, Some(5), "a"),
            rank(0, Some(2), "a"),
            rank(3, Some(7), "a"),
            rank(1, Some(4), "a"),
        ];
        assert_eq!(
            scope(&trainer(4, all.clone())),
            Ok(Scope::Job {
                gpus: vec![2, 4, 5, 7],
                ranks: 4
            })
        );
        // A rank that does not say its GPU: the run's own GPUs stand in.
        let mut unknown = all.clone();
        unknown[1].spec.gpu = None;
        assert_eq!(
            scope(&trainer(4, unknown)),
            Ok(Scope::Job {
                gpus: vec![],
                ranks: 4
            })
        );
        // Half the job reports elsewhere (another node), or not yet.
        let e = scope(&trainer(4, all[..2].to_vec())).unwrap_err();
        assert!(e.contains("a job of 4 ranks and 2 of them report"), "{e}");
        let mut two_hosts = all;
        two_hosts[3].spec.host = Some("b".into());
        let e = scope(&trainer(4, two_hosts)).unwrap_err();
        assert!(e.contains(" on a, b"), "{e}");
    }

    fn point(n: u64, t: f64, step: u64) -> MetricsPoint {
        MetricsPoint {
            n,
            t,
            from: "trainer".into(),
            rank: None,
            report: MetricsReport {
                step: Some(step),
                batch_size: Some(32),
                ..MetricsReport::default()
            },
        }
    }

    #[test]
    fn one_process_is_counted_as_before() {
        let mut t = JobTally::from_now();
        t.absorb_all(&[point(0, 1.0, 10), point(1, 2.0, 15)]);
        assert_eq!((t.samples(), t.step()), (5.0 * 32.0, Some(15)));
    }

    #[test]
    fn a_jobs_energy_is_every_gpus() {
        let gpus: Vec<GpuSample> = (0..4)
            .map(|i| GpuSample {
                index: i,
                energy_j: (i != 3).then_some(1000.0 * f64::from(i + 1)),
                ..GpuSample::default()
            })
            .collect();
        assert_eq!(energy_of(&[0, 2], &gpus), Ok(4000.0));
        assert_eq!(energy_of(&[0, 1, 2], &gpus), Ok(6000.0));
        let e = energy_of(&[1, 3], &gpus).unwrap_err();
        assert!(e.contains("GPU 3 reports no energy counter"), "{e}");
        assert!(energy_of(&[9], &gpus).is_err());
    }
}
