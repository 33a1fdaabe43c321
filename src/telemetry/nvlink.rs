//! NVLink and the node's topology, read through NVML.
//!
//! What does not change while the node runs — each GPU's links, their version and what is at
//! their other end, how far apart two GPUs are on PCIe, the CPUs and NUMA node a GPU is
//! attached to — is read once when the source opens ([`NodeTopology`], in `NodeInfo`). What
//! does — whether each link is up, and its traffic — is read every sample with a single
//! `nvmlDeviceGetFieldValues` call per GPU (state, TX and RX data counters of every link, by
//! scope id), and the rate is the counters' difference over their driver timestamps
//! ([`NvLinkSample`], in `GpuSample`). NVML's older `nvmlDeviceGetNvLinkUtilizationCounter` is
//! deprecated and not used. A GPU without NVLink, or a library that has none of these calls,
//! leaves them absent, never zero.

use std::sync::Mutex;

use nvml_wrapper::enum_wrappers::device::TopologyLevel;
use nvml_wrapper::{Device, Nvml};
use serde::{Deserialize, Serialize};

/// NVML field ids (`NVML_FI_DEV_*`, nvml.h).
const FI_NVLINK_LINK_COUNT: u32 = 91;
const FI_NVLINK_THROUGHPUT_DATA_TX: u32 = 138;
const FI_NVLINK_THROUGHPUT_DATA_RX: u32 = 139;
const FI_NVLINK_GET_STATE: u32 = 165;
/// Most links a GPU has (`NVML_NVLINK_MAX_LINKS`): bounds what a driver's link count makes
/// us allocate and ask for.
const MAX_LINKS: u32 = 36;
/// How long a first read waits for its second: longer than the fake library's 0.1 s step, and
/// short enough for a one-shot `status`. Paid once per GPU per process.
const FIRST_GAP: std::time::Duration = std::time::Duration::from_millis(120);
/// Words of CPU mask asked for: 4096 logical CPUs.
const CPU_MASK_WORDS: usize = 64;

/// One GPU's NVLinks now.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NvLinkSample {
    /// Links the GPU has, and how many of them are up now.
    pub links: u32,
    pub links_up: u32,
    /// Payload sent and received over all links, bytes per second (absent on the first
    /// sample: a rate needs two reads of the counters).
    pub tx_bytes_s: Option<f64>,
    pub rx_bytes_s: Option<f64>,
    /// Each link, in link order.
    pub per_link: Vec<LinkNow>,
}

impl NvLinkSample {
    /// Links that are down now, by number.
    pub fn down(&self) -> Vec<u32> {
        (0u32..)
            .zip(&self.per_link)
            .filter(|(_, l)| l.up == Some(false))
            .map(|(i, _)| i)
            .collect()
    }
}

/// One link now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LinkNow {
    /// `NVML_FI_DEV_NVLINK_GET_STATE`: the link trained and is active.
    pub up: Option<bool>,
    pub tx_bytes_s: Option<f64>,
    pub rx_bytes_s: Option<f64>,
}

/// How the GPUs of the node are wired, read once.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeTopology {
    /// `matrix[i][j]`: how GPU i reaches GPU j, in `nvidia-smi topo -m`'s words: `X` (itself),
    /// `NV#` (# NVLinks, directly or through NVSwitch), `PIX` (one PCIe switch), `PXB` (several
    /// switches), `PHB` (a host bridge), `NODE` (host bridges within a NUMA node), `SYS`
    /// (across sockets); `N/A` where NVML does not say.
    pub matrix: Vec<Vec<String>>,
    /// Each GPU, in index order.
    pub gpus: Vec<GpuPlacement>,
}

