use super::*;

fn series(name: &str, instance: &str, host: Option<&str>, gpu: u32, v: f64) -> Series {
    let mut labels = BTreeMap::new();
    labels.insert("__name__".to_string(), name.to_string());
    labels.insert("instance".to_string(), instance.to_string());
    labels.insert("job".to_string(), "gpus".to_string());
    labels.insert("gpu".to_string(), gpu.to_string());
    labels.insert("UUID".to_string(), format!("GPU-{instance}-{gpu}"));
    labels.insert("modelName".to_string(), "NVIDIA A100-SXM4-80GB".to_string());
    if let Some(h) = host {
        labels.insert("Hostname".to_string(), h.to_string());
    }
    Series {
        labels,
        t: 100.0,
        v,
    }
}

fn target(instance: &str, v: f64) -> Series {
    let mut labels = BTreeMap::new();
    labels.insert("instance".to_string(), instance.to_string());
    labels.insert("job".to_string(), "gpus".to_string());
    Series {
        labels,
        t: 100.0,
        v,
    }
}

fn node_fields(instance: &str, host: Option<&str>, gpus: u32, util: f64) -> Vec<Series> {
    (0..gpus)
        .flat_map(|g| {
            vec![
                series(names::UTIL, instance, host, g, util),
                series(names::POWER, instance, host, g, 300.0 + g as f64),
                series(names::FB_USED, instance, host, g, 1024.0),
                series(names::FB_FREE, instance, host, g, 3072.0),
                series(names::ENERGY, instance, host, g, 3.6e9),
            ]
        })
        .collect()
}

#[test]
fn nodes_gpus_and_totals() {
    let mut fields = node_fields("a:9400", Some("node-a"), 2, 90.0);
    fields.extend(node_fields("b:9400", Some("node-b"), 3, 0.0));
    let up = [target("a:9400", 1.0), target("b:9400", 1.0)];
    let scraped = [target("a:9400", 99.0), target("b:9400", 50.0)];
    let m = ClusterModel::build(
        &Answers {
            fields: &fields,
            up: &up,
            scraped: &scraped,
        },
        100.0,
        None,
    );
    let names: Vec<&str> = m.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["node-a", "node-b"]);
    let a = &m.nodes[0];
    assert_eq!(a.state, NodeState::Up);
    assert_eq!(a.gpus.len(), 2);
    assert_eq!(a.gpus[1].uuid.as_deref(), Some("GPU-a:9400-1"));
    assert_eq!(a.gpus[1].model.as_deref(), Some("NVIDIA A100-SXM4-80GB"));
    assert_eq!(a.gpus[1].power_w, Some(301.0));
    assert_eq!(a.gpus[0].mem_total_mib, Some(4096.0), "used + free");
    assert_eq!(a.gpus[0].value(GridMetric::Mem), Some(25.0));
    // 50 s since b's last scrape: stale, and out of the sums.
    assert_eq!(m.nodes[1].state, NodeState::Stale);
    let t = m.totals();
    assert_eq!((t.nodes, t.nodes_up, t.nodes_stale), (2, 1, 1));
    assert_eq!((t.gpus, t.gpus_busy, t.gpus_idle), (2, 2, 0));
    assert_eq!(t.power_w, 601.0);
    assert!((t.energy_kwh - 2.0).abs() < 1e-9);
}

