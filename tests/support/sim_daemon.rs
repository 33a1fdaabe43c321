//! A daemon in the test's own process (no socket) on a simulated node whose time is driven by
//! hand: the simulator runs at speed 0, and each [`tick`] moves it one second on and hands the
//! daemon a snapshot stamped [`T0`] plus the simulated seconds, so nothing waits on physics.

use std::path::Path;
use std::sync::Arc;

use gpupilot::config::Paths;
use gpupilot::control::power::GpuControl;
use gpupilot::daemon::Daemon;
use gpupilot::ipc::Peer;
use gpupilot::telemetry::sim::SimSource;
use gpupilot::telemetry::{Snapshot, Source};
use gpusim::{NodeConfig, TrainingConfig};

/// The time of the simulated node's second 0 (seconds since the epoch).
pub const T0: f64 = 1_800_000_000.0;

/// Two H100s training gpt-1.3b, still (speed 0) until [`tick`]ed.
pub fn sim() -> Arc<SimSource> {
    let cfg = NodeConfig {
        gpus: vec!["h100-sxm".into(); 2],
        ambient_c: 35.0,
        seed: 1,
        step_s: 0.1,
        training: Some(TrainingConfig {
            model: "gpt-1.3b".into(),
            batch_size: 8,
            prefetch_depth: 4,
            workers: 8,
        }),
    };
    Arc::new(SimSource::new(&cfg, 300.0).unwrap().with_speed(0.0))
}

/// A daemon with its directories under `dir`, controlling `src`'s GPUs.
pub fn daemon(dir: &Path, readonly: bool, src: &Arc<SimSource>) -> Daemon {
    let paths = Paths {
        config: dir.join("config"),
        state: dir.join("state"),
        runtime: dir.join("run"),
    };
    std::fs::create_dir_all(&paths.state).unwrap();
    let socket = paths.runtime.join("daemon.sock");
    let d = Daemon::new(
        paths,
        socket,
        readonly,
        1.0,
        Some(2),
        Some("sim".into()),
        None,
    )
    .unwrap();
    let dev: Arc<dyn GpuControl> = src.clone();
    d.attach_control(dev, false).unwrap();
    d
}

/// This process as the daemon's peer.
pub fn me() -> Peer {
    Peer {
        uid: rustix::process::getuid().as_raw(),
        gid: 0,
        pid: Some(std::process::id()),
    }
}

/// One simulated second on, and a snapshot stamped `T0 + simulated seconds`.
pub fn tick(d: &Daemon, src: &SimSource) {
    let t = src.with_node(|n| {
        let t = n.time_s() + 1.0;
        n.advance_to(t);
        t
    });
    let gpus = (0..src.gpu_count())
        .map(|i| {
            let mut s = src.sample_gpu(i);
            s.time_s = T0 + t;
            s
        })
        .collect();
    d.take_snapshot(Snapshot {
        time_s: T0 + t,
        gpus,
        ..Snapshot::default()
    });
}

/// Every GPU's power limit in the simulator, watts.
pub fn caps(src: &SimSource) -> Vec<f64> {
    src.with_node(|n| n.gpus().iter().map(|g| g.power_limit_w()).collect())
}
