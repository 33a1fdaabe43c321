//! Beyond one node: the cluster view (snapshots, a real Prometheus, an HTTPS stand-in), a real
//! single-node Slurm, and another node's daemon over a real loopback `sshd`. One test binary;
//! its tests share one process and run in parallel.

#[path = "../support/mod.rs"]
mod support;

mod dashboards;
mod prometheus;
mod prometheus_tls;
mod slurm;
mod ssh_bridge;
mod view;