/// Where one GPU sits. Links are grouped by what they reach, so that the node's facts stay
/// small in every snapshot.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuPlacement {
    pub index: u32,
    /// The CPUs nearest the GPU, as `nvidia-smi topo -m` lists them ("0-55").
    pub cpu_affinity: Option<String>,
    pub numa_node: Option<u32>,
    /// NVLinks the GPU has (0: none, or NVML does not say).
    pub nvlinks: u32,
    /// Their generation, "4.0" (`nvmlDeviceGetNvLinkVersion` of the first link).
    pub nvlink_version: Option<String>,
    /// What the links reach, each with its links.
    pub peers: Vec<PeerLinks>,
    /// Links that were down when the source opened.
    pub down_at_start: Vec<u32>,
}

impl GpuPlacement {
    /// Links up at start that reach a peer matching `f`.
    fn up_to(&self, f: impl Fn(&LinkPeer) -> bool) -> usize {
        self.peers
            .iter()
            .filter(|p| f(&p.peer))
            .flat_map(|p| &p.links)
            .filter(|l| !self.down_at_start.contains(l))
            .count()
    }
}

/// The links of a GPU that reach one peer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerLinks {
    pub peer: LinkPeer,
    pub links: Vec<u32>,
}

/// What is at a link's other end (`nvmlDeviceGetNvLinkRemotePciInfo_v2`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LinkPeer {
    /// Another GPU of this node (its bus id matches).
    Gpu { index: u32 },
    /// An NVIDIA device that is no GPU of the node: an NVSwitch (HGX/DGX boards).
    NvSwitch { pci_bus_id: String },
    /// Something else, or NVML does not say.
    Unknown,
}

/// A link rate in decimal units, as NVIDIA quotes NVLink bandwidth: "9.8 GB/s", "850 MB/s".
pub fn rate_text(bytes_s: f64) -> String {
    let (v, unit) = if bytes_s >= 1e9 {
        (bytes_s / 1e9, "GB/s")
    } else if bytes_s >= 1e6 {
        (bytes_s / 1e6, "MB/s")
    } else if bytes_s >= 1e3 {
        (bytes_s / 1e3, "kB/s")
    } else {
        return format!("{bytes_s:.0} B/s");
    };
    if v >= 100.0 {
        format!("{v:.0} {unit}")
    } else {
        format!("{v:.1} {unit}")
    }
}

/// `nvmlNvlinkVersion_t` in the words NVIDIA uses ("4.0"); older drivers reported the plain
/// major number (1-4), which reads the same for those.
pub fn version_name(v: u32) -> Option<String> {
    let name = match v {
        1 => "1.0",
        2 => "2.0",
        3 => "2.2",
        4 => "3.0",
        5 => "3.1",
        6 => "4.0",
        7 => "5.0",
        8 => "6.0",
        _ => return None,
    };
    Some(name.to_string())
}

/// The `nvidia-smi topo -m` word for a PCIe level.
pub fn level_name(level: TopologyLevel) -> &'static str {
    match level {
        TopologyLevel::Internal => "X",
        TopologyLevel::Single => "PIX",
        TopologyLevel::Multiple => "PXB",
        TopologyLevel::HostBridge => "PHB",
        TopologyLevel::Node => "NODE",
        TopologyLevel::System => "SYS",
    }
}

/// The matrix cell for GPUs `i` ≠ `j`: NVLinks first (direct links between them, else the
/// links both have up to NVSwitches, the fewer of the two), else their PCIe level.
pub fn cell(gpus: &[GpuPlacement], i: usize, j: usize, pcie: Option<TopologyLevel>) -> String {
    if i == j {
        return "X".into();
    }
    let (Some(a), Some(b)) = (gpus.get(i), gpus.get(j)) else {
        return pcie.map_or("N/A", level_name).to_string();
    };
    let direct = a.up_to(|p| *p == LinkPeer::Gpu { index: j as u32 });
    if direct > 0 {
        return format!("NV{direct}");
    }
    let switch = |p: &LinkPeer| matches!(p, LinkPeer::NvSwitch { .. });
    let through_switch = a.up_to(switch).min(b.up_to(switch));
    if through_switch > 0 {
        return format!("NV{through_switch}");
    }
    pcie.map_or("N/A", level_name).to_string()
}

