//! `$CONFIG/prometheus.toml` (`GPUPILOT_HOME=DIR`: `DIR/config/prometheus.toml`): where the
//! daemon serves `/metrics`, and which Prometheus `gpupilot cluster` asks. Every key is
//! optional; no file is no settings; command-line options win over the file.
//!
//! ```toml
//! [exporter]
//! listen = "0.0.0.0:9400"          # or "off"
//! hostname_label = "hostname"      # dcgm-exporter 4.x's spelling; default "Hostname"
//!
//! [cluster]
//! prometheus = "https://head:9090"
//! bearer_token_file = "/etc/gpupilot/prometheus.token"  # or basic_auth_file (USER:PASSWORD)
//! ca_file = "/etc/gpupilot/prometheus-ca.pem"           # a private CA, for https
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The file, parsed.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrometheusSettings {
    #[serde(default)]
    pub exporter: ExporterSettings,
    #[serde(default)]
    pub cluster: ClusterSettings,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExporterSettings {
    /// `ADDR:PORT` or `off`.
    pub listen: Option<String>,
    /// How `/metrics` spells the node's label: `"Hostname"` (default) or `"hostname"`.
    pub hostname_label: Option<HostnameLabel>,
}

/// How the node's label is spelled: dcgm-exporter's `Hostname` (its releases up to 3.x, and
/// the default), or `hostname` as dcgm-exporter 4.x spells it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum HostnameLabel {
    /// `Hostname`.
    #[default]
    #[serde(rename = "Hostname")]
    Hostname,
    /// `hostname`.
    #[serde(rename = "hostname")]
    Lower,
}

impl HostnameLabel {
    /// The label's name.
    pub fn name(self) -> &'static str {
        match self {
            HostnameLabel::Hostname => "Hostname",
            HostnameLabel::Lower => "hostname",
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSettings {
    /// Prometheus's base URL.
    pub prometheus: Option<String>,
    /// A file holding the bearer token sent to Prometheus.
    pub bearer_token_file: Option<PathBuf>,
    /// A file whose first line is `USER:PASSWORD`, sent as basic auth.
    pub basic_auth_file: Option<PathBuf>,
    /// The PEM file of the CA that signed Prometheus's certificate.
    pub ca_file: Option<PathBuf>,
}

/// Parse `--metrics-addr` or `[exporter] listen`: `off` (None) or `ADDR:PORT`.
pub fn parse_metrics_addr(s: &str) -> Result<Option<SocketAddr>, String> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("off") || s.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    s.parse::<SocketAddr>().map(Some).map_err(|_| {
        format!(
            "metrics address `{s}`: give ADDR:PORT (`127.0.0.1:9400`, `0.0.0.0:9400`, \
             `[::1]:9400`) or `off`"
        )
    })
}

/// Where the file is for a config directory.
pub fn path(config_dir: &Path) -> PathBuf {
    config_dir.join("prometheus.toml")
}

/// Read the file: none is the defaults; a bad one is an error naming the file and the fix.
pub fn load(config_dir: &Path) -> anyhow::Result<PrometheusSettings> {
    let p = path(config_dir);
    let text = match std::fs::read_to_string(&p) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Default::default()),
        Err(e) => anyhow::bail!("reading {}: {e}", p.display()),
    };
    let s: PrometheusSettings = toml::from_str(&text).map_err(|e| {
        anyhow::anyhow!(
            "{}: {e}; the keys are [exporter] listen and hostname_label \
             (\"Hostname\" or \"hostname\"), and [cluster] prometheus, \
             bearer_token_file, basic_auth_file and ca_file (docs/operations.md, \"Prometheus\")",
            p.display()
        )
    })?;
    if let Some(l) = &s.exporter.listen {
        parse_metrics_addr(l)
            .map_err(|e| anyhow::anyhow!("{}: [exporter] listen: {e}", p.display()))?;
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_good_and_bad_files() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path()).unwrap(), PrometheusSettings::default());
        std::fs::write(
            path(dir.path()),
            "[exporter]\nlisten = \"off\"\n[cluster]\nprometheus = \"http://h:9090\"\n",
        )
        .unwrap();
        let s = load(dir.path()).unwrap();
        assert_eq!(s.exporter.listen.as_deref(), Some("off"));
        assert_eq!(s.cluster.prometheus.as_deref(), Some("http://h:9090"));
        std::fs::write(
            path(dir.path()),
            "[cluster]\nbearer_token_file = \"/t\"\nca_file = \"/ca.pem\"\n",
        )
        .unwrap();
        let s = load(dir.path()).unwrap();
        assert_eq!(s.cluster.bearer_token_file, Some(PathBuf::from("/t")));
        assert_eq!(s.cluster.ca_file, Some(PathBuf::from("/ca.pem")));
        std::fs::write(path(dir.path()), "[exporter]\nlisten = \"nowhere\"\n").unwrap();
        let e = load(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains("prometheus.toml") && e.contains("ADDR:PORT"),
            "{e}"
        );
        std::fs::write(path(dir.path()), "[exporter]\nport = 1\n").unwrap();
        let e = load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("[exporter] listen"), "{e}");
    }

    #[test]
    fn addresses_and_off() {
        assert_eq!(parse_metrics_addr("off").unwrap(), None);
        assert_eq!(
            parse_metrics_addr("127.0.0.1:9400").unwrap(),
            Some("127.0.0.1:9400".parse().unwrap())
        );
        assert!(parse_metrics_addr("[::1]:9400").unwrap().is_some());
        let e = parse_metrics_addr("localhost").unwrap_err();
        assert!(e.contains("ADDR:PORT") && e.contains("off"), "{e}");
    }

    #[test]
    fn hostname_label_either_spelling() {
        let dir = tempfile::tempdir().unwrap();
        let label = |text: &str| {
            std::fs::write(path(dir.path()), text).unwrap();
            load(dir.path()).map(|s| s.exporter.hostname_label)
        };
        assert_eq!(label("").unwrap(), None);
        assert_eq!(
            label("[exporter]\nhostname_label = \"hostname\"\n").unwrap(),
            Some(HostnameLabel::Lower)
        );
        assert_eq!(
            label("[exporter]\nhostname_label = \"Hostname\"\n").unwrap(),
            Some(HostnameLabel::Hostname)
        );
        let e = label("[exporter]\nhostname_label = \"HOSTNAME\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("hostname_label"), "{e}");
    }
}
