//! The node's interconnect, as an HGX baseboard wires it: NVLink from every GPU to the
//! NVSwitches, GPUs in pairs under a PCIe switch, the first half of the GPUs on CPU socket 0
//! (NUMA node 0) and the second half on socket 1. Turned on by a scenario's `[topology]` table;
//! without it every NVLink and topology call answers NOT_SUPPORTED.
//!
//! Pure functions of the scenario and the simulated node: every process computes the same
//! links, levels and counters without sharing anything.

use std::ops::Range;

use gpusim::{GpuSpec, Node};
use serde::Deserialize;

use crate::ffi::NVML_DEVICE_ARCH_AMPERE;
use crate::ffi::NVML_DEVICE_ARCH_BLACKWELL;
use crate::ffi::NVML_DEVICE_ARCH_HOPPER;
use crate::ffi::NVML_DEVICE_ARCH_VOLTA;
use crate::identity;

/// GPUs behind one PCIe switch (a PLX/Broadcom switch on the baseboard).
pub const GPUS_PER_PCIE_SWITCH: usize = 2;
/// CPU sockets, one NUMA node each.
pub const SOCKETS: usize = 2;
/// Logical CPUs of a socket when the scenario does not say (a 56-core Sapphire Rapids).
pub const DEFAULT_CPUS_PER_SOCKET: u32 = 56;

/// `nvmlGpuTopologyLevel_t`.
pub const NVML_TOPOLOGY_INTERNAL: u32 = 0;
pub const NVML_TOPOLOGY_SINGLE: u32 = 10;
pub const NVML_TOPOLOGY_MULTIPLE: u32 = 20;
pub const NVML_TOPOLOGY_HOSTBRIDGE: u32 = 30;
pub const NVML_TOPOLOGY_NODE: u32 = 40;
pub const NVML_TOPOLOGY_SYSTEM: u32 = 50;

/// `nvmlNvlinkVersion_t` (nvml.h numbers them in order, not by the marketing version).
pub const NVML_NVLINK_VERSION_2_0: u32 = 2;
pub const NVML_NVLINK_VERSION_3_0: u32 = 4;
pub const NVML_NVLINK_VERSION_4_0: u32 = 6;
pub const NVML_NVLINK_VERSION_5_0: u32 = 7;

/// Share of the data the link carries again as protocol (flit headers, CRC): what the RAW
/// counters add to the DATA ones.
const PROTOCOL_OVERHEAD: f64 = 0.0625;

/// `[topology]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTopology {
    /// NVLink through NVSwitch (default true); `false` leaves PCIe switches and NUMA only.
    pub nvlink: Option<bool>,
    pub cpus_per_socket: Option<u32>,
}

/// The resolved `[topology]` table and its `nvlink_down` faults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    pub nvlink: bool,
    pub cpus_per_socket: u32,
    /// (GPU, link) pairs that did not train at boot (`[[faults]] kind = "nvlink_down"`).
    pub down: Vec<(usize, u32)>,
}

impl Topology {
    pub fn new(raw: RawTopology) -> Result<Topology, String> {
        let cpus_per_socket = raw.cpus_per_socket.unwrap_or(DEFAULT_CPUS_PER_SOCKET);
        if !(1..=1024).contains(&cpus_per_socket) {
            return Err("`cpus_per_socket` must be within 1..=1024".into());
        }
        Ok(Topology {
            nvlink: raw.nvlink.unwrap_or(true),
            cpus_per_socket,
            down: Vec::new(),
        })
    }

    /// The socket (and NUMA node) of GPU `i` of `n`: the first half on 0, the rest on 1.
    pub fn socket(&self, n: usize, i: usize) -> usize {
        (i * SOCKETS / n.max(1)).min(SOCKETS - 1)
    }

    /// The PCIe switch GPU `i` sits behind.
    pub fn pcie_switch(&self, i: usize) -> usize {
        i / GPUS_PER_PCIE_SWITCH
    }

    /// How far apart GPUs `a` and `b` of `n` are on PCIe, as `nvmlGpuTopologyLevel_t`: the
    /// same board, one switch, one socket (across its host bridges), or across sockets.
    pub fn common_ancestor(&self, n: usize, a: usize, b: usize) -> u32 {
        if a == b {
            NVML_TOPOLOGY_INTERNAL
        } else if self.pcie_switch(a) == self.pcie_switch(b) {
            NVML_TOPOLOGY_SINGLE
        } else if self.socket(n, a) == self.socket(n, b) {
            NVML_TOPOLOGY_NODE
        } else {
            NVML_TOPOLOGY_SYSTEM
        }
    }

