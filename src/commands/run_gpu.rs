//! `gpupilot run --gpu SPEC`: the GPUs (or the MIG instance) a run sees, turned into the
//! `CUDA_VISIBLE_DEVICES` value its child gets.
//!
//! SPEC is a comma-separated list of GPU indices (`0,2`) or `GPU-…` UUIDs, or one MIG instance:
//! its `MIG-…` UUID (or a prefix of it) or `GPU:GI` (`0:7`: GPU 0's GPU instance 7, as `status`
//! lists it). CUDA runs a process on one MIG instance at most, so an instance is named alone.
//! Names are checked against the daemon's newest snapshot.

use crate::telemetry::Snapshot;

/// The `CUDA_VISIBLE_DEVICES` value for `spec` on the node of `snap`, or why not.
pub fn visible_devices(spec: &str, snap: &Snapshot) -> Result<String, String> {
    let words: Vec<&str> = spec.split(',').map(str::trim).collect();
    if words.iter().any(|w| w.is_empty()) {
        return Err(format!(
            "--gpu {spec:?}: an empty name; give indices (0,2), GPU-/MIG- UUIDs or GPU:GI (0:7)"
        ));
    }
    let is_mig = |w: &str| w.contains(':') || w.starts_with("MIG-");
    if words.len() > 1 && words.iter().any(|w| is_mig(w)) {
        return Err(format!(
            "--gpu {spec:?}: a process runs on one MIG instance at most (CUDA uses only the \
             first); name one instance alone"
        ));
    }
    let mut out = Vec::new();
    for w in words {
        out.push(one(w, snap)?);
    }
    Ok(out.join(","))
}

/// Every MIG instance of the node as (`GPU:GI`, UUID).
fn instances(snap: &Snapshot) -> Vec<(String, &str)> {
    snap.gpus
        .iter()
        .flat_map(|g| {
            g.mig
                .iter()
                .flat_map(|m| m.instances.iter())
                .filter_map(move |m| Some((m.address(g.index)?, m.uuid.as_deref()?)))
        })
        .collect()
}

fn known_instances(snap: &Snapshot) -> String {
    let all = instances(snap);
    if all.is_empty() {
        "no GPU of this node is split into MIG instances".into()
    } else {
        let names: Vec<&str> = all.iter().map(|(a, _)| a.as_str()).collect();
        format!("its MIG instances are {}", names.join(", "))
    }
}

fn one(w: &str, snap: &Snapshot) -> Result<String, String> {
    if let Ok(i) = w.parse::<u32>() {
        let g = snap
            .gpus
            .iter()
            .find(|g| g.index == i)
            .ok_or_else(|| format!("--gpu {w}: this node has no GPU {i}"))?;
        if g.mig.as_ref().is_some_and(|m| m.enabled) {
            return Err(format!(
                "--gpu {w}: GPU {i} is in MIG mode, so CUDA runs nothing on it as a whole; \
                 name one of its instances ({})",
                known_instances(snap)
            ));
        }
        return Ok(i.to_string());
    }
    if w.starts_with("GPU-") {
        return snap
            .gpus
            .iter()
            .find(|g| g.uuid.as_deref().is_some_and(|u| u.starts_with(w)))
            .map(|_| w.to_string())
            .ok_or_else(|| format!("--gpu {w}: no GPU of this node has that UUID"));
    }
    let all = instances(snap);
    let found = if w.starts_with("MIG-") {
        all.iter().find(|(_, u)| u.starts_with(w))
    } else if w.contains(':') {
        all.iter().find(|(a, _)| a == w)
    } else {
        return Err(format!(
            "--gpu {w}: not a GPU index, a GPU-/MIG- UUID or GPU:GI (0:7)"
        ));
    };
    found
        .map(|(_, u)| (*u).to_string())
        .ok_or_else(|| format!("--gpu {w}: no such MIG instance; {}", known_instances(snap)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::GpuSample;
    use crate::telemetry::mig::{MigInstance, MigState};

    fn snap() -> Snapshot {
        let inst = |gi: u32, uuid: &str| MigInstance {
            gpu_instance_id: Some(gi),
            uuid: Some(uuid.into()),
            ..MigInstance::default()
        };
        Snapshot {
            gpus: vec![
                GpuSample {
                    index: 0,
                    uuid: Some("GPU-aaaa".into()),
                    mig: Some(MigState {
                        enabled: true,
                        pending: true,
                        instances: vec![inst(2, "MIG-1111-2222"), inst(7, "MIG-3333-4444")],
                    }),
                    ..GpuSample::default()
                },
                GpuSample {
                    index: 1,
                    uuid: Some("GPU-bbbb".into()),
                    ..GpuSample::default()
                },
            ],
            ..Snapshot::default()
        }
    }

    #[test]
    fn an_instance_by_address_or_uuid_becomes_its_mig_uuid() {
        let s = snap();
        assert_eq!(visible_devices("0:7", &s).unwrap(), "MIG-3333-4444");
        assert_eq!(visible_devices("MIG-1111", &s).unwrap(), "MIG-1111-2222");
        assert_eq!(visible_devices("1", &s).unwrap(), "1");
        assert_eq!(visible_devices("GPU-bb", &s).unwrap(), "GPU-bb");
    }

    #[test]
    fn a_run_on_an_instance_is_given_its_gpu_for_energy() {
        let s = snap();
        let gpus = crate::control::node::visible_gpus(Some("MIG-3333-4444"), &s).unwrap();
        assert_eq!(gpus.into_iter().collect::<Vec<_>>(), [0]);
    }

    #[test]
    fn bad_names_say_what_exists() {
        let s = snap();
        let e = visible_devices("0:5", &s).unwrap_err();
        assert!(e.contains("its MIG instances are 0:2, 0:7"), "{e}");
        let e = visible_devices("0", &s).unwrap_err();
        assert!(e.contains("GPU 0 is in MIG mode"), "{e}");
        let e = visible_devices("0:2,0:7", &s).unwrap_err();
        assert!(e.contains("one MIG instance at most"), "{e}");
        assert!(visible_devices("7", &s).unwrap_err().contains("no GPU 7"));
        assert!(
            visible_devices("x", &s)
                .unwrap_err()
                .contains("not a GPU index")
        );
        assert!(
            visible_devices("1,", &s)
                .unwrap_err()
                .contains("empty name")
        );
    }
}
