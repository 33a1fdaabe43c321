//! Power decisions for data-parallel jobs: one cap for all the GPUs of a job.
//!
//! A data-parallel job of several ranks (one per GPU) runs at the pace of its slowest rank:
//! every rank waits for the others at each gradient sync. A cap that the thermal governor or the
//! node budget lowers on one of its GPUs makes that GPU's rank the straggler, and the job's
//! other GPUs then spend the difference waiting, drawing power for nothing. With
//! [`JobCaps::Together`] (the default) the loops hold every GPU of such a job at one cap: the
//! lowest cap they give any of them ([`hold_together`]); the budget shares watts to a job as
//! one unit and splits them evenly (`budget::allocate_jobs`). [`JobCaps::PerGpu`] leaves each
//! GPU to its own decision, as for independent processes.
//!
//! A job is a live run with at least two ranks whose GPUs on this node are known (the daemon's
//! trainer channel says which GPU each rank trains on). Runs of one process are never grouped.
//!
//! Pure: no clock, no GPU, no I/O. `node` feeds the loops' per-GPU caps and applies the result.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// How the loops cap the GPUs of a job of several ranks (`[power] job_caps` in `control.toml`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum JobCaps {
    /// Every GPU of a job at one cap: the lowest the loops give any of them.
    #[default]
    Together,
    /// Each GPU capped on its own.
    PerGpu,
}

impl JobCaps {
    /// The setting's spelling: `together`, `per-gpu`.
    pub fn as_str(self) -> &'static str {
        match self {
            JobCaps::Together => "together",
            JobCaps::PerGpu => "per-gpu",
        }
    }

    pub fn parse(s: &str) -> Option<JobCaps> {
        match s {
            "together" => Some(JobCaps::Together),
            "per-gpu" | "per_gpu" => Some(JobCaps::PerGpu),
            _ => None,
        }
    }
}

/// A live job of several ranks: its run and the GPUs of its ranks on this node.
#[derive(Debug, Clone, PartialEq)]
pub struct JobGroup {
    pub run: String,
    pub gpus: Vec<u32>,
}

/// One job held at one cap.
#[derive(Debug, Clone, PartialEq)]
pub struct JobHold {
    pub run: String,
    /// The job's GPUs, ascending.
    pub gpus: Vec<u32>,
    pub cap_w: f64,
    /// The GPU whose cap is the lowest: the one the governor or the budget lowered.
    pub leader: u32,
}

impl JobHold {
    /// `job r1's GPUs 0-3 held at 300 W together`.
    pub fn describe(&self) -> String {
        format!(
            "job {}'s GPUs {} held at {:.0} W together",
            self.run,
            gpu_ranges(&self.gpus),
            self.cap_w
        )
    }
}

/// The groups to hold: GPUs sorted and deduplicated, groups of fewer than two GPUs dropped, and
/// groups that share a GPU (two jobs on one GPU) merged into one, since a GPU has one cap.
pub fn normalize(groups: &[JobGroup]) -> Vec<JobGroup> {
    let mut out: Vec<(Vec<String>, BTreeSet<u32>)> = Vec::new();
    for g in groups {
        let set: BTreeSet<u32> = g.gpus.iter().copied().collect();
        if set.len() < 2 {
            continue;
        }
        let mut runs = vec![g.run.clone()];
        let mut merged = set;
        // Fold in every group already kept that shares a GPU with this one.
        let mut i = 0;
        while i < out.len() {
            if out[i].1.is_disjoint(&merged) {
                i += 1;
            } else {
                let (r, s) = out.swap_remove(i);
                runs.extend(r);
                merged.extend(s);
                i = 0;
            }
        }
        out.push((runs, merged));
    }
    out.into_iter()
        .map(|(mut runs, gpus)| {
            runs.sort();
            runs.dedup();
            JobGroup {
                run: runs.join("+"),
                gpus: gpus.into_iter().collect(),
            }
        })
        .collect()
}

/// `targets`: the cap the loops give each GPU they control (the governor's, the budget's, the
/// lower of the two). Every job with a GPU among them is held at the lowest of its GPUs'
/// targets; a job none of whose GPUs the loops control is left alone. `groups` as
/// [`normalize`] gives them.
pub fn hold_together(targets: &BTreeMap<u32, f64>, groups: &[JobGroup]) -> Vec<JobHold> {
    groups
        .iter()
        .filter_map(|g| {
            let (leader, cap_w) = g
                .gpus
                .iter()
                .filter_map(|i| targets.get(i).map(|w| (*i, *w)))
                .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))?;
            Some(JobHold {
                run: g.run.clone(),
                gpus: g.gpus.clone(),
                cap_w,
                leader,
            })
        })
        .collect()
}

