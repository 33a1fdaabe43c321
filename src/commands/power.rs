//! `gpupilot power [--json]`, `power cap WATTS [--gpu I,J]`, `power reset`, `power gpu-max`,
//! and `gpupilot clocks lock MIN MAX` / `clocks reset`: clients of the daemon, which owns the
//! GPUs' settings (and starts in the background when none answers).

use std::process::ExitCode;

use crate::cli::{ClocksCommand, GlobalArgs, GpuList, PowerArgs, PowerCommand};
use crate::client::Client;
use crate::config::Paths;
use crate::control::power::watts;
use crate::protocol::{GpuChange, GpuSettings, Request, Response, TargetGpus};

/// `gpupilot power …`.
pub fn power(g: &GlobalArgs, args: &PowerArgs) -> anyhow::Result<ExitCode> {
    let request = match &args.action {
        None => {
            let client = super::connect_or_spawn(g, &Paths::from_env())?;
            return show(&client, args.json);
        }
        Some(PowerCommand::Cap { watts, gpus }) => Request::PowerCap {
            gpus: selection(gpus),
            watts: *watts,
            why: why(gpus),
        },
        Some(PowerCommand::Reset { gpus }) => Request::PowerReset {
            gpus: selection(gpus),
            why: why(gpus),
        },
        Some(PowerCommand::GpuMax { value, gpus }) if value == "reset" => {
            Request::GpuMaxTempReset {
                gpus: selection(gpus),
                why: why(gpus),
            }
        }
        Some(PowerCommand::GpuMax { value, gpus }) => {
            let celsius: f64 = value.trim_end_matches("°C").trim().parse().map_err(|_| {
                anyhow::anyhow!(
                    "`{value}` is not a temperature: give whole °C (e.g. 83) or `reset`"
                )
            })?;
            Request::GpuMaxTemp {
                gpus: selection(gpus),
                celsius,
                why: why(gpus),
            }
        }
    };
    change(g, request, args.json)
}

/// `gpupilot clocks …`.
pub fn clocks(g: &GlobalArgs, cmd: &ClocksCommand) -> anyhow::Result<ExitCode> {
    let request = match cmd {
        ClocksCommand::Lock {
            min_mhz,
            max_mhz,
            gpus,
        } => Request::ClocksLock {
            gpus: selection(gpus),
            min_mhz: *min_mhz,
            max_mhz: *max_mhz,
            why: why(gpus),
        },
        ClocksCommand::Reset { gpus } => Request::ClocksReset {
            gpus: selection(gpus),
            why: why(gpus),
        },
    };
    change(g, request, false)
}

fn selection(gpus: &GpuList) -> TargetGpus {
    if gpus.gpu.is_empty() {
        TargetGpus::All
    } else {
        TargetGpus::Some(gpus.gpu.clone())
    }
}

/// The reason recorded with the change: the user's words, else the command line.
fn why(gpus: &GpuList) -> Option<String> {
    gpus.why.clone().or_else(|| {
        let args: Vec<String> = std::env::args().skip(1).collect();
        Some(format!("gpupilot {}", args.join(" ")))
    })
}

