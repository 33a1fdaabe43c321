//! Who a synthetic trainer is in a data-parallel job, and how fast the job steps.
//!
//! A rank learns its place the way a PyTorch script does: `RANK`, `WORLD_SIZE` and `LOCAL_RANK`
//! from the environment (torchrun's, or `gpupilot ranks`'), each overridable by a flag. Its GPU
//! is local rank `l`'s: `--gpu + l` (`--gpu` is the GPU of local rank 0, the job's first; 0
//! when not given). The job's GPUs are those of local ranks `0..WORLD_SIZE`, i.e. `--gpu + r`
//! for every rank `r`: one node, one GPU per rank, as `gpupilot ranks --nproc N` starts them.
//! GPUs the daemon's telemetry does not show (ranks on other nodes) are left out of the pacing.
//!
//! Data-parallel pacing: every rank waits for the slowest at each step's gradient all-reduce,
//! so every rank's step takes the job's step time — the longest of the job's GPUs' steps, each
//! computed from that GPU's SM clock in the same telemetry snapshot. A rank still reports its
//! own step time (compute and data wait: what it would take alone) and the wait as
//! `sync_wait_s`, which is how a straggler shows: its own step time stands out, its siblings
//! wait for it.
//!
//! Pure: the environment is passed in.

use crate::protocol::RankSpec;

/// What the command line says about the rank (each overrides its environment variable).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RankFlags {
    pub rank: Option<u32>,
    pub world_size: Option<u32>,
    pub local_rank: Option<u32>,
    /// The GPU of local rank 0 (`--gpu`).
    pub gpu: Option<u32>,
}

/// This process's place in its job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankPlan {
    pub rank: u32,
    pub world_size: u32,
    pub local_rank: u32,
    /// The GPU of local rank 0.
    pub first_gpu: u32,
}

impl RankPlan {
    /// The plan from the flags, else the environment (`env("RANK")`, …): a process told
    /// nothing is rank 0 of a world of 1 on `--gpu` (or GPU 0).
    pub fn resolve(
        flags: &RankFlags,
        env: impl Fn(&str) -> Option<String>,
    ) -> anyhow::Result<Self> {
        let var = |name: &str| -> anyhow::Result<Option<u32>> {
            match env(name) {
                None => Ok(None),
                Some(v) if v.trim().is_empty() => Ok(None),
                Some(v) => v.trim().parse().map(Some).map_err(|_| {
                    anyhow::anyhow!("{name}={v:?} is not a whole number (torchrun sets it to one)")
                }),
            }
        };
        let world_size = flags.world_size.or(var("WORLD_SIZE")?).unwrap_or(1);
        let rank = flags.rank.or(var("RANK")?).unwrap_or(0);
        let local_rank = flags.local_rank.or(var("LOCAL_RANK")?).unwrap_or(rank);
        if world_size == 0 {
            anyhow::bail!("a world of 0 ranks trains nothing: WORLD_SIZE must be 1 or more");
        }
        if rank >= world_size {
            anyhow::bail!(
                "rank {rank} is not in a world of {world_size} (ranks are 0..{world_size})"
            );
        }
        Ok(RankPlan {
            rank,
            world_size,
            local_rank,
            first_gpu: flags.gpu.unwrap_or(0),
        })
    }

    /// A job of several ranks: the change protocol with votes, and pacing by the slowest GPU.
    pub fn distributed(&self) -> bool {
        self.world_size > 1
    }

    /// The GPU this rank trains on.
    pub fn gpu(&self) -> u32 {
        self.first_gpu + self.local_rank
    }

    /// The job's GPUs, by rank (see the module doc).
    pub fn job_gpus(&self) -> Vec<u32> {
        (0..self.world_size).map(|r| self.first_gpu + r).collect()
    }

    /// What `trainer_attach` says: `None` for a single process (the old immediate knob path).
    pub fn spec(&self, host: &str, gpu_uuid: Option<String>) -> Option<RankSpec> {
        self.distributed().then(|| RankSpec {
            rank: self.rank,
            world_size: self.world_size,
            local_rank: Some(self.local_rank),
            host: Some(host.to_string()),
            gpu: Some(self.gpu()),
            gpu_uuid,
        })
    }
}