/// A CPU mask (NVML's words, 64 CPUs each) as ranges: "0-55,112-167".
pub fn cpu_list(mask: &[u64]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut start: Option<usize> = None;
    let bits = mask.len() * 64;
    for cpu in 0..=bits {
        let set = cpu < bits && mask[cpu / 64] >> (cpu % 64) & 1 == 1;
        match (set, start) {
            (true, None) => start = Some(cpu),
            (false, Some(s)) => {
                out.push(if s + 1 == cpu {
                    s.to_string()
                } else {
                    format!("{s}-{}", cpu - 1)
                });
                start = None;
            }
            _ => {}
        }
    }
    out.join(",")
}

/// A throughput counter read: KiB and the driver's timestamp, µs.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Count {
    kib: f64,
    at_us: i64,
}

/// Bytes per second between two counter reads; absent when the counter went back (a reset) or
/// time did not move.
fn rate(prev: Option<Count>, now: Option<Count>) -> Option<f64> {
    let (p, n) = (prev?, now?);
    let dt_s = (n.at_us - p.at_us) as f64 / 1e6;
    (dt_s > 0.0 && n.kib >= p.kib).then(|| (n.kib - p.kib) * 1024.0 / dt_s)
}

/// One GPU's last (TX, RX) counters, per link.
type LastCounts = Vec<(Option<Count>, Option<Count>)>;

/// NVLink and topology for an NVML source: the layout read at open, and per GPU the last
/// counters (for rates).
pub struct NvLinkWatch {
    /// Links per GPU (0: none or not reported).
    links: Vec<u32>,
    topology: Option<NodeTopology>,
    /// Per GPU, per link: the last (TX, RX) counters.
    last: Vec<Mutex<LastCounts>>,
}

impl NvLinkWatch {
    /// Reads the node's layout: each GPU's links (count, version, remote end, state), the PCIe
    /// level of every pair, CPU and NUMA affinity. A few hundred NVML calls, once.
    pub fn open(nvml: &Nvml, count: usize) -> NvLinkWatch {
        let devices: Vec<Option<Device<'_>>> = (0..count)
            .map(|i| nvml.device_by_index(i as u32).ok())
            .collect();
        let bus_ids: Vec<Option<String>> = devices
            .iter()
            .map(|d| d.as_ref().and_then(|d| d.pci_info().ok()).map(|p| p.bus_id))
            .collect();
        let mut links = Vec::with_capacity(count);
        let mut gpus = Vec::with_capacity(count);
        for (i, dev) in devices.iter().enumerate() {
            let n = dev.as_ref().map_or(0, link_count);
            links.push(n);
            let Some(dev) = dev else {
                gpus.push(GpuPlacement {
                    index: i as u32,
                    ..GpuPlacement::default()
                });
                continue;
            };
            let mut mask = vec![0u64; CPU_MASK_WORDS];
            let cpu_affinity = dev
                .cpu_affinity(CPU_MASK_WORDS)
                .ok()
                .map(|words| {
                    for (m, w) in mask.iter_mut().zip(words) {
                        *m = w;
                    }
                    cpu_list(&mask)
                })
                .filter(|s| !s.is_empty());
            let mut placement = GpuPlacement {
                index: i as u32,
                cpu_affinity,
                numa_node: dev.numa_node_id().ok(),
                nvlinks: n,
                ..GpuPlacement::default()
            };
            for l in 0..n {
                let w = dev.link_wrapper_for(l);
                if placement.nvlink_version.is_none() {
                    placement.nvlink_version = w.version().ok().and_then(version_name);
                }
                if w.is_active().ok() == Some(false) {
                    placement.down_at_start.push(l);
                }
                let peer = match w.remote_pci_info() {
                    Ok(p) => match bus_ids.iter().position(|b| b.as_deref() == Some(&p.bus_id)) {
                        Some(k) => LinkPeer::Gpu { index: k as u32 },
                        // Vendor 0x10DE in the low 16 bits: an NVIDIA device that is no GPU
                        // of this node; over NVLink that is an NVSwitch.
                        None if p.pci_device_id & 0xffff == 0x10de => LinkPeer::NvSwitch {
                            pci_bus_id: p.bus_id,
                        },
                        None => LinkPeer::Unknown,
                    },
                    Err(_) => LinkPeer::Unknown,
                };
                match placement.peers.iter_mut().find(|p| p.peer == peer) {
                    Some(p) => p.links.push(l),
                    None => placement.peers.push(PeerLinks {
                        peer,
                        links: vec![l],
                    }),
                }
            }
            gpus.push(placement);
        }
        let mut any_level = false;
        let mut matrix = Vec::with_capacity(count);
        for (i, dev) in devices.iter().enumerate() {
            let mut row = Vec::with_capacity(count);
            for j in 0..count {
                let level = match dev {
                    Some(a) if i != j => nvml
                        .device_by_index(j as u32)
                        .ok()
                        .and_then(|b| a.topology_common_ancestor(b).ok())
                        .inspect(|_| any_level = true),
                    _ => None,
                };
                row.push(cell(&gpus, i, j, level));
            }
            matrix.push(row);
        }
        let known = any_level
            || links.iter().any(|n| *n > 0)
            || gpus
                .iter()
                .any(|g| g.cpu_affinity.is_some() || g.numa_node.is_some());
        NvLinkWatch {
            last: links
                .iter()
                .map(|n| Mutex::new(vec![(None, None); *n as usize]))
                .collect(),
            links,
            topology: known.then_some(NodeTopology { matrix, gpus }),
        }
    }

