//! `gpupilot cluster [--prometheus URL] [--prometheus-bearer-token-file FILE]
//! [--prometheus-basic-auth-file FILE] [--prometheus-ca FILE] [--metric util|power|temp|mem]
//! [--json]`: the cluster view (see [`crate::cluster`]).

use std::process::ExitCode;
use std::time::Duration;

use crate::cli::ClusterArgs;
use crate::cluster::{
    self,
    query::{Access, Prometheus},
};
use crate::config::Paths;

pub fn cluster(args: &ClusterArgs) -> anyhow::Result<ExitCode> {
    let paths = Paths::from_env();
    let file = crate::config::prometheus::load(&paths.config)?.cluster;
    let url = match &args.prometheus {
        Some(u) => u.clone(),
        None => file.prometheus.ok_or_else(|| {
            anyhow::anyhow!(
                "which Prometheus? Give --prometheus http://HEAD:9090, or set [cluster] \
                 prometheus in {} (docs/operations.md, \"Prometheus\")",
                crate::config::prometheus::path(&paths.config).display()
            )
        })?,
    };
    // Each option wins over its key in the file.
    let access = Access {
        bearer_token_file: args
            .prometheus_bearer_token_file
            .clone()
            .or(file.bearer_token_file),
        basic_auth_file: args
            .prometheus_basic_auth_file
            .clone()
            .or(file.basic_auth_file),
        ca_file: args.prometheus_ca.clone().or(file.ca_file),
    };
    let prom = Prometheus::with_access(&url, &access)?;
    if args.json {
        let model = cluster::fetch(&prom, None, crate::telemetry::now_s())?;
        // A local daemon's live Slurm jobs, when one answers (never started from here).
        let runs = crate::client::Client::connect(&paths)
            .ok()
            .and_then(|c| c.with_timeout(Duration::from_secs(3)).runs().ok())
            .unwrap_or_default();
        let model = cluster::jobs::mark(model, &runs);
        let out = serde_json::json!({ "totals": model.totals(), "model": model });
        super::out(&format!("{}\n", serde_json::to_string_pretty(&out)?))?;
        return Ok(ExitCode::SUCCESS);
    }
    if !std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        anyhow::bail!("the cluster view needs a terminal; use --json for scripts");
    }
    cluster::run_terminal(prom, args.metric, Duration::from_secs_f64(args.interval))?;
    Ok(ExitCode::SUCCESS)
}
