//! The bench view (what `gpupilot bench burn` draws while it runs) at 80×24 and 200×50, from a
//! hand-built burn: GPU 0 steady, GPU 1 heating into thermal slowdown, on the simulator.

use crate::support::tui::text;
use gpupilot::control::bench::burn::{BurnPoint, BurnProgress, GpuSeries};
use gpupilot::control::bench::{Label, Workload};
use gpupilot::telemetry::throttle;
use gpupilot::tui::theme::Theme;
use gpupilot::tui::views::bench::BenchView;
use insta::assert_snapshot;
use ratatui::Terminal;
use ratatui::backend::TestBackend;

fn series(gpu: u32, hot: bool) -> GpuSeries {
    let points = (1..=120)
        .map(|t| {
            let t_s = f64::from(t);
            let warm = 1.0 - (-t_s / 40.0).exp();
            let temp = if hot {
                35.0 + 55.0 * warm
            } else {
                35.0 + 33.0 * warm
            };
            let slowed = hot && temp >= 87.0;
            BurnPoint {
                t_s,
                temperature_c: Some(temp.min(88.0)),
                sm_clock_mhz: Some(if slowed { 990 } else { 1980 }),
                power_w: Some(if slowed { 420.0 } else { 690.0 }),
                throttle_reasons: if slowed {
                    throttle::HW_SLOWDOWN | throttle::HW_THERMAL_SLOWDOWN
                } else {
                    0
                },
            }
        })
        .collect();
    GpuSeries {
        gpu,
        name: Some("NVIDIA H100 80GB HBM3".into()),
        temp_slowdown_c: Some(87.0),
        sm_clock_max_mhz: Some(1980),
        points,
    }
}

fn progress() -> BurnProgress {
    BurnProgress {
        label: Label::Simulated,
        workload: Workload::Gemm,
        elapsed_s: 120.0,
        duration_s: 600.0,
        gpus: vec![series(0, false), series(1, true)],
    }
}

fn draw(p: &BurnProgress, w: u16, h: u16) -> Terminal<TestBackend> {
    let theme = Theme::default();
    let view = BenchView {
        progress: p,
        theme: &theme,
    };
    let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
    term.draw(|f| f.render_widget(&view, f.area())).unwrap();
    term
}

#[test]
fn the_bench_view_at_both_sizes() {
    let p = progress();
    for (w, h) in [(80, 24), (200, 50)] {
        let term = draw(&p, w, h);
        assert_snapshot!(format!("bench_burn_{w}x{h}"), term.backend());
        let screen = text(&term);
        assert!(
            screen.contains("bench burn · gemm · 2m00s of 10m00s"),
            "{screen}"
        );
        assert!(screen.contains(" SIMULATED "), "{screen}");
        for title in ["Temperature (°C)", "SM clock (MHz)", "Power (W)"] {
            assert!(screen.contains(title), "{title}\n{screen}");
        }
        // The newest figures, and GPU 1's thermal badges.
        assert!(
            screen.contains("66 °C") && screen.contains("1980 MHz"),
            "{screen}"
        );
        assert!(
            screen.contains("87 °C") && screen.contains("990 MHz"),
            "{screen}"
        );
        assert!(screen.contains(" hw-therm "), "{screen}");
    }
}

#[test]
fn a_measured_burn_says_so_and_a_tiny_terminal_does_not_panic() {
    let mut p = progress();
    p.label = Label::Measured;
    let screen = text(&draw(&p, 80, 24));
    assert!(
        screen.contains(" measured ") && !screen.contains("SIMULATED"),
        "{screen}"
    );
    let screen = text(&draw(&p, 30, 8));
    assert!(screen.contains("terminal too small"), "{screen}");
    // No points yet: axes without data, N/A in the legend.
    p.gpus.iter_mut().for_each(|g| g.points.clear());
    let screen = text(&draw(&p, 80, 24));
    assert!(screen.contains("N/A"), "{screen}");
}
