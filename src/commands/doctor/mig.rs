//! `doctor`'s MIG line: which GPUs are split into MIG instances, and a MIG mode change that
//! waits for a GPU reset (set with `nvidia-smi -mig`, applied only by a reset, so until then
//! the GPU is not in the mode its operator chose).

use super::checks::{Check, GpuFacts, Status};

/// The `mig` check, or none when no GPU reports MIG (consumer parts, V100, the simulator).
pub fn mig_check(live: &[&GpuFacts]) -> Option<Check> {
    let with: Vec<(u32, &crate::telemetry::mig::MigState)> = live
        .iter()
        .filter_map(|g| g.mig.as_ref().map(|m| (g.index, m)))
        .collect();
    if with.is_empty() {
        return None;
    }
    let pending: Vec<String> = with
        .iter()
        .filter(|(_, m)| m.change_pending())
        .map(|(i, m)| {
            format!(
                "GPU {i}'s MIG mode turns {} at its next reset: reset the GPU to apply \
                 (`sudo nvidia-smi -r -i {i}` with no process on it)",
                if m.pending { "on" } else { "off" }
            )
        })
        .collect();
    let split: Vec<String> = with
        .iter()
        .filter(|(_, m)| m.enabled)
        .map(|(i, m)| {
            let profiles: Vec<&str> = m
                .instances
                .iter()
                .map(|x| x.profile.as_deref().unwrap_or("?"))
                .collect();
            format!(
                "GPU {i}: {} MIG instance{} ({})",
                m.instances.len(),
                if m.instances.len() == 1 { "" } else { "s" },
                profiles.join(", ")
            )
        })
        .collect();
    let detail = |mut parts: Vec<String>, rest: Vec<String>| {
        parts.extend(rest);
        parts.join("; ")
    };
    Some(if !pending.is_empty() {
        Check {
            name: "mig".into(),
            status: Status::Warn,
            detail: detail(pending, split),
        }
    } else if !split.is_empty() {
        Check {
            name: "mig".into(),
            status: Status::Info,
            detail: split.join("; "),
        }
    } else {
        Check {
            name: "mig".into(),
            status: Status::Ok,
            detail: "MIG is off on every GPU that has it, and no change waits".into(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::mig::{MigInstance, MigState};

    fn gpu(index: u32, mig: Option<MigState>) -> GpuFacts {
        GpuFacts {
            index,
            mig,
            ..GpuFacts::default()
        }
    }

    #[test]
    fn pending_change_is_a_warning_instances_are_info_none_is_no_line() {
        assert_eq!(mig_check(&[&gpu(0, None)]), None);
        let split = MigState {
            enabled: true,
            pending: true,
            instances: vec![
                MigInstance {
                    profile: Some("3g.40gb".into()),
                    ..MigInstance::default()
                },
                MigInstance {
                    profile: Some("1g.10gb".into()),
                    ..MigInstance::default()
                },
            ],
        };
        let c = mig_check(&[&gpu(0, Some(split.clone()))]).unwrap();
        assert_eq!(c.status, Status::Info);
        assert_eq!(c.detail, "GPU 0: 2 MIG instances (3g.40gb, 1g.10gb)");
        let waiting = MigState {
            enabled: false,
            pending: true,
            instances: vec![],
        };
        let c = mig_check(&[&gpu(0, Some(split)), &gpu(1, Some(waiting))]).unwrap();
        assert_eq!(c.status, Status::Warn);
        assert!(
            c.detail
                .starts_with("GPU 1's MIG mode turns on at its next reset: reset the GPU to apply"),
            "{}",
            c.detail
        );
        assert!(c.detail.contains("GPU 0: 2 MIG instances"), "{}", c.detail);
        let off = MigState::default();
        let c = mig_check(&[&gpu(1, Some(off))]).unwrap();
        assert_eq!(c.status, Status::Ok);
    }
}