#[test]
fn down_and_missing_nodes_keep_their_last_values() {
    let fields = node_fields("a:9400", Some("node-a"), 1, 50.0);
    let mut both = fields.clone();
    both.extend(node_fields("b:9400", Some("node-b"), 1, 50.0));
    let up = [target("a:9400", 1.0), target("b:9400", 1.0)];
    let first = ClusterModel::build(
        &Answers {
            fields: &both,
            up: &up,
            scraped: &[],
        },
        100.0,
        None,
    );
    // b stops answering: Prometheus drops its series and records up = 0.
    let up = [target("a:9400", 1.0), target("b:9400", 0.0)];
    let second = ClusterModel::build(
        &Answers {
            fields: &fields,
            up: &up,
            scraped: &[],
        },
        101.0,
        Some(&first),
    );
    let b = second.nodes.iter().find(|n| n.name == "node-b").unwrap();
    assert_eq!(b.state, NodeState::Down);
    assert_eq!(b.gpus[0].util_pct, Some(50.0), "last values kept");
    // Then b leaves Prometheus's configuration altogether.
    let third = ClusterModel::build(
        &Answers {
            fields: &fields,
            up: &up[..1],
            scraped: &[],
        },
        102.0,
        Some(&second),
    );
    let b = third.nodes.iter().find(|n| n.name == "node-b").unwrap();
    assert_eq!(b.state, NodeState::Missing);
    assert_eq!(third.totals().nodes_missing, 1);
    // A down target never seen with GPUs, in a GPU job, is a node too; in another job it is not.
    let mut other = target("c:9100", 0.0);
    other.labels.insert("job".into(), "node-exporter".into());
    let fourth = ClusterModel::build(
        &Answers {
            fields: &fields,
            up: &[target("a:9400", 1.0), target("d:9400", 0.0), other],
            scraped: &[],
        },
        103.0,
        None,
    );
    let names: Vec<&str> = fourth.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["d:9400", "node-a"]);
}

/// The model of `fields` alone (no `up`, no scrape times), at time 0.
fn fields_only(fields: &[Series]) -> ClusterModel {
    ClusterModel::build(
        &Answers {
            fields,
            up: &[],
            scraped: &[],
        },
        0.0,
        None,
    )
}

#[test]
fn shared_host_names_and_stale_gpus() {
    let mut fields = node_fields("127.0.0.1:1", Some("box"), 1, 5.0);
    fields.extend(node_fields("127.0.0.1:2", Some("box"), 1, 5.0));
    fields.extend(node_fields("c:9400", None, 1, 5.0));
    fields.push(series(names::STALE, "c:9400", None, 0, 1.0));
    fields.push(series(names::LOST, "c:9400", None, 0, 0.0));
    let m = fields_only(&fields);
    let names: Vec<&str> = m.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["box@127.0.0.1:1", "box@127.0.0.1:2", "c:9400"]);
    assert!(m.nodes[2].gpus[0].stale && !m.nodes[2].gpus[0].lost);
    assert_eq!(m.totals().gpus_idle, 3);
}

#[test]
fn the_query_names_every_field() {
    let q = fields_query();
    assert!(q.starts_with("{__name__=~\"DCGM_FI_DEV_GPU_UTIL|"));
    for n in names::ALL {
        assert!(q.contains(n));
    }
}

/// `s` with its host and model labels renamed: `Hostname` → `host_key`, `modelName` →
/// `model_key` (how dcgm-exporter 4.x and older gpupilot daemons spell them).
fn respelled(mut s: Series, host_key: &str, model_key: &str) -> Series {
    if let Some(h) = s.labels.remove("Hostname") {
        s.labels.insert(host_key.to_string(), h);
    }
    if let Some(m) = s.labels.remove("modelName") {
        s.labels.insert(model_key.to_string(), m);
    }
    s
}

#[test]
fn mixed_fleets_keep_node_names_and_models_under_either_spelling() {
    let mut fields = node_fields("a:9400", Some("node-a"), 1, 5.0);
    fields.extend(
        node_fields("b:9400", Some("node-b"), 1, 5.0)
            .into_iter()
            .map(|s| respelled(s, "hostname", "model_name")),
    );
    fields.extend(
        node_fields("c:9400", Some("node-c"), 1, 5.0)
            .into_iter()
            .map(|s| respelled(s, "hostname", "modelName")),
    );
    // An empty host label names nothing: the instance does.
    fields.extend(node_fields("d:9400", Some(""), 1, 5.0));
    let m = fields_only(&fields);
    let names: Vec<&str> = m.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["d:9400", "node-a", "node-b", "node-c"]);
    let hosts: Vec<Option<&str>> = m.nodes.iter().map(|n| n.hostname.as_deref()).collect();
    assert_eq!(
        hosts,
        [None, Some("node-a"), Some("node-b"), Some("node-c")]
    );
    for n in &m.nodes {
        assert_eq!(
            n.gpus[0].model.as_deref(),
            Some("NVIDIA A100-SXM4-80GB"),
            "{}",
            n.name
        );
    }
}
