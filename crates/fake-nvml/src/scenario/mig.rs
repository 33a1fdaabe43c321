//! `[[mig]]` tables: which GPUs are in MIG mode (Multi-Instance GPU), the GPU instances each
//! one is split into, and which processes run in each.
//!
//! Profiles are NVIDIA's, as `nvidia-smi mig -lgip` lists them on the part (name, profile id,
//! compute and memory slices, SMs, copy engines, memory in MiB). Instances are placed as the
//! driver places them: each profile has a fixed set of start slices, and an instance takes the
//! lowest free one in the order the scenario lists them; its GPU instance id follows from its
//! profile and start (the A100/H100 numbering: 7g → 0, 3g → 1–2, 2g → 3–5, 1g → 7–13). Every
//! GPU instance holds one compute instance that spans it (compute instance id 0), as
//! `nvidia-smi mig -cgi … -C` makes them.

use serde::Deserialize;
use toml::Spanned;

use super::resolve::Located;

/// One MIG profile of a part, as `nvidia-smi mig -lgip` and `nvmlDeviceGetGpuInstanceProfileInfo`
/// give it.
#[derive(Debug, PartialEq, Eq)]
pub struct MigProfile {
    /// `1g.10gb`: compute slices, then memory.
    pub name: &'static str,
    /// nvml.h's `NVML_GPU_INSTANCE_PROFILE_*` index (the argument of the profile-info call).
    pub nvml_profile: u32,
    /// The profile id `nvidia-smi mig -lgip` prints (`nvmlGpuInstanceProfileInfo_t.id`).
    pub id: u32,
    /// Compute slices (of 7).
    pub slices: u32,
    /// Memory slices (of 8): the placement unit.
    pub memory_slices: u32,
    /// Most instances of this profile on one GPU.
    pub max_instances: u32,
    pub multiprocessors: u32,
    pub copy_engines: u32,
    /// Memory an instance of this profile has, MiB (`memorySizeMB`).
    pub memory_mib: u64,
    /// Memory slices an instance may start at, and the GPU instance id each start gives.
    pub placements: &'static [(u32, u32)],
}

const ONE_G: &[(u32, u32)] = &[(0, 7), (1, 8), (2, 9), (3, 10), (4, 11), (5, 12), (6, 13)];
const ONE_G_DOUBLE: &[(u32, u32)] = &[(0, 3), (2, 4), (4, 5), (6, 6)];
const TWO_G: &[(u32, u32)] = &[(0, 3), (2, 4), (4, 5)];
const THREE_G: &[(u32, u32)] = &[(0, 1), (4, 2)];
const FOUR_G: &[(u32, u32)] = &[(0, 1)];
const SEVEN_G: &[(u32, u32)] = &[(0, 0)];

#[allow(clippy::too_many_arguments)]
const fn profile(
    name: &'static str,
    nvml_profile: u32,
    id: u32,
    slices: u32,
    memory_slices: u32,
    max_instances: u32,
    multiprocessors: u32,
    memory_mib: u64,
    placements: &'static [(u32, u32)],
) -> MigProfile {
    MigProfile {
        name,
        nvml_profile,
        id,
        slices,
        memory_slices,
        max_instances,
        multiprocessors,
        copy_engines: slices,
        memory_mib,
        placements,
    }
}

/// A100-SXM4-80GB (108 SMs, 98 of them in MIG's 7 slices).
pub const A100_80GB: &[MigProfile] = &[
    profile("1g.10gb", 0, 19, 1, 1, 7, 14, 9_728, ONE_G),
    profile("1g.20gb", 9, 15, 1, 2, 4, 14, 19_968, ONE_G_DOUBLE),
    profile("2g.20gb", 1, 14, 2, 2, 3, 28, 19_968, TWO_G),
    profile("3g.40gb", 2, 9, 3, 4, 2, 42, 40_192, THREE_G),
    profile("4g.40gb", 3, 5, 4, 4, 1, 56, 40_192, FOUR_G),
    profile("7g.80gb", 4, 0, 7, 8, 1, 98, 81_152, SEVEN_G),
];