    /// The node's topology, when NVML told anything about it.
    pub fn topology(&self) -> Option<NodeTopology> {
        self.topology.clone()
    }

    /// GPU `index`'s links now: one field-values call (state, TX and RX of every link).
    /// Absent for a GPU without links or when the call fails.
    pub fn sample(&self, index: usize, dev: &Device<'_>) -> Option<NvLinkSample> {
        let n = *self.links.get(index).filter(|n| **n > 0)?;
        let fields: Vec<nvml_fields::Scoped> = (0..n)
            .flat_map(|l| {
                [
                    FI_NVLINK_GET_STATE,
                    FI_NVLINK_THROUGHPUT_DATA_TX,
                    FI_NVLINK_THROUGHPUT_DATA_RX,
                ]
                .map(|field| nvml_fields::Scoped { field, scope: l })
            })
            .collect();
        let count = |r: &nvml_fields::Reading| {
            r.value.map(|kib| Count {
                kib,
                at_us: r.timestamp_us,
            })
        };
        let mut last = self
            .last
            .get(index)?
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if last.iter().all(|(tx, rx)| tx.is_none() && rx.is_none()) {
            // A first read has nothing to take a rate against: read the counters, and read
            // again after FIRST_GAP, so that a one-shot `status` shows traffic too.
            let first = nvml_fields::read(dev, &fields).ok()?;
            for (slot, chunk) in last.iter_mut().zip(first.chunks(3)) {
                if let [_, tx, rx] = chunk {
                    *slot = (count(tx), count(rx));
                }
            }
            std::thread::sleep(FIRST_GAP);
        }
        let readings = nvml_fields::read(dev, &fields).ok()?;
        let mut s = NvLinkSample {
            links: n,
            ..NvLinkSample::default()
        };
        let (mut tx_sum, mut rx_sum) = (Some(0.0), Some(0.0));
        for (l, chunk) in readings.chunks(3).enumerate() {
            let [state, tx, rx] = chunk else { break };
            let (tx, rx) = (count(tx), count(rx));
            let slot = last.get_mut(l)?;
            let link = LinkNow {
                up: state.value.map(|v| v != 0.0),
                tx_bytes_s: rate(slot.0, tx),
                rx_bytes_s: rate(slot.1, rx),
            };
            *slot = (tx, rx);
            if link.up == Some(true) {
                s.links_up += 1;
            }
            tx_sum = tx_sum.zip(link.tx_bytes_s).map(|(a, b)| a + b);
            rx_sum = rx_sum.zip(link.rx_bytes_s).map(|(a, b)| a + b);
            s.per_link.push(link);
        }
        s.tx_bytes_s = tx_sum;
        s.rx_bytes_s = rx_sum;
        Some(s)
    }
}

