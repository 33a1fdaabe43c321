//! `gpupilot thermal [--json]`, `thermal target CELSIUS | --margin C [--gpu I,J]`,
//! `thermal off [--gpu …]` and `gpupilot budget [WATTS|off]`: clients of the daemon, whose
//! control loops hold temperatures and the node budget (it starts in the background when none
//! answers).

use std::process::ExitCode;

use crate::cli::{BudgetArgs, GlobalArgs, GpuList, ThermalArgs, ThermalCommand};
use crate::config::Paths;
use crate::control::energy::joules_text;
use crate::control::status::ControlStatus;
use crate::protocol::{Request, Response, TargetGpus};
use crate::text::printable;

/// `gpupilot thermal …`.
pub fn thermal(g: &GlobalArgs, args: &ThermalArgs) -> anyhow::Result<ExitCode> {
    let request = match &args.action {
        None => Request::Thermal {},
        Some(ThermalCommand::Target {
            celsius,
            margin,
            gpus,
        }) => Request::ThermalSet {
            gpus: selection(gpus),
            target_c: *celsius,
            margin_c: *margin,
            why: why(&gpus.why),
        },
        Some(ThermalCommand::Off { gpus }) => Request::ThermalOff {
            gpus: selection(gpus),
            why: why(&gpus.why),
        },
    };
    ask(g, request, args.json)
}

/// `gpupilot budget …`.
pub fn budget(g: &GlobalArgs, args: &BudgetArgs) -> anyhow::Result<ExitCode> {
    let request = match args.value.as_deref() {
        None => Request::Thermal {},
        Some("off") => Request::PowerBudget {
            budget_w: None,
            why: why(&args.why),
        },
        Some(v) => {
            let w: f64 = v.trim_end_matches('W').trim().parse().map_err(|_| {
                anyhow::anyhow!("`{v}` is not a budget: give watts (e.g. 2800) or `off`")
            })?;
            Request::PowerBudget {
                budget_w: Some(w),
                why: why(&args.why),
            }
        }
    };
    ask(g, request, args.json)
}

fn selection(gpus: &GpuList) -> TargetGpus {
    if gpus.gpu.is_empty() {
        TargetGpus::All
    } else {
        TargetGpus::Some(gpus.gpu.clone())
    }
}

/// The reason recorded: the user's words, else the command line.
fn why(given: &Option<String>) -> Option<String> {
    given.clone().or_else(|| {
        let args: Vec<String> = std::env::args().skip(1).collect();
        Some(format!("gpupilot {}", args.join(" ")))
    })
}

fn ask(g: &GlobalArgs, request: Request, json: bool) -> anyhow::Result<ExitCode> {
    let client = super::connect_or_spawn(g, &Paths::from_env())?;
    let kind = request.kind();
    let status = match client.request(request)? {
        Response::Control(s) => *s,
        other => anyhow::bail!("the daemon answered {kind} with {other:?}"),
    };
    if json {
        super::out(&format!("{}\n", serde_json::to_string_pretty(&status)?))?;
    } else {
        super::out(&render(&status))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The control loops in words: one line per governor, the budget, alerts, energy. Who set
/// each, and why, are a peer's words: they are shown [`printable`].
pub fn render(s: &ControlStatus) -> String {
    let mut out = String::new();
    if s.governors.is_empty() {
        out.push_str("thermal governor: off\n");
    }
    for g in &s.governors {
        out.push_str(&format!("GPU {}: {}\n", g.gpu, g.line()));
        if let Some(d) = &g.last {
            out.push_str(&format!("       last: {}\n", printable(&d.why)));
        }
        out.push_str(&format!("       by {}\n", printable(&g.by)));
    }
    match &s.budget {
        Some(b) => {
            out.push_str(&format!("{} (by {})\n", b.line(), printable(&b.by)));
            if let Some(why) = &b.infeasible {
                out.push_str(&format!("       {}\n", printable(why)));
            }
            if !b.caps.is_empty() {
                let caps: Vec<String> = b
                    .caps
                    .iter()
                    .map(|(g, c)| format!("GPU {g} {c:.0} W"))
                    .collect();
                out.push_str(&format!("       caps: {}\n", caps.join(", ")));
            }
        }
        None => out.push_str("node budget: none\n"),
    }
    if s.alerts.is_empty() {
        out.push_str("alerts: none\n");
    }
    for a in &s.alerts {
        out.push_str(&format!("ALERT {}\n", printable(&a.message)));
    }
    if !s.energy.is_empty() {
        let e: Vec<String> = s
            .energy
            .iter()
            .map(|g| format!("GPU {} {}", g.gpu, joules_text(g.energy_j)))
            .collect();
        out.push_str(&format!(
            "energy since the daemon started: {}\n",
            e.join(", ")
        ));
    }
    for n in &s.notes {
        out.push_str(&format!("note: {}\n", printable(n)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn command_lines_parse() {
        let cli = crate::cli::Cli::try_parse_from([
            "gpupilot", "thermal", "target", "78", "--gpu", "0,2",
        ])
        .unwrap();
        let Some(crate::cli::Command::Thermal(a)) = cli.command else {
            panic!()
        };
        let Some(ThermalCommand::Target {
            celsius,
            margin,
            gpus,
        }) = a.action
        else {
            panic!()
        };
        assert_eq!((celsius, margin, gpus.gpu), (Some(78.0), None, vec![0, 2]));
        let cli =
            crate::cli::Cli::try_parse_from(["gpupilot", "thermal", "target", "--margin", "8"])
                .unwrap();
        assert!(matches!(
            cli.command,
            Some(crate::cli::Command::Thermal(ThermalArgs {
                action: Some(ThermalCommand::Target {
                    margin: Some(8.0),
                    celsius: None,
                    ..
                }),
                ..
            }))
        ));
        assert!(crate::cli::Cli::try_parse_from(["gpupilot", "thermal", "target"]).is_err());
        assert!(
            crate::cli::Cli::try_parse_from([
                "gpupilot", "thermal", "target", "70", "--margin", "5"
            ])
            .is_err()
        );
        let cli = crate::cli::Cli::try_parse_from(["gpupilot", "budget", "off"]).unwrap();
        assert!(matches!(cli.command, Some(crate::cli::Command::Budget(_))));
    }

    #[test]
    fn who_set_the_budget_is_shown_printably() {
        let s = ControlStatus {
            budget: Some(crate::control::status::BudgetStatus {
                budget_w: 2800.0,
                total_w: 2400.0,
                demand_w: 2600.0,
                caps: Vec::new(),
                infeasible: None,
                by: "root (uid 0) via gp\u{1b}[2J\nFAKE (pid 7)".into(),
            }),
            notes: vec!["held by\u{202e}x".into()],
            ..ControlStatus::default()
        };
        assert_eq!(
            render(&s),
            "thermal governor: off\n\
             budget 2400/2800 W (by root (uid 0) via gp\\x1b[2J\\nFAKE (pid 7))\n\
             alerts: none\n\
             note: held by\\u{202e}x\n"
        );
    }

    #[test]
    fn nothing_on_reads_plainly() {
        let text = render(&ControlStatus::default());
        assert_eq!(
            text,
            "thermal governor: off\nnode budget: none\nalerts: none\n"
        );
    }
}