/// H100-SXM5-80GB (132 SMs).
pub const H100_80GB: &[MigProfile] = &[
    profile("1g.10gb", 0, 19, 1, 1, 7, 16, 9_984, ONE_G),
    profile("1g.20gb", 9, 15, 1, 2, 4, 26, 20_096, ONE_G_DOUBLE),
    profile("2g.20gb", 1, 14, 2, 2, 3, 32, 20_096, TWO_G),
    profile("3g.40gb", 2, 9, 3, 4, 2, 60, 40_320, THREE_G),
    profile("4g.40gb", 3, 5, 4, 4, 1, 64, 40_320, FOUR_G),
    profile("7g.80gb", 4, 0, 7, 8, 1, 132, 80_896, SEVEN_G),
];

/// The MIG profiles of a catalog part, if fake-nvml knows them.
pub fn profiles_of(gpu_id: &str) -> Option<&'static [MigProfile]> {
    match gpu_id {
        "a100-sxm-80gb" => Some(A100_80GB),
        "h100-sxm" => Some(H100_80GB),
        _ => None,
    }
}

/// A GPU's MIG state.
#[derive(Debug, Clone, PartialEq)]
pub struct MigGpu {
    /// MIG mode now.
    pub enabled: bool,
    /// MIG mode after the next GPU reset (differs from `enabled` while a change waits).
    pub pending: bool,
    /// GPU instances, by GPU instance id (the order MIG device handles have).
    pub instances: Vec<MigInstance>,
}

/// One GPU instance and its single compute instance.
#[derive(Debug, Clone, PartialEq)]
pub struct MigInstance {
    pub profile: &'static MigProfile,
    pub gpu_instance_id: u32,
    /// First memory slice it occupies.
    pub start: u32,
    /// Processes running in it.
    pub pids: Vec<u32>,
}

