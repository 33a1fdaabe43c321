//! The cluster view's cost on the head node: 64 nodes × 8 GPUs through Prometheus's query API
//! at 1 Hz.
//!
//! `cargo bench --bench cluster -- [SECONDS] [NODES] [GPUS]` (default 60 64 8; bench/cluster.sh
//! runs it). The Prometheus here is a stand-in: a child process of this binary answering
//! `/api/v1/query` for the three queries the view makes (the GPU fields, `up`,
//! `timestamp(up)`) with NODES × GPUS generated series whose values move every second, in the
//! JSON Prometheus writes. It runs in its own process so that its CPU is not counted. This
//! process runs what `gpupilot cluster` runs: the query thread ([`Poller`]) at 1 Hz, and a
//! frame of the grid on a 200×50 TestBackend per answer (the terminal's own write is left
//! out). Prints one line of `key=value` pairs: CPU % of one core over the whole run and the
//! median of the per-second figures, frame time median and p99, and a query round's wall time.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpupilot::cluster::model::{ClusterModel, names};
use gpupilot::cluster::query::Prometheus;
use gpupilot::cluster::view::{ViewState, render};
use gpupilot::cluster::{GridMetric, Polled, Poller};
use ratatui::Terminal;
use ratatui::backend::TestBackend;

/// utime + stime of this process, seconds (clock ticks are 1/100 s).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    let rest = &stat[stat.rfind(')').expect("stat format") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / 100.0
}

fn now_s() -> f64 {
    gpupilot::telemetry::now_s()
}