    /// The logical CPUs of GPU `i`'s socket.
    pub fn cpus(&self, n: usize, i: usize) -> Range<u32> {
        let s = self.socket(n, i) as u32;
        s * self.cpus_per_socket..(s + 1) * self.cpus_per_socket
    }

    pub fn is_down(&self, gpu: usize, link: u32) -> bool {
        self.down.contains(&(gpu, link))
    }

    /// NVLinks GPU `i` has in this topology (0: none, so NVLink calls answer NOT_SUPPORTED).
    pub fn links(&self, spec: &GpuSpec) -> u32 {
        if self.nvlink { links(spec) } else { 0 }
    }

    /// Links of GPU `i` that are up.
    pub fn up_links(&self, spec: &GpuSpec, i: usize) -> u32 {
        let n = self.links(spec);
        (0..n).filter(|l| !self.is_down(i, *l)).count() as u32
    }
}

/// NVLinks of an SXM part: 18 on Hopper and Blackwell (NVLink 4/5), 12 on Ampere (NVLink 3),
/// 6 on Volta (NVLink 2); PCIe and GeForce boards have none.
pub fn links(spec: &GpuSpec) -> u32 {
    if !identity::is_datacenter(spec) || spec.id.contains("pcie") {
        return 0;
    }
    match identity::architecture(spec) {
        NVML_DEVICE_ARCH_VOLTA => 6,
        NVML_DEVICE_ARCH_AMPERE => 12,
        NVML_DEVICE_ARCH_HOPPER | NVML_DEVICE_ARCH_BLACKWELL => 18,
        _ => 0,
    }
}

/// `nvmlNvlinkVersion_t` of the part's links.
pub fn version(spec: &GpuSpec) -> u32 {
    match identity::architecture(spec) {
        NVML_DEVICE_ARCH_VOLTA => NVML_NVLINK_VERSION_2_0,
        NVML_DEVICE_ARCH_AMPERE => NVML_NVLINK_VERSION_3_0,
        NVML_DEVICE_ARCH_BLACKWELL => NVML_NVLINK_VERSION_5_0,
        _ => NVML_NVLINK_VERSION_4_0,
    }
}

/// NVSwitches on the baseboard for parts with `links` links: four on HGX H100 (links spread
/// 5/4/5/4), six on HGX A100 (two each), six on HGX-2 V100 (one each).
pub fn switches(links: u32) -> u32 {
    if links >= 18 { 4 } else { 6 }
}

/// The NVSwitch link `link` of a GPU with `links` links goes to.
pub fn switch_of(links: u32, link: u32) -> u32 {
    link * switches(links) / links.max(1)
}

/// PCI bus of NVSwitch `k` (domain 0, device 0, function 0): bridges below the GPUs' buses,
/// as `lspci` lists them on an HGX board.
pub fn switch_bus(k: u32) -> u32 {
    0x05 + k
}

/// Bytes GPU `i` has sent over NVLink since its training started: the gradients of every step
/// all-reduced across the training GPUs of the node. A ring all-reduce sends 2(N-1)/N of the
/// gradient from each GPU; the gradient is taken as an eighth of the model's static memory
/// (mixed-precision Adam keeps 16 bytes per parameter, 2 of them the bf16 gradient). The
/// all-reduce is symmetric, so each GPU receives as much as it sends.
pub fn data_bytes(node: &Node, i: usize) -> f64 {
    let gpus = node.gpus();
    let training = |g: &gpusim::Gpu| g.training().is_some_and(|t| !t.oom);
    let n = gpus.iter().filter(|g| training(g)).count();
    let Some(t) = gpus.get(i).and_then(|g| g.training()).filter(|t| !t.oom) else {
        return 0.0;
    };
    let Some(model) = t.model() else {
        return 0.0;
    };
    if n < 2 || t.config.batch_size == 0 {
        return 0.0;
    }
    let steps = t.samples_seen / f64::from(t.config.batch_size);
    let gradient = model.static_memory_bytes as f64 / 8.0;
    steps * gradient * 2.0 * (n as f64 - 1.0) / n as f64
}

