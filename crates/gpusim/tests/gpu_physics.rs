//! One GPU through the public API: power cap, locked clocks, thermal model, energy, workload.

use gpusim::{Gpu, GpuSpec, SimError, Training, TrainingConfig, find, find_model, throttle};

const DT: f64 = 0.1;

fn spec(id: &str) -> &'static GpuSpec {
    find(id).unwrap()
}

fn job(model: &str, batch: u32, prefetch: u32, workers: u32) -> Training {
    Training::new(TrainingConfig {
        model: model.into(),
        batch_size: batch,
        prefetch_depth: prefetch,
        workers,
    })
    .unwrap()
}

fn busy_gpu(id: &str, model: &str, batch: u32) -> Gpu {
    let mut gpu = Gpu::new(spec(id), 25.0);
    gpu.set_training(Some(job(model, batch, 4, 16)));
    gpu
}

fn run(gpu: &mut Gpu, seconds: f64, ambient_c: f64) {
    for _ in 0..(seconds / DT).round() as usize {
        gpu.step(DT, ambient_c);
    }
}

#[test]
fn idle_gpu_reports_idle() {
    let mut gpu = Gpu::new(spec("h100"), 25.0);
    run(&mut gpu, 1.0, 25.0);
    let r = gpu.reading();
    assert_eq!(r.util_gpu_pct, 0.0);
    assert_eq!(r.power_w, 70.0);
    assert_eq!(r.sm_clock_mhz, 345);
    assert_eq!(r.pstate, 8);
    assert_eq!(r.throttle_reasons, throttle::GPU_IDLE);
    assert_eq!(r.memory_used_bytes, 0);
    assert_eq!(r.fan_pct, None);
    assert_eq!(r.power_limit_w, 700.0);
    assert!(r.pcie_rx_kbps < 100 && r.pcie_tx_kbps < 100);
    assert_eq!(Gpu::new(spec("4090"), 25.0).reading().fan_pct, Some(30.0));
}

#[test]
fn power_cap_lowers_clock_and_power_and_raising_it_restores_them() {
    let mut gpu = busy_gpu("h100", "bert-large", 64);
    run(&mut gpu, 1.0, 25.0);
    let free = gpu.reading();
    assert_eq!(free.sm_clock_mhz, 1980);
    assert_eq!(free.throttle_reasons & throttle::SW_POWER_CAP, 0);
    assert!(
        free.power_w > 650.0 && free.power_w <= 700.0,
        "{}",
        free.power_w
    );
    assert_eq!(free.pstate, 0);

    gpu.set_power_limit_w(400.0).unwrap();
    run(&mut gpu, 1.0, 25.0);
    let capped = gpu.reading();
    assert!(capped.sm_clock_mhz < 1500, "{}", capped.sm_clock_mhz);
    assert!(
        capped.power_w <= 400.0 && capped.power_w > 380.0,
        "{}",
        capped.power_w
    );
    assert_ne!(capped.throttle_reasons & throttle::SW_POWER_CAP, 0);
    assert_eq!(capped.power_limit_w, 400.0);
    // The next grid clock up would break the cap.
    assert_eq!(gpu.steady_clock_mhz(), capped.sm_clock_mhz);
    let speed = |g: &Gpu| g.training().unwrap().samples_per_s;
    let capped_speed = speed(&gpu);

    gpu.set_power_limit_w(700.0).unwrap();
    run(&mut gpu, 1.0, 25.0);
    let restored = gpu.reading();
    assert_eq!(restored.sm_clock_mhz, 1980);
    assert_eq!(restored.throttle_reasons & throttle::SW_POWER_CAP, 0);
    assert!(speed(&gpu) > 1.2 * capped_speed);
}

