//! Prints the simulator's calibration per GPU: full-load power and clock at the default cap,
//! settled temperature at 25 C, and the energy-optimal cap per model.
//!
//! `cargo run -p gpusim --example calibration`

use gpusim::{
    CATALOG, Gpu, MODELS, Training, TrainingConfig, energy_optimal_cap_w, energy_per_sample_at_cap,
};

fn main() {
    for spec in CATALOG {
        println!("{} ({}):", spec.id, spec.name);
        for model in MODELS {
            let Some(batch) = [256u32, 128, 64, 32, 16, 8, 4, 2, 1]
                .into_iter()
                .find(|&b| model.fits(spec, b))
            else {
                println!("  {:<10} does not fit", model.id);
                continue;
            };
            let mut gpu = Gpu::new(spec, 25.0);
            gpu.set_training(Some(
                Training::new(TrainingConfig {
                    model: model.id.into(),
                    batch_size: batch,
                    prefetch_depth: 4,
                    workers: 16,
                })
                .unwrap(),
            ));
            let (cap, j, s) = energy_optimal_cap_w(spec, model.id, batch).unwrap();
            let (j_def, s_def) =
                energy_per_sample_at_cap(spec, model.id, batch, spec.power_default_w).unwrap();
            println!(
                "  {:<10} b{:<3} default cap: {:>4} MHz {:>5.0} W settles {:>4.1} C ({:>4.1} C at 45 C) {:>7.1} samples/s | optimum cap {:>3.0} W ({:>2.0}% of max, {:>2.0}% of default) {:.0}% less energy, {:.0}% slower",
                model.id,
                batch,
                gpu.steady_clock_mhz(),
                gpu.steady_power_w(),
                gpu.steady_temperature_c(25.0),
                gpu.steady_temperature_c(45.0),
                1.0 / s_def,
                cap,
                100.0 * cap / spec.power_max_w,
                100.0 * cap / spec.power_default_w,
                100.0 * (1.0 - j / j_def),
                100.0 * (s / s_def - 1.0),
            );
        }
    }
}