/// The answer to one query, as Prometheus writes it.
fn answer(query: &str, nodes: usize, gpus: usize) -> String {
    let t = now_s();
    let phase = t.floor();
    let mut result = Vec::new();
    let target = |n: usize| format!("10.1.{}.{}:9400", n / 250, n % 250 + 1);
    if query == "up" || query == "timestamp(up)" {
        for n in 0..nodes {
            let v = if query == "up" { 1.0 } else { phase - 0.5 };
            result.push(serde_json::json!({
                "metric": {"instance": target(n), "job": "dcgm"},
                "value": [t, v.to_string()]
            }));
        }
    } else {
        for n in 0..nodes {
            for g in 0..gpus {
                for (k, name) in names::ALL.iter().enumerate() {
                    let x = (phase + (n * gpus + g) as f64 + k as f64).sin().abs();
                    let v = match *name {
                        names::STALE | names::LOST => 0.0,
                        names::ENERGY => 3.6e9 * 40.0 + phase * 500_000.0,
                        names::POWER_LIMIT => 700.0,
                        _ => (x * 1000.0).round() / 10.0,
                    };
                    result.push(serde_json::json!({
                        "metric": {
                            "__name__": name, "instance": target(n), "job": "dcgm",
                            "gpu": g.to_string(), "UUID": format!("GPU-{n:04}-{g}"),
                            "modelName": "NVIDIA H100 80GB HBM3",
                            "Hostname": format!("gpu-node-{n:03}"),
                            "pci_bus_id": format!("00000000:{:02X}:00.0", 0x18 + g * 0x10),
                            "device": format!("nvidia{g}"),
                        },
                        "value": [t, v.to_string()]
                    }));
                }
            }
        }
    }
    serde_json::json!({"status": "success", "data": {"resultType": "vector", "result": result}})
        .to_string()
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn serve(port_file: &str, nodes: usize, gpus: usize) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    std::fs::write(port_file, l.local_addr().unwrap().port().to_string()).unwrap();
    for s in l.incoming() {
        let Ok(mut s) = s else { continue };
        let mut line = String::new();
        let mut r = BufReader::new(s.try_clone().unwrap());
        if r.read_line(&mut line).is_err() {
            continue;
        }
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).is_err() || h == "\r\n" || h.is_empty() {
                break;
            }
        }
        let target = line.split(' ').nth(1).unwrap_or_default();
        let query = target
            .split_once("query=")
            .map(|(_, q)| decode(q))
            .unwrap_or_default();
        let body = answer(&query, nodes, gpus);
        let _ = write!(
            s,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        );
    }
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args.first().map(String::as_str) == Some("serve") {
        serve(&args[1], args[2].parse().unwrap(), args[3].parse().unwrap());
        return;
    }
    let seconds: u64 = args.first().and_then(|s| s.parse().ok()).unwrap_or(60);
    let nodes: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(64);
    let gpus: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(8);

    let dir = tempfile::tempdir().unwrap();
    let port_file = dir.path().join("port");
    let mut server = Command::new(std::env::current_exe().unwrap())
        .args(["serve", port_file.to_str().unwrap()])
        .args([nodes.to_string(), gpus.to_string()])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let port = loop {
        if let Some(p) = std::fs::read_to_string(&port_file)
            .ok()
            .and_then(|p| p.parse::<u16>().ok())
        {
            break p;
        }
        assert!(
            Instant::now() < deadline,
            "the stand-in Prometheus did not start"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    // One round by hand: the size of the answers and a round's wall time.
    let prom = Prometheus::new(&format!("http://127.0.0.1:{port}")).unwrap();
    let mut probe = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        probe,
        "GET /api/v1/query?query={} HTTP/1.1\r\n\r\n",
        gpupilot::cluster::query::encode(&gpupilot::cluster::model::fields_query())
    )
    .unwrap();
    let mut raw = Vec::new();
    probe.read_to_end(&mut raw).unwrap();

    let poller = Poller::start(prom.clone(), Duration::from_secs(1));
    let mut state = ViewState::new(&prom.base, GridMetric::Util);
    let mut terminal = Terminal::new(TestBackend::new(200, 50)).unwrap();
    let mut frames = Vec::new();
    let mut per_second = Vec::new();
    let mut failures = 0;
    // The first answer is warm-up.
    let mut model: ClusterModel = match poller.rx.recv_timeout(Duration::from_secs(10)) {
        Ok(Polled::Model(m)) => *m,
        other => panic!("no first answer: {other:?}"),
    };
    let (cpu0, wall0) = (cpu_seconds(), Instant::now());
    let mut last = (cpu0, wall0);
    while wall0.elapsed() < Duration::from_secs(seconds) {
        match poller.rx.recv_timeout(Duration::from_secs(5)) {
            Ok(Polled::Model(m)) => model = *m,
            Ok(Polled::Failed(e)) => {
                failures += 1;
                eprintln!("query failed: {e}");
            }
            Err(_) => panic!("no answer for 5 s"),
        }
        state.age_s = Some(0.0);
        let t = Instant::now();
        terminal.draw(|f| render(f, &model, &state)).unwrap();
        frames.push(t.elapsed().as_secs_f64() * 1000.0);
        let (c, w) = (cpu_seconds(), Instant::now());
        let dw = (w - last.1).as_secs_f64();
        if dw > 0.0 {
            per_second.push(100.0 * (c - last.0) / dw);
        }
        last = (c, w);
    }
    let cpu_pct = 100.0 * (cpu_seconds() - cpu0) / wall0.elapsed().as_secs_f64();
    drop(poller);
    let round = {
        let t = Instant::now();
        gpupilot::cluster::fetch(&prom, None, now_s()).unwrap();
        t.elapsed().as_secs_f64() * 1000.0
    };
    let _ = server.kill();
    let _ = server.wait();
    let totals = model.totals();
    println!(
        "nodes={nodes} gpus={} seconds={seconds} frames={} failures={failures} \
         cpu_pct={cpu_pct:.2} cpu_pct_median_per_s={:.2} frame_ms_median={:.3} \
         frame_ms_p99={:.3} round_ms={round:.1} fields_answer_bytes={}",
        totals.gpus,
        frames.len(),
        percentile(&mut per_second, 0.5),
        percentile(&mut frames.clone(), 0.5),
        percentile(&mut frames, 0.99),
        raw.len()
    );
}