/// The job's step time, seconds: this rank's own step (`own_s`) or the slowest of the other
/// GPUs' (`others_s`, each at its GPU's clock), whichever is longer — everyone waits for the
/// slowest at the all-reduce.
pub fn job_step_s(own_s: f64, others_s: impl IntoIterator<Item = f64>) -> f64 {
    others_s
        .into_iter()
        .filter(|s| s.is_finite())
        .fold(own_s, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    #[test]
    fn torchruns_environment_names_the_rank_and_its_gpu() {
        let plan = RankPlan::resolve(
            &RankFlags::default(),
            env(&[("RANK", "2"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "2")]),
        )
        .unwrap();
        assert!(plan.distributed());
        assert_eq!((plan.rank, plan.gpu()), (2, 2));
        assert_eq!(plan.job_gpus(), [0, 1, 2, 3]);
        let spec = plan.spec("node7", None).unwrap();
        assert_eq!(
            (spec.rank, spec.world_size, spec.local_rank, spec.gpu),
            (2, 4, Some(2), Some(2))
        );
        assert_eq!(spec.host.as_deref(), Some("node7"));

        // --gpu moves the whole job: local rank l trains on --gpu + l.
        let flags = RankFlags {
            gpu: Some(4),
            ..RankFlags::default()
        };
        let plan = RankPlan::resolve(&flags, env(&[("RANK", "1"), ("WORLD_SIZE", "2")])).unwrap();
        assert_eq!(
            (plan.local_rank, plan.gpu()),
            (1, 5),
            "LOCAL_RANK defaults to RANK"
        );
        assert_eq!(plan.job_gpus(), [4, 5]);

        // Flags win over the environment.
        let flags = RankFlags {
            rank: Some(0),
            world_size: Some(2),
            local_rank: Some(0),
            gpu: None,
        };
        let plan = RankPlan::resolve(&flags, env(&[("RANK", "3"), ("WORLD_SIZE", "8")])).unwrap();
        assert_eq!((plan.rank, plan.world_size, plan.gpu()), (0, 2, 0));
    }

    #[test]
    fn a_single_process_is_not_a_rank_and_bad_values_are_refused() {
        let plan = RankPlan::resolve(&RankFlags::default(), env(&[])).unwrap();
        assert!(!plan.distributed());
        assert_eq!((plan.gpu(), plan.job_gpus()), (0, vec![0]));
        assert_eq!(
            plan.spec("h", None),
            None,
            "no rank spec: the immediate knob path"
        );
        // torchrun with one process is a single process too.
        let one = RankPlan::resolve(
            &RankFlags {
                gpu: Some(3),
                ..RankFlags::default()
            },
            env(&[("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")]),
        )
        .unwrap();
        assert_eq!((one.distributed(), one.gpu()), (false, 3));

        let e = RankPlan::resolve(&RankFlags::default(), env(&[("RANK", "x")])).unwrap_err();
        assert!(e.to_string().contains("RANK=\"x\""), "{e}");
        let e = RankPlan::resolve(
            &RankFlags::default(),
            env(&[("RANK", "4"), ("WORLD_SIZE", "4")]),
        )
        .unwrap_err();
        assert!(e.to_string().contains("not in a world of 4"), "{e}");
        assert!(RankPlan::resolve(&RankFlags::default(), env(&[("WORLD_SIZE", "0")])).is_err());
    }

    #[test]
    fn the_job_steps_at_its_slowest_gpu() {
        assert_eq!(job_step_s(0.20, [0.21, 0.19]), 0.21);
        assert_eq!(
            job_step_s(0.30, [0.21, 0.19]),
            0.30,
            "this rank is the slowest"
        );
        assert_eq!(job_step_s(0.20, []), 0.20);
        assert_eq!(job_step_s(0.20, [f64::NAN]), 0.20);
    }
}