/// `NVML_FI_DEV_NVLINK_LINK_COUNT`, bounded; 0 when the GPU has none or does not say.
fn link_count(dev: &Device<'_>) -> u32 {
    let one = [nvml_fields::Scoped {
        field: FI_NVLINK_LINK_COUNT,
        scope: 0,
    }];
    nvml_fields::read(dev, &one)
        .ok()
        .and_then(|r| r.first().and_then(|r| r.value))
        .map_or(0, |n| (n as u32).min(MAX_LINKS))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn switched(index: u32, links: u32, down: &[u32]) -> GpuPlacement {
        GpuPlacement {
            index,
            nvlinks: links,
            nvlink_version: Some("4.0".into()),
            peers: vec![PeerLinks {
                peer: LinkPeer::NvSwitch {
                    pci_bus_id: "00000000:05:00.0".into(),
                },
                links: (0..links).collect(),
            }],
            down_at_start: down.to_vec(),
            ..GpuPlacement::default()
        }
    }

    #[test]
    fn nvswitch_boards_read_nv18_and_a_down_link_lowers_the_pair() {
        let gpus = vec![
            switched(0, 18, &[]),
            switched(1, 18, &[5]),
            switched(2, 0, &[]),
        ];
        assert_eq!(cell(&gpus, 0, 0, None), "X");
        assert_eq!(cell(&gpus, 0, 1, Some(TopologyLevel::Single)), "NV17");
        assert_eq!(cell(&gpus, 0, 2, Some(TopologyLevel::System)), "SYS");
        assert_eq!(cell(&gpus, 0, 2, None), "N/A");
    }

    #[test]
    fn direct_links_count_per_pair() {
        let mut a = switched(0, 4, &[3]);
        a.peers = vec![
            PeerLinks {
                peer: LinkPeer::Gpu { index: 1 },
                links: vec![0, 2],
            },
            PeerLinks {
                peer: LinkPeer::Gpu { index: 2 },
                links: vec![1, 3],
            },
        ];
        let gpus = vec![a, switched(1, 0, &[]), switched(2, 0, &[])];
        assert_eq!(cell(&gpus, 0, 1, Some(TopologyLevel::HostBridge)), "NV2");
        assert_eq!(cell(&gpus, 0, 2, Some(TopologyLevel::HostBridge)), "NV1");
        assert_eq!(cell(&gpus, 1, 2, Some(TopologyLevel::HostBridge)), "PHB");
    }

    #[test]
    fn cpu_masks_read_as_ranges() {
        assert_eq!(cpu_list(&[(1 << 56) - 1, 0]), "0-55");
        assert_eq!(cpu_list(&[!((1 << 56) - 1), (1 << 48) - 1]), "56-111");
        assert_eq!(cpu_list(&[0b1011, 1 << 63]), "0-1,3,127");
        assert_eq!(cpu_list(&[0]), "");
    }

    #[test]
    fn rates_need_two_reads_and_a_forward_counter() {
        let c = |kib, at_us| Some(Count { kib, at_us });
        assert_eq!(rate(None, c(10.0, 1)), None);
        assert_eq!(rate(c(0.0, 0), c(1000.0, 500_000)), Some(2_048_000.0));
        assert_eq!(rate(c(10.0, 0), c(5.0, 1_000_000)), None);
        assert_eq!(rate(c(10.0, 5), c(20.0, 5)), None);
        assert_eq!(version_name(6).as_deref(), Some("4.0"));
        assert_eq!(version_name(0), None);
        assert_eq!(rate_text(9.84e9), "9.8 GB/s");
        assert_eq!(rate_text(850e6), "850 MB/s");
        assert_eq!(rate_text(0.0), "0 B/s");
    }
}
