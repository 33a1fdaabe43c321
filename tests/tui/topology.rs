//! The Topology view (key 5): the `nvidia-smi topo -m` matrix of an HGX H100 node with CPU and
//! NUMA affinity, each GPU's NVLink traffic under it (each link's on a wide terminal), GPU 5's
//! link 5 down; a node without topology; a tiny terminal (insta snapshots in tui/snapshots/).

use crate::support::tui::{SECONDS, app, press, render, snapshot_at, take, text};
use crossterm::event::KeyCode;
use gpupilot::telemetry::nvlink::{
    GpuPlacement, LinkNow, LinkPeer, NodeTopology, NvLinkSample, PeerLinks,
};
use gpupilot::tui::{App, ViewId};
use insta::assert_snapshot;

const DOWN: (u32, u32) = (5, 5);

fn topology(n: u32) -> NodeTopology {
    let matrix = (0..n)
        .map(|i| {
            (0..n)
                .map(|j| match (i, j) {
                    _ if i == j => "X".to_string(),
                    _ if i == DOWN.0 || j == DOWN.0 => "NV17".to_string(),
                    _ => "NV18".to_string(),
                })
                .collect()
        })
        .collect();
    let gpus = (0..n)
        .map(|i| GpuPlacement {
            index: i,
            cpu_affinity: Some(if i < n / 2 { "0-55" } else { "56-111" }.into()),
            numa_node: Some(u32::from(i >= n / 2)),
            nvlinks: 18,
            nvlink_version: Some("4.0".into()),
            peers: (0..4)
                .map(|k| PeerLinks {
                    peer: LinkPeer::NvSwitch {
                        pci_bus_id: format!("00000000:{:02X}:00.0", 5 + k),
                    },
                    links: (0..18).filter(|l| l * 4 / 18 == k).collect(),
                })
                .collect(),
            down_at_start: if i == DOWN.0 { vec![DOWN.1] } else { vec![] },
        })
        .collect();
    NodeTopology { matrix, gpus }
}

fn traffic(i: u32) -> NvLinkSample {
    let idle = i == 7;
    let per_link: Vec<LinkNow> = (0..18)
        .map(|l| {
            let down = (i, l) == DOWN;
            let b = if down || idle {
                0.0
            } else if i == DOWN.0 {
                0.58e9
            } else {
                0.55e9
            };
            LinkNow {
                up: Some(!down),
                tx_bytes_s: Some(b),
                rx_bytes_s: Some(b),
            }
        })
        .collect();
    let total: f64 = per_link.iter().filter_map(|l| l.tx_bytes_s).sum();
    NvLinkSample {
        links: 18,
        links_up: per_link.iter().filter(|l| l.up == Some(true)).count() as u32,
        tx_bytes_s: Some(total),
        rx_bytes_s: Some(total),
        per_link,
    }
}

/// The 8-GPU fixture (GPU 3 lost, GPU 2 stale, as everywhere) on an HGX board.
fn hgx() -> App {
    let mut a = app(8);
    let mut snap = snapshot_at(8, SECONDS);
    snap.node.topology = Some(topology(8));
    for g in snap.gpus.iter_mut().filter(|g| !g.lost) {
        g.nvlink = Some(traffic(g.index));
    }
    take(&mut a, snap);
    press(&mut a, KeyCode::Char('5'));
    assert_eq!(a.view, ViewId::Topology);
    a
}

#[test]
fn the_matrix_affinity_and_traffic_at_80x24() {
    let mut a = hgx();
    let screen = text(&render(&mut a, 80, 24));
    assert!(screen.contains("GPU0  X     NV18"), "{screen}");
    assert!(screen.contains("NV17"), "{screen}");
    assert!(screen.contains("0-55"), "{screen}");
    assert!(screen.contains("56-111"), "{screen}");
    assert!(screen.contains("GPU5    17/18"), "{screen}");
    assert!(screen.contains("link 5"), "{screen}");
    assert!(screen.contains("9.9 GB/s"), "{screen}");
    assert_snapshot!("topology_80x24", render(&mut a, 80, 24).backend());
}

#[test]
fn each_links_traffic_on_a_wide_terminal() {
    let mut a = hgx();
    let screen = text(&render(&mut a, 200, 50));
    assert!(screen.contains("TX per link, GB/s"), "{screen}");
    assert!(screen.contains("0.6  0.6  0.6  0.6  0.6  --"), "{screen}");
    assert!(screen.contains("NV# = # NVLinks"), "{screen}");
    assert_snapshot!("topology_200x50", render(&mut a, 200, 50).backend());
}

#[test]
fn a_node_without_topology_says_so_and_a_tiny_terminal_does_not_panic() {
    let mut a = app(4);
    press(&mut a, KeyCode::Char('5'));
    let screen = text(&render(&mut a, 80, 24));
    assert!(screen.contains("No topology for this node"), "{screen}");
    let mut b = hgx();
    for (w, h) in [(1, 1), (10, 3), (20, 5), (40, 8)] {
        render(&mut b, w, h);
    }
}
