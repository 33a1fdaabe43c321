//! `gpupilot bench power-sweep`: parse, run the sweep service (`control::bench::sweep`)
//! through the daemon, keep the curve, print a table or JSON.

use std::process::ExitCode;

use crate::cli::{GlobalArgs, PowerSweepArgs};
use crate::control::bench::curve;
use crate::control::bench::sweep::{self, KNEE_DROP, SweepConfig, SweepResult};
use crate::control::tuner::session::stop_flag;

use super::setup;

/// `gpupilot bench power-sweep …`.
pub fn power_sweep(g: &GlobalArgs, args: &PowerSweepArgs) -> anyhow::Result<ExitCode> {
    setup::exit_2_on_usage(run(g, args))
}

fn run(g: &GlobalArgs, args: &PowerSweepArgs) -> anyhow::Result<ExitCode> {
    let (mut loads, mut node, paths) = setup::open(g, "power-sweep")?;
    let cfg = SweepConfig {
        gpu: args.gpu,
        caps: args.caps,
        workload: args.load,
        warmup_s: args.warmup.as_secs_f64(),
        window_s: args.window.as_secs_f64(),
        poll_s: 1.0_f64.min(args.window.as_secs_f64() / 4.0),
    };
    // Ctrl-C, SIGTERM and SIGHUP (the SSH session dropped) end the sweep; the cap goes back.
    let stop = stop_flag();
    if !args.json {
        eprintln!(
            "gpupilot: sweeping GPU {}'s power cap under {} ({} + {} s a cap); Ctrl-C stops and \
             puts the cap back",
            cfg.gpu,
            cfg.workload.as_str(),
            cfg.warmup_s,
            cfg.window_s
        );
    }
    let result = sweep::run(&mut node, loads.as_mut(), &cfg, &stop)?;
    let saved = if result.points.is_empty() {
        None
    } else {
        Some(curve::save(&paths.state, &result))
    };
    if args.json {
        let mut v = serde_json::to_value(&result)?;
        if let (Some(obj), Some(Ok(path))) = (v.as_object_mut(), &saved) {
            obj.insert("curve_file".into(), path.display().to_string().into());
        }
        super::super::out(&(serde_json::to_string_pretty(&v)? + "\n"))?;
    } else {
        super::super::out(&table(&result))?;
        match &saved {
            Some(Ok(path)) => println!("curve kept in {}", path.display()),
            Some(Err(e)) => eprintln!("gpupilot: the curve could not be kept: {e:#}"),
            None => {}
        }
    }
    if result.stopped {
        eprintln!(
            "gpupilot: sweep stopped after {} cap(s); GPU {} is back at {:.0} W",
            result.points.len(),
            result.gpu,
            result.original_cap_w
        );
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// The sweep for people: one row a cap, then the knee and the best perf/W cap.
pub fn table(r: &SweepResult) -> String {
    let u = r.unit;
    let simulated = r.label == crate::control::bench::Label::Simulated;
    let tag = if simulated { " (simulated)" } else { "" };
    let mut out = format!(
        "GPU {} · {} · {} · {}{}\n",
        r.gpu,
        r.gpu_name.as_deref().unwrap_or("N/A"),
        r.workload.as_str(),
        r.label.as_str(),
        if simulated {
            ": figures of gpusim's model, not of hardware"
        } else {
            ""
        }
    );
    out += &format!(
        "{:>7}  {:>16}  {:>7}  {:>14}  {:>14}  {:>9}  {:>6}\n",
        "cap", "throughput", "power", "energy/unit", "perf/W", "clock", "temp"
    );
    for p in &r.points {
        out += &format!(
            "{:>5} W  {:>16}  {:>5} W  {:>14}  {:>14}  {:>9}  {:>6}\n",
            format!("{:.0}", p.cap_w),
            u.rate(p.throughput_per_s),
            format!("{:.0}", p.power_w),
            u.energy(p.energy_per_unit_j),
            u.per_joule(p.perf_per_w),
            p.sm_clock_mhz
                .map_or("N/A".into(), |c| format!("{c:.0} MHz")),
            p.temperature_c
                .map_or("N/A".into(), |c| format!("{c:.0} °C")),
        );
    }
    match &r.knee {
        Some(k) => {
            let below = match k.falloff_at_w {
                Some(f) => format!(
                    "at {f:.0} W throughput is more than {:.0} % below the best",
                    KNEE_DROP * 100.0
                ),
                None => "no cap of the sweep fell off".into(),
            };
            out += &format!("knee{tag}: {:.0} W ({below})\n", k.cap_w);
        }
        None => out += "knee: N/A (no cap measured)\n",
    }
    if let Some(best) = r.best_perf_per_w_cap_w {
        if let Some(p) = r.points.iter().find(|p| p.cap_w == best) {
            out += &format!(
                "best perf/W{tag}: {best:.0} W ({}, {})\n",
                u.per_joule(p.perf_per_w),
                u.rate(p.throughput_per_s)
            );
        }
    }
    out += &format!("GPU {}'s cap is back at {:.0} W\n", r.gpu, r.original_cap_w);
    out
}