/// The caps after the holds: every GPU of a held job at most at the job's cap (a GPU the loops
/// did not control before gets it too); the others keep their target.
pub fn with_holds(targets: &BTreeMap<u32, f64>, holds: &[JobHold]) -> BTreeMap<u32, f64> {
    let mut out = targets.clone();
    for h in holds {
        for g in &h.gpus {
            let c = out.entry(*g).or_insert(h.cap_w);
            *c = c.min(h.cap_w);
        }
    }
    out
}

/// GPU indices for people: `0-3`, `0,2,5`, `0-2,5`.
pub fn gpu_ranges(gpus: &[u32]) -> String {
    let mut v: Vec<u32> = gpus.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        parts.push(match j - i {
            0 => v[i].to_string(),
            1 => format!("{},{}", v[i], v[j]),
            _ => format!("{}-{}", v[i], v[j]),
        });
        i = j + 1;
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(run: &str, gpus: &[u32]) -> JobGroup {
        JobGroup {
            run: run.into(),
            gpus: gpus.to_vec(),
        }
    }

    #[test]
    fn a_lowered_gpu_holds_its_whole_job_at_its_cap() {
        // The governor cut GPU 2 to 300 W; GPU 5 (another run) to 450 W; the budget gave
        // GPU 0 520 W.
        let targets = BTreeMap::from([(0, 520.0), (2, 300.0), (5, 450.0)]);
        let groups = normalize(&[group("r1", &[3, 2, 1, 0]), group("r2", &[6, 7])]);
        let holds = hold_together(&targets, &groups);
        assert_eq!(
            holds,
            vec![JobHold {
                run: "r1".into(),
                gpus: vec![0, 1, 2, 3],
                cap_w: 300.0,
                leader: 2,
            }],
            "r2's GPUs are not controlled: nothing to hold"
        );
        assert_eq!(
            holds[0].describe(),
            "job r1's GPUs 0-3 held at 300 W together"
        );
        let caps = with_holds(&targets, &holds);
        assert_eq!(
            caps,
            BTreeMap::from([(0, 300.0), (1, 300.0), (2, 300.0), (3, 300.0), (5, 450.0)])
        );
    }

    #[test]
    fn the_lowest_cap_leads_and_ties_go_to_the_lowest_index() {
        let targets = BTreeMap::from([(4, 400.0), (5, 380.0), (6, 380.0)]);
        let holds = hold_together(&targets, &normalize(&[group("r", &[4, 5, 6, 7])]));
        assert_eq!((holds[0].leader, holds[0].cap_w), (5, 380.0));
        // No GPU is ever raised by a hold: a lower target stays lower.
        let caps = with_holds(&targets, &holds);
        assert!(caps.values().all(|c| *c == 380.0), "{caps:?}");
    }

    #[test]
    fn single_gpus_are_no_job_and_shared_gpus_merge_jobs() {
        let groups = normalize(&[
            group("solo", &[1]),
            group("dup", &[2, 2]),
            group("a", &[3, 4]),
            group("b", &[5, 6]),
            group("c", &[4, 5]),
        ]);
        assert_eq!(groups, vec![group("a+b+c", &[3, 4, 5, 6])]);
        let holds = hold_together(&BTreeMap::from([(6, 250.0)]), &groups);
        assert_eq!(holds[0].gpus, [3, 4, 5, 6]);
        assert_eq!(holds[0].cap_w, 250.0);
    }

    #[test]
    fn settings_and_ranges_read_as_written() {
        assert_eq!(JobCaps::default(), JobCaps::Together);
        for c in [JobCaps::Together, JobCaps::PerGpu] {
            assert_eq!(JobCaps::parse(c.as_str()), Some(c));
            assert_eq!(
                serde_json::to_string(&c).unwrap(),
                format!("\"{}\"", c.as_str())
            );
        }
        assert_eq!(JobCaps::parse("each"), None);
        assert_eq!(gpu_ranges(&[3, 0, 1, 2]), "0-3");
        assert_eq!(gpu_ranges(&[0, 2, 5]), "0,2,5");
        assert_eq!(gpu_ranges(&[0, 1, 2, 5, 6]), "0-2,5,6");
        assert_eq!(gpu_ranges(&[]), "");
    }
}