impl MigGpu {
    /// The instance a process runs in, by pid.
    pub fn instance_of(&self, pid: u32) -> Option<&MigInstance> {
        self.instances.iter().find(|m| m.pids.contains(&pid))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMig {
    gpu: Spanned<usize>,
    #[serde(default = "yes")]
    enabled: bool,
    pending: Option<bool>,
    #[serde(default)]
    instances: Vec<RawInstance>,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInstance {
    profile: Spanned<String>,
    #[serde(default)]
    pids: Vec<u32>,
}

/// Resolves the `[[mig]]` tables of a node of `gpus` (catalog ids): one entry per GPU.
/// `processes` lists (gpu, pid) of every process the node reports.
pub(super) fn resolve_mig(
    raw: Vec<RawMig>,
    gpus: &[String],
    processes: &[(usize, u32)],
) -> Result<Vec<Option<MigGpu>>, Located> {
    let mut out: Vec<Option<MigGpu>> = vec![None; gpus.len()];
    for m in raw {
        let i = *m.gpu.get_ref();
        let span = m.gpu.span();
        if i >= gpus.len() {
            return Err((
                span,
                format!("gpu {i} does not exist: the node has {} GPUs", gpus.len()),
            ));
        }
        if out[i].is_some() {
            return Err((span, format!("gpu {i} has two [[mig]] tables")));
        }
        let Some(table) = profiles_of(&gpus[i]) else {
            return Err((
                span,
                format!(
                    "{} has no MIG profiles in fake-nvml (MIG GPUs: a100-sxm-80gb, h100-sxm)",
                    gpus[i]
                ),
            ));
        };
        if !m.enabled && !m.instances.is_empty() {
            return Err((span, "instances need `enabled = true`".into()));
        }
        let mut used = [false; 8];
        let mut instances = Vec::new();
        for inst in m.instances {
            let name = inst.profile.get_ref();
            let Some(p) = table.iter().find(|p| p.name == name) else {
                let known: Vec<_> = table.iter().map(|p| p.name).collect();
                return Err((
                    inst.profile.span(),
                    format!(
                        "unknown MIG profile `{name}` for {}: expected one of {}",
                        gpus[i],
                        known.join(", ")
                    ),
                ));
            };
            let free = |start: u32| {
                (start..start + p.memory_slices)
                    .all(|s| !used.get(s as usize).copied().unwrap_or(true))
            };
            let Some(&(start, gi)) = p.placements.iter().find(|(s, _)| free(*s)) else {
                return Err((
                    inst.profile.span(),
                    format!("no free placement for a {name} instance on gpu {i}: the GPU is full"),
                ));
            };
            for s in start..start + p.memory_slices {
                used[s as usize] = true;
            }
            for pid in &inst.pids {
                if !processes.contains(&(i, *pid)) {
                    return Err((
                        inst.profile.span(),
                        format!("pid {pid} is not a process of gpu {i} in [[processes]]"),
                    ));
                }
            }
            instances.push(MigInstance {
                profile: p,
                gpu_instance_id: gi,
                start,
                pids: inst.pids,
            });
        }
        let slices: u32 = instances.iter().map(|m| m.profile.slices).sum();
        if slices > 7 {
            return Err((
                span,
                format!("gpu {i}'s instances take {slices} of 7 compute slices"),
            ));
        }
        let gpu = MigGpu {
            enabled: m.enabled,
            pending: m.pending.unwrap_or(m.enabled),
            instances: {
                let mut v = instances;
                v.sort_by_key(|m| m.gpu_instance_id);
                v
            },
        };
        if gpu.enabled {
            for (g, pid) in processes {
                if *g == i && gpu.instance_of(*pid).is_none() {
                    return Err((
                        span,
                        format!(
                            "process {pid} of gpu {i} runs in no MIG instance: list it in one instance's `pids`"
                        ),
                    ));
                }
            }
        }
        out[i] = Some(gpu);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use crate::scenario::Scenario;

    fn err(text: &str) -> String {
        Scenario::parse(text, "s.toml").unwrap_err().to_string()
    }

    #[test]
    fn the_shipped_mig_scenario_places_as_the_driver() {
        let s = Scenario::parse(
            include_str!("../../scenarios/mig-a100.toml"),
            "mig-a100.toml",
        )
        .unwrap();
        let m = s.mig[0].as_ref().unwrap();
        assert!(m.enabled && m.pending);
        let got: Vec<_> = m
            .instances
            .iter()
            .map(|i| (i.profile.name, i.gpu_instance_id, i.start, i.pids.clone()))
            .collect();
        assert_eq!(
            got,
            [
                ("3g.40gb", 2, 4, vec![4200101]),
                ("1g.10gb", 7, 0, vec![4200100]),
                ("1g.10gb", 8, 1, vec![]),
                ("1g.10gb", 9, 2, vec![]),
            ]
        );
        assert_eq!(s.mig[1], None);
    }

    #[test]
    fn layouts_that_cannot_be_are_errors_with_their_place() {
        let base = "gpus = [\"a100-sxm-80gb\", \"v100-sxm2\"]\n";
        let e = err(&format!("{base}[[mig]]\ngpu = 1\n"));
        assert!(e.contains("v100-sxm2 has no MIG profiles"), "{e}");
        let e = err(&format!(
            "{base}[[mig]]\ngpu = 0\ninstances = [{{ profile = \"2g.10gb\" }}]\n"
        ));
        assert!(e.contains("unknown MIG profile `2g.10gb`"), "{e}");
        assert!(e.starts_with("s.toml:4:"), "{e}");
        let e = err(&format!(
            "{base}[[mig]]\ngpu = 0\ninstances = [{{ profile = \"4g.40gb\" }}, {{ profile = \"3g.40gb\" }}, {{ profile = \"1g.10gb\" }}]\n"
        ));
        assert!(e.contains("no free placement for a 1g.10gb"), "{e}");
        let e = err(&format!(
            "{base}[[processes]]\ngpu = 0\npid = 7\n[[mig]]\ngpu = 0\ninstances = [{{ profile = \"1g.10gb\" }}]\n"
        ));
        assert!(
            e.contains("process 7 of gpu 0 runs in no MIG instance"),
            "{e}"
        );
        let e = err(&format!(
            "{base}[[mig]]\ngpu = 0\nenabled = false\ninstances = [{{ profile = \"1g.10gb\" }}]\n"
        ));
        assert!(e.contains("instances need `enabled = true`"), "{e}");
    }
}