#[test]
fn locked_clocks_bound_the_clock() {
    let mut gpu = busy_gpu("a100", "resnet50", 256);
    gpu.set_locked_clocks(900, 1200).unwrap();
    run(&mut gpu, 1.0, 25.0);
    let r = gpu.reading();
    assert_eq!(r.sm_clock_mhz, 1200);
    assert_eq!(r.locked_clocks_mhz, Some((900, 1200)));
    assert_ne!(
        r.throttle_reasons & throttle::APPLICATIONS_CLOCKS_SETTING,
        0
    );
    assert!(r.power_w > 280.0 && r.power_w < 320.0, "{}", r.power_w); // 380 W unlocked

    gpu.set_training(None);
    run(&mut gpu, 0.2, 25.0);
    assert_eq!(
        gpu.reading().sm_clock_mhz,
        900,
        "idles at the locked minimum"
    );

    gpu.reset_locked_clocks();
    gpu.set_training(Some(job("resnet50", 256, 4, 16)));
    run(&mut gpu, 0.2, 25.0);
    assert_eq!(gpu.reading().sm_clock_mhz, 1410);
    assert_eq!(gpu.reading().locked_clocks_mhz, None);
}

#[test]
fn out_of_range_settings_are_refused_with_the_range() {
    let mut gpu = Gpu::new(spec("h100"), 25.0);
    let e = gpu.set_power_limit_w(150.0).unwrap_err();
    assert_eq!(
        e,
        SimError::OutOfRange {
            what: "power limit (W)",
            value: 150.0,
            min: 200.0,
            max: 700.0
        }
    );
    assert!(gpu.set_power_limit_w(701.0).is_err());
    assert!(gpu.set_power_limit_w(f64::NAN).is_err());
    assert_eq!(gpu.power_limit_w(), 700.0);
    gpu.set_power_limit_w(200.0).unwrap();
    assert_eq!(gpu.power_limit_w(), 200.0);

    let e = gpu.set_locked_clocks(300, 1500).unwrap_err();
    assert!(
        matches!(
            e,
            SimError::OutOfRange {
                value: 300.0,
                min: 345.0,
                max: 1980.0,
                ..
            }
        ),
        "{e:?}"
    );
    let e = gpu.set_locked_clocks(1000, 2100).unwrap_err();
    assert!(
        matches!(
            e,
            SimError::OutOfRange {
                value: 2100.0,
                min: 345.0,
                max: 1980.0,
                ..
            }
        ),
        "{e:?}"
    );
    let e = gpu.set_locked_clocks(1500, 1000).unwrap_err();
    assert!(
        matches!(
            e,
            SimError::OutOfRange {
                value: 1500.0,
                min: 345.0,
                max: 1000.0,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("345 to 1000"), "{e}");
    assert_eq!(gpu.reading().locked_clocks_mhz, None);
}

#[test]
fn temperature_settles_at_ambient_plus_r_times_p() {
    let mut gpu = busy_gpu("h100", "gpt-1.3b", 16);
    let tau = gpu.spec().thermal_tau_s;
    run(&mut gpu, 10.0 * tau, 25.0);
    let expected = gpu.steady_temperature_c(25.0);
    let r = gpu.reading();
    assert!(
        (r.temperature_c - expected).abs() < 0.5,
        "{} vs {expected}",
        r.temperature_c
    );
    assert!((expected - (25.0 + 0.065 * gpu.steady_power_w())).abs() < 1e-9);
    assert!(
        (60.0..75.0).contains(&r.temperature_c),
        "{}",
        r.temperature_c
    );
    assert_eq!(r.throttle_reasons & throttle::HW_THERMAL_SLOWDOWN, 0);

    // After one tau the first-order response has covered 1 − 1/e of the way.
    let mut fresh = busy_gpu("h100", "gpt-1.3b", 16);
    run(&mut fresh, tau, 25.0);
    let frac = (fresh.reading().temperature_c - 25.0) / (expected - 25.0);
    assert!((frac - 0.632).abs() < 0.02, "{frac}");

    // And it cools back to ambient when the job ends.
    gpu.set_training(None);
    run(&mut gpu, 10.0 * tau, 25.0);
    assert!((gpu.reading().temperature_c - (25.0 + 0.065 * 70.0)).abs() < 0.5);
}

#[test]
fn fan_follows_temperature() {
    let mut gpu = busy_gpu("4090", "resnet50", 256);
    let cold = gpu.reading().fan_pct.unwrap();
    run(&mut gpu, 300.0, 25.0);
    let hot = gpu.reading().fan_pct.unwrap();
    assert_eq!(cold, 30.0);
    assert!(hot > 60.0 && hot < 100.0, "{hot}");
}

#[test]
fn thermal_slowdown_engages_at_high_ambient() {
    let mut gpu = busy_gpu("h100", "gpt-1.3b", 16);
    assert!(gpu.steady_temperature_c(45.0) > gpu.spec().slowdown_c);
    let bits = throttle::HW_THERMAL_SLOWDOWN | throttle::HW_SLOWDOWN;
    let (mut slowed_steps, mut episodes, mut was_slowed) = (0, 0, false);
    let mut max_temp: f64 = 0.0;
    for _ in 0..6000 {
        gpu.step(DT, 45.0);
        let r = gpu.reading();
        max_temp = max_temp.max(r.temperature_c);
        let slowed = r.throttle_reasons & bits == bits;
        if slowed {
            slowed_steps += 1;
            assert!(r.sm_clock_mhz <= 990, "{}", r.sm_clock_mhz);
            assert!(r.power_w < 500.0, "{}", r.power_w);
        }
        episodes += usize::from(slowed && !was_slowed);
        was_slowed = slowed;
    }
    assert!((89.0..90.0).contains(&max_temp), "{max_temp}");
    // Hysteresis: each episode lasts until the GPU is 5 C cooler, then it heats up again for
    // about a minute, so it cycles a handful of times in 10 minutes rather than chattering.
    assert!((3..=12).contains(&episodes), "{episodes}");
    assert!(
        slowed_steps >= 5 * episodes,
        "{slowed_steps} steps in {episodes} episodes"
    );

    // The same job at 25 C never slows down.
    let mut cool = busy_gpu("h100", "gpt-1.3b", 16);
    for _ in 0..6000 {
        cool.step(DT, 25.0);
        assert_eq!(
            cool.reading().throttle_reasons & throttle::HW_THERMAL_SLOWDOWN,
            0
        );
    }
}

#[test]
fn energy_counter_integrates_power() {
    let mut gpu = busy_gpu("v100", "resnet50", 256);
    gpu.set_training(Some(job("resnet50", 256, 1, 3))); // data-bound: power varies step to step
    let mut joules = 0.0;
    let mut last = 0;
    for i in 0..3000 {
        if i == 1500 {
            gpu.set_power_limit_w(180.0).unwrap();
        }
        gpu.step(DT, 25.0);
        let r = gpu.reading();
        joules += r.power_w * DT;
        assert!(r.energy_mj >= last);
        last = r.energy_mj;
    }
    let counted = last as f64 / 1000.0;
    assert!(
        (counted - joules).abs() / joules < 0.01,
        "{counted} vs {joules}"
    );
    assert!(joules > 300.0 * 40.0, "{joules}");
}

#[test]
fn prefetch_reduces_data_wait_when_data_bound() {
    let mean_wait_and_util = |prefetch| {
        let mut gpu = Gpu::with_seed(spec("h100"), 25.0, 7);
        gpu.set_training(Some(job("resnet50", 256, prefetch, 4)));
        let (mut wait, mut util) = (0.0, 0.0);
        for _ in 0..200 {
            gpu.step(DT, 25.0);
            wait += gpu.training().unwrap().data_wait_s;
            util += gpu.reading().util_gpu_pct;
        }
        (wait / 200.0, util / 200.0)
    };
    let (w0, u0) = mean_wait_and_util(0);
    let (w1, u1) = mean_wait_and_util(1);
    let (w4, u4) = mean_wait_and_util(4);
    // 4 workers: 64 ms of loading per ~35 ms of compute.
    assert!(w0 > 0.064 && w0 < 0.09, "{w0}");
    assert!(w1 < 0.8 * w0 && w4 < w1, "{w0} {w1} {w4}");
    assert!(u0 < u1 && u1 < u4, "{u0} {u1} {u4}");
    assert!(
        u0 < 40.0 && u4 < 60.0,
        "data-bound stays data-bound: {u0} {u4}"
    );

    // Compute-bound with enough workers: util near 100%.
    let mut gpu = busy_gpu("a100", "resnet50", 256);
    run(&mut gpu, 5.0, 25.0);
    assert!(
        gpu.reading().util_gpu_pct > 95.0,
        "{}",
        gpu.reading().util_gpu_pct
    );
}

#[test]
fn too_large_batch_runs_out_of_memory() {
    let mut gpu = busy_gpu("h100", "resnet50", 4096);
    run(&mut gpu, 1.0, 25.0);
    let t = gpu.training().unwrap();
    assert!(t.oom);
    assert_eq!(t.samples_seen, 0.0);
    assert_eq!(t.samples_per_s, 0.0);
    let r = gpu.reading();
    assert_eq!(r.util_gpu_pct, 0.0);
    assert_eq!(
        r.memory_used_bytes,
        find_model("resnet50").unwrap().static_memory_bytes
    );
    assert_eq!(r.power_w, 70.0);
    assert_ne!(r.throttle_reasons & throttle::GPU_IDLE, 0);

    let mut fits = busy_gpu("h100", "resnet50", 1024);
    run(&mut fits, 1.0, 25.0);
    assert!(!fits.training().unwrap().oom);
    assert_eq!(
        fits.reading().memory_used_bytes,
        (3 << 29) + 1024 * (48 << 20)
    );

    let mut small = busy_gpu("4090", "gpt-1.3b", 1);
    run(&mut small, 0.1, 25.0);
    assert!(small.training().unwrap().oom);
}

#[test]
fn training_progresses_and_loss_falls() {
    let mut gpu = busy_gpu("h100", "resnet50", 256);
    run(&mut gpu, 1.0, 25.0);
    let early = gpu.training().unwrap().clone();
    run(&mut gpu, 599.0, 25.0);
    let late = gpu.training().unwrap().clone();
    // 7240 samples/s for 600 s = 4.3M samples, 1.45 half-lives: loss gap × 0.37.
    assert!((late.samples_seen / 600.0 - late.samples_per_s).abs() / late.samples_per_s < 0.02);
    assert_eq!(late.step, (late.samples_seen / 256.0).floor() as u64);
    assert!(early.loss > 6.8, "{}", early.loss);
    assert!(late.loss < 3.6 && late.loss > 3.1, "{}", late.loss);
    // PCIe rx carries the input images: samples/s × 150528 B.
    let r = gpu.reading();
    let expected = late.samples_per_s * 150_528.0 / 1024.0;
    assert!(
        (r.pcie_rx_kbps as f64 - expected).abs() < 100.0,
        "{} vs {expected}",
        r.pcie_rx_kbps
    );
    assert!(r.pcie_tx_kbps < r.pcie_rx_kbps / 10);
}

#[test]
fn steady_helpers_do_not_change_state() {
    let gpu = busy_gpu("h200", "bert-large", 64);
    let before = gpu.clone();
    assert_eq!(gpu.steady_clock_mhz(), 1980);
    assert!(gpu.steady_power_w() > 600.0);
    assert_eq!(gpu, before);
    assert_eq!(Gpu::new(spec("h200"), 25.0).steady_power_w(), 75.0);
}

#[test]
fn every_settable_cap_is_met_even_below_the_lowest_clock() {
    for spec in gpusim::CATALOG {
        for model in gpusim::MODELS {
            if !model.fits(spec, 1) {
                continue;
            }
            let mut gpu = Gpu::new(spec, 25.0);
            gpu.set_training(Some(job(model.id, 1, 4, 16)));
            gpu.set_power_limit_w(spec.power_min_w).unwrap();
            run(&mut gpu, 1.0, 25.0);
            let r = gpu.reading();
            assert!(
                r.power_w <= spec.power_min_w + 1e-9,
                "{} {}: {}",
                spec.id,
                model.id,
                r.power_w
            );
            assert_ne!(r.throttle_reasons & throttle::SW_POWER_CAP, 0);
            assert!(gpu.training().unwrap().samples_per_s > 0.0);
        }
    }
    // The A100 at 100 W cannot get there by clock alone: it sits at 210 MHz and gates the clock.
    let mut gpu = busy_gpu("a100", "gpt-1.3b", 8);
    gpu.set_power_limit_w(100.0).unwrap();
    run(&mut gpu, 1.0, 25.0);
    let r = gpu.reading();
    assert_eq!(r.sm_clock_mhz, 210);
    assert!((r.power_w - 100.0).abs() < 1e-9, "{}", r.power_w);
}