fn change(g: &GlobalArgs, request: Request, json: bool) -> anyhow::Result<ExitCode> {
    let client = super::connect_or_spawn(g, &Paths::from_env())?;
    let kind = request.kind();
    let answer = client.request(request).map_err(|e| {
        let args: Vec<String> = std::env::args().skip(1).collect();
        crate::client::system::suggest_system(e, &args)
    })?;
    let (changes, notes) = match answer {
        Response::GpuChanged { changes, notes } => (changes, notes),
        other => anyhow::bail!("the daemon answered {kind} with {other:?}"),
    };
    if json {
        let v = serde_json::json!({ "changes": changes, "notes": notes });
        super::out(&format!("{v}\n"))?;
    } else {
        super::out(&render_changes(&changes, &notes))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `GPU 1: power limit 700 W → 250 W`, one line per change, then the notes.
pub fn render_changes(changes: &[GpuChange], notes: &[String]) -> String {
    let mut out = String::new();
    for c in changes {
        let what = match c.what.as_str() {
            "power_limit" => "power limit",
            "locked_clocks" => "SM clocks",
            "gpu_max_temp" => "target temperature",
            other => other,
        };
        out.push_str(&format!(
            "GPU {}: {what} {} → {}\n",
            c.gpu,
            c.old.as_deref().unwrap_or("?"),
            c.new.as_deref().unwrap_or("?")
        ));
    }
    for n in notes {
        out.push_str(&crate::text::printable(n));
        out.push('\n');
    }
    if changes.is_empty() && notes.is_empty() {
        out.push_str("nothing to change\n");
    }
    out
}

fn show(client: &Client, json: bool) -> anyhow::Result<ExitCode> {
    let (gpus, restore) = match client.request(Request::Power {})? {
        Response::Power {
            gpus,
            restore_on_exit,
        } => (gpus, restore_on_exit),
        other => anyhow::bail!("the daemon answered power with {other:?}"),
    };
    if json {
        let v = serde_json::json!({ "gpus": gpus, "restore_on_exit": restore });
        super::out(&format!("{}\n", serde_json::to_string_pretty(&v)?))?;
    } else {
        super::out(&render_table(&gpus, restore))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The table `gpupilot power` prints.
pub fn render_table(gpus: &[GpuSettings], restore_on_exit: bool) -> String {
    let na = || "N/A".to_string();
    let mut rows: Vec<[String; 8]> = vec![[
        "GPU".into(),
        "LIMIT".into(),
        "ENFORCED".into(),
        "DEFAULT".into(),
        "RANGE".into(),
        "SM CLOCKS".into(),
        "TARGET".into(),
        "RECORDED (reset restores)".into(),
    ]];
    for g in gpus {
        let p = g.power.as_ref();
        let clocks = match (g.locked_clocks_mhz, g.clocks) {
            (Some([lo, hi]), _) => format!("locked {lo}–{hi} MHz"),
            (None, Some(r)) => format!("{}–{} MHz", r.min_mhz, r.max_mhz),
            (None, None) => na(),
        };
        let mut recorded = Vec::new();
        if let Some(w) = g.original.power_limit_w {
            recorded.push(watts(w));
        }
        if g.original.locked_clocks_mhz.is_some() {
            recorded.push("clocks unlocked".into());
        }
        if let Some(c) = g.original.gpu_max_c {
            recorded.push(format!("target {c:.0} °C"));
        }
        rows.push([
            g.index.to_string(),
            p.map(|p| p.current_w)
                .filter(|w| *w > 0.0)
                .map(watts)
                .unwrap_or_else(na),
            p.and_then(|p| p.enforced_w).map(watts).unwrap_or_else(na),
            p.map(|p| watts(p.default_w)).unwrap_or_else(na),
            p.map(|p| {
                format!(
                    "{}–{}",
                    watts(p.min_w).trim_end_matches(" W"),
                    watts(p.max_w)
                )
            })
            .unwrap_or_else(na),
            clocks,
            g.gpu_max
                .map(|t| format!("{:.0} °C", t.current_c))
                .unwrap_or_else(|| "-".into()),
            if recorded.is_empty() {
                "-".into()
            } else {
                recorded.join(", ")
            },
        ]);
    }
    let widths: Vec<usize> = (0..8)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in &rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    for g in gpus {
        for n in &g.notes {
            out.push_str(&format!("GPU {}: {}\n", g.index, crate::text::printable(n)));
        }
    }
    out.push_str(if restore_on_exit {
        "The daemon restores the recorded values when it stops (--restore-on-exit).\n"
    } else {
        "The daemon leaves the settings as they are when it stops; `gpupilot power reset` restores.\n"
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::PowerLimits;
    use crate::control::power::{ClockRange, GpuOriginals};

    #[test]
    fn the_table_shows_limits_locks_and_what_reset_restores() {
        let g = |index, current_w, orig: GpuOriginals| GpuSettings {
            index,
            uuid: None,
            power: Some(PowerLimits {
                current_w,
                enforced_w: Some(current_w),
                default_w: 700.0,
                min_w: 200.0,
                max_w: 700.0,
            }),
            clocks: Some(ClockRange {
                min_mhz: 345,
                max_mhz: 1980,
            }),
            locked_clocks_mhz: orig.locked_clocks_mhz,
            gpu_max: None,
            original: orig,
            notes: vec![],
        };
        let t = render_table(
            &[
                g(0, 700.0, GpuOriginals::default()),
                g(
                    1,
                    250.0,
                    GpuOriginals {
                        power_limit_w: Some(700.0),
                        locked_clocks_mhz: Some([1000, 1500]),
                        ..Default::default()
                    },
                ),
            ],
            false,
        );
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("GPU  LIMIT"), "{t}");
        assert!(
            lines[1].contains("700 W") && lines[1].contains("200–700 W"),
            "{t}"
        );
        assert!(
            lines[1].contains("345–1980 MHz") && lines[1].ends_with('-'),
            "{t}"
        );
        assert!(lines[2].starts_with("1    250 W"), "{t}");
        assert!(lines[2].contains("locked 1000–1500 MHz"), "{t}");
        assert!(lines[2].ends_with("700 W, clocks unlocked"), "{t}");
        assert!(t.contains("`gpupilot power reset` restores"), "{t}");
    }

    #[test]
    fn changes_read_old_to_new() {
        let c = GpuChange {
            gpu: 1,
            what: "power_limit".into(),
            old: Some("700 W".into()),
            new: Some("250 W".into()),
        };
        assert_eq!(
            render_changes(&[c], &["GPU 2: no power limit recorded".into()]),
            "GPU 1: power limit 700 W → 250 W\nGPU 2: no power limit recorded\n"
        );
        assert_eq!(render_changes(&[], &[]), "nothing to change\n");
    }
}