/// What one link's throughput counter holds, in KiB (NVML's unit): the GPU's traffic shared
/// evenly by its links that are up; a down link carries nothing.
pub fn link_kib(topo: &Topology, node: &Node, i: usize, link: u32, raw: bool) -> u64 {
    let spec = node.gpus()[i].spec();
    let up = topo.up_links(spec, i);
    if up == 0 || topo.is_down(i, link) || link >= topo.links(spec) {
        return 0;
    }
    let overhead = if raw { 1.0 + PROTOCOL_OVERHEAD } else { 1.0 };
    (data_bytes(node, i) * overhead / 1024.0 / f64::from(up)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hgx() -> Topology {
        Topology::new(RawTopology {
            nvlink: None,
            cpus_per_socket: None,
        })
        .unwrap()
    }

    #[test]
    fn eight_gpus_pair_under_switches_and_split_across_sockets() {
        let t = hgx();
        let sockets: Vec<usize> = (0..8).map(|i| t.socket(8, i)).collect();
        assert_eq!(sockets, [0, 0, 0, 0, 1, 1, 1, 1]);
        assert_eq!(t.common_ancestor(8, 0, 0), NVML_TOPOLOGY_INTERNAL);
        assert_eq!(t.common_ancestor(8, 0, 1), NVML_TOPOLOGY_SINGLE);
        assert_eq!(t.common_ancestor(8, 0, 2), NVML_TOPOLOGY_NODE);
        assert_eq!(t.common_ancestor(8, 3, 4), NVML_TOPOLOGY_SYSTEM);
        assert_eq!(t.cpus(8, 5), 56..112);
        assert_eq!(t.socket(1, 0), 0);
    }

    #[test]
    fn h100_links_spread_over_four_switches() {
        let h100 = gpusim::find("h100-sxm").unwrap();
        assert_eq!(links(h100), 18);
        assert_eq!(version(h100), NVML_NVLINK_VERSION_4_0);
        let per_switch: Vec<usize> = (0..4)
            .map(|k| (0..18).filter(|l| switch_of(18, *l) == k).count())
            .collect();
        assert_eq!(per_switch, [5, 4, 5, 4]);
        assert_eq!(links(gpusim::find("rtx-4090").unwrap()), 0);
        assert_eq!(links(gpusim::find("a100-sxm-80gb").unwrap()), 12);
    }

    #[test]
    fn a_down_link_carries_nothing_and_the_others_share_more() {
        let cfg = gpusim::NodeConfig {
            gpus: vec!["h100-sxm".into(); 2],
            training: Some(gpusim::TrainingConfig {
                model: "bert-large".into(),
                batch_size: 32,
                prefetch_depth: 4,
                workers: 8,
            }),
            ..gpusim::NodeConfig::default()
        };
        let mut node = Node::new(&cfg).unwrap();
        node.advance_to(10.0);
        let mut t = hgx();
        let before = link_kib(&t, &node, 0, 1, false);
        assert!(before > 0);
        t.down.push((0, 5));
        assert_eq!(link_kib(&t, &node, 0, 5, false), 0);
        let after = link_kib(&t, &node, 0, 1, false);
        let expected = before as f64 * 18.0 / 17.0;
        assert!((after as f64 - expected).abs() <= 1.0, "{before} {after}");
        assert!(link_kib(&t, &node, 0, 1, true) > after);
    }

    #[test]
    fn the_shipped_scenario_has_gpu_3_link_5_down() {
        let text = include_str!("../scenarios/8xh100-nvlink.toml");
        let s = crate::scenario::Scenario::parse(text, "8xh100-nvlink.toml").unwrap();
        let t = s.topology.unwrap();
        assert!(t.nvlink);
        assert_eq!(t.down, [(3, 5)]);
        assert_eq!(t.cpus_per_socket, 56);
    }

    #[test]
    fn nvlink_faults_are_checked() {
        let parse = |text: &str| crate::scenario::Scenario::parse(text, "s.toml").unwrap_err();
        let down = "[[faults]]\nkind = \"nvlink_down\"\ngpu = 0\nlink = 18\n";
        let e = parse(&format!("count = 2\n{down}"));
        assert!(e.message.contains("needs a `[topology]` table"), "{e}");
        let e = parse(&format!("count = 2\n[topology]\n{down}"));
        assert!(e.message.contains("GPU 0 (h100-sxm) has 18 NVLinks"), "{e}");
        assert_eq!((e.line, e.column), (6, 8), "{e}");
        let e = parse("[[faults]]\nkind = \"gpu_lost\"\ngpu = 0\nlink = 1\n");
        assert!(e.message.contains("only `nvlink_down` takes `link`"), "{e}");
        let e = parse("[topology]\ncpus_per_socket = 0\n");
        assert!(e.message.contains("cpus_per_socket"), "{e}");
        let e = parse("[topology]\nswitches = 4\n");
        assert!(e.message.contains("unknown field"), "{e}");
    }
}
