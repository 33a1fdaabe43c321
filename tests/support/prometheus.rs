//! A real Prometheus (Debian's `prometheus`) on a free loopback port, scraping the given
//! targets every second, its data and log in a directory of its own; killed (SIGKILL through
//! std, one positive pid) and reaped when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::net::free_port;

pub struct PrometheusProc {
    child: Child,
    pub port: u16,
    /// Its config, data and `prometheus.log`.
    pub dir: tempfile::TempDir,
}

impl PrometheusProc {
    /// `bin` scraping `targets` (`HOST:PORT` each) every second as job `gpupilot`, with `extra`
    /// arguments (a `--web.config.file`, say).
    pub fn start(bin: &Path, targets: &[String], extra: &[String]) -> PrometheusProc {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let config = dir.path().join("prometheus.yml");
        let list: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  \
                 - job_name: gpupilot\n    static_configs:\n      - targets: [{}]\n",
                list.join(", ")
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new(bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .args(extra)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        PrometheusProc { child, port, dir }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("prometheus.log")
    }

    /// Its log so far, for a failure's message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }
}

impl Drop for PrometheusProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
