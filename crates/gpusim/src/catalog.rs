//! The GPU catalog: fixed figures of real parts, looked up by id, NVML name or a loose alias.
//!
//! Only data lives here; the physics that uses it is in `power.rs` and `gpu.rs`. Figures marked
//! "datasheet" come from NVIDIA product briefs, "nvidia-smi" from `nvidia-smi -q` output of the
//! part (memory total as `FB Memory Usage / Total`, power limits as `Min/Default/Max Power Limit`,
//! clocks as `Max Clocks`/`Supported Clocks`, temperatures as `GPU Slowdown/Shutdown/Max Operating
//! Temp`), and "est." are this model's estimates where no public figure is known to us. The power
//! shape (`load_static_w`, `memory_power_w`, `voltage_knee_mhz`, `voltage_max_ratio`) and the
//! thermal path (`thermal_resistance_c_per_w`, `thermal_tau_s`) are model calibration, not vendor
//! figures: they are chosen so that the behaviour described in the crate doc holds.

use serde::Serialize;

const MIB: u64 = 1024 * 1024;

/// One GPU model's fixed figures. Units are in the field names.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuSpec {
    /// Short id used on command lines, e.g. "h100-sxm".
    pub id: &'static str,
    /// What NVML reports as the device name.
    pub name: &'static str,
    pub architecture: &'static str,
    pub compute_capability: (u32, u32),
    /// Framebuffer total as NVML reports it (slightly below the marketing figure on some parts).
    pub memory_bytes: u64,
    /// Settable power-limit range and the default limit, watts.
    pub power_min_w: f64,
    pub power_default_w: f64,
    pub power_max_w: f64,
    /// Board power with no work, persistence on, idle clocks, watts.
    pub idle_w: f64,
    /// Lowest supported, base and highest (boost) SM clock, MHz.
    pub sm_clock_min_mhz: u32,
    pub sm_clock_base_mhz: u32,
    pub sm_clock_max_mhz: u32,
    /// Memory clock as NVML reports it, MHz (held constant by the model).
    pub mem_clock_mhz: u32,
    /// Temperature thresholds, Celsius. The model enforces `slowdown_c`; the others are reported.
    pub slowdown_c: f64,
    pub shutdown_c: f64,
    pub gpu_max_operating_c: f64,
    /// Steady-state rise above ambient per watt of board power, C/W (heatsink + airflow).
    pub thermal_resistance_c_per_w: f64,
    /// Time constant of the first-order thermal response, seconds.
    pub thermal_tau_s: f64,
    /// SXM parts have no fan of their own (fan speed absent in NVML).
    pub has_fan: bool,
    pub pcie_gen: u32,
    pub pcie_width: u32,
    /// Dense FP16 tensor throughput (FP32 accumulate), TFLOPS.
    pub fp16_tflops: f64,
    /// Memory bandwidth, GB/s.
    pub mem_bandwidth_gbs: f64,
    /// Clock-independent power drawn while busy on top of `idle_w` (leakage at operating
    /// voltage and temperature, fabric), watts at 100% utilization.
    pub load_static_w: f64,
    /// Memory and I/O power at full throughput (max clock, 100% util), watts; scales with the rate
    /// at which work proceeds, so its energy per sample does not depend on the clock.
    pub memory_power_w: f64,
    /// Top of the voltage floor: below this SM clock the core voltage stays at its minimum, MHz.
    pub voltage_knee_mhz: u32,
    /// Core voltage at `sm_clock_max_mhz` relative to the floor voltage (dimensionless, > 1).
    pub voltage_max_ratio: f64,
}

/// Every GPU the simulator knows.
pub const CATALOG: &[GpuSpec] = &[
    GpuSpec {
        id: "h100-sxm",
        name: "NVIDIA H100 80GB HBM3",
        architecture: "Hopper",
        compute_capability: (9, 0),
        memory_bytes: 81_559 * MIB, // nvidia-smi
        power_min_w: 200.0,         // nvidia-smi
        power_default_w: 700.0,     // nvidia-smi, datasheet TDP
        power_max_w: 700.0,         // nvidia-smi
        idle_w: 70.0,               // est. (nvidia-smi idle readings 60-75 W)
        sm_clock_min_mhz: 345,      // nvidia-smi supported clocks
        sm_clock_base_mhz: 1590,    // datasheet
        sm_clock_max_mhz: 1980,     // datasheet boost
        mem_clock_mhz: 2619,        // nvidia-smi
        slowdown_c: 89.0,           // nvidia-smi (recalled; varies with VBIOS)
        shutdown_c: 92.0,           // nvidia-smi (recalled)
        gpu_max_operating_c: 87.0,  // nvidia-smi (recalled)
        thermal_resistance_c_per_w: 0.065,
        thermal_tau_s: 40.0,
        has_fan: false,
        pcie_gen: 5,
        pcie_width: 16,
        fp16_tflops: 989.4,        // datasheet, dense
        mem_bandwidth_gbs: 3352.0, // datasheet
        load_static_w: 35.0,
        memory_power_w: 140.0,
        voltage_knee_mhz: 1425,
        voltage_max_ratio: 1.25,
    },
    GpuSpec {
        id: "h200",
        name: "NVIDIA H200",
        architecture: "Hopper",
        compute_capability: (9, 0),
        memory_bytes: 143_771 * MIB, // nvidia-smi
        power_min_w: 200.0,          // est. (same board power range as H100 SXM)
        power_default_w: 700.0,      // datasheet (SXM TDP)
        power_max_w: 700.0,          // datasheet
        idle_w: 75.0,                // est.
        sm_clock_min_mhz: 345,       // est. (same die as H100)
        sm_clock_base_mhz: 1590,     // est.
        sm_clock_max_mhz: 1980,      // nvidia-smi
        mem_clock_mhz: 3201,         // nvidia-smi
        slowdown_c: 89.0,            // est. (as H100)
        shutdown_c: 92.0,            // est.
        gpu_max_operating_c: 87.0,   // est.
        thermal_resistance_c_per_w: 0.065,
        thermal_tau_s: 45.0,
        has_fan: false,
        pcie_gen: 5,
        pcie_width: 16,
        fp16_tflops: 989.4,        // datasheet, dense
        mem_bandwidth_gbs: 4800.0, // datasheet
        load_static_w: 35.0,
        memory_power_w: 150.0, // more HBM stacks than H100
        voltage_knee_mhz: 1425,
        voltage_max_ratio: 1.25,
    },
    GpuSpec {
        id: "a100-sxm-80gb",
        name: "NVIDIA A100-SXM4-80GB",
        architecture: "Ampere",
        compute_capability: (8, 0),
        memory_bytes: 81_920 * MIB, // nvidia-smi
        power_min_w: 100.0,         // nvidia-smi
        power_default_w: 400.0,     // nvidia-smi, datasheet TDP
        power_max_w: 400.0,         // nvidia-smi
        idle_w: 55.0,               // est. (nvidia-smi idle readings 50-65 W)
        sm_clock_min_mhz: 210,      // nvidia-smi supported clocks
        sm_clock_base_mhz: 1275,    // datasheet
        sm_clock_max_mhz: 1410,     // datasheet boost
        mem_clock_mhz: 1593,        // nvidia-smi
        slowdown_c: 89.0,           // nvidia-smi (recalled)
        shutdown_c: 92.0,           // nvidia-smi (recalled)
        gpu_max_operating_c: 85.0,  // nvidia-smi (recalled)
        thermal_resistance_c_per_w: 0.115,
        thermal_tau_s: 35.0,
        has_fan: false,
        pcie_gen: 4,
        pcie_width: 16,
        fp16_tflops: 312.0,        // datasheet, dense
        mem_bandwidth_gbs: 2039.0, // datasheet
        load_static_w: 20.0,
        memory_power_w: 80.0,
        voltage_knee_mhz: 1020,
        voltage_max_ratio: 1.25,
    },
    GpuSpec {
        id: "v100-sxm2",
        name: "Tesla V100-SXM2-32GB",
        architecture: "Volta",
        compute_capability: (7, 0),
        memory_bytes: 32_768 * MIB, // nvidia-smi (newer drivers report ~32510 MiB usable)
        power_min_w: 150.0,         // nvidia-smi
        power_default_w: 300.0,     // nvidia-smi, datasheet TDP
        power_max_w: 300.0,         // nvidia-smi
        idle_w: 40.0,               // est. (nvidia-smi idle readings 35-45 W)
        sm_clock_min_mhz: 135,      // nvidia-smi supported clocks
        sm_clock_base_mhz: 1290,    // datasheet
        sm_clock_max_mhz: 1530,     // datasheet boost
        mem_clock_mhz: 877,         // nvidia-smi
        slowdown_c: 87.0,           // nvidia-smi (recalled)
        shutdown_c: 90.0,           // nvidia-smi (recalled)
        gpu_max_operating_c: 83.0,  // nvidia-smi (recalled)
        thermal_resistance_c_per_w: 0.15,
        thermal_tau_s: 30.0,
        has_fan: false,
        pcie_gen: 3,
        pcie_width: 16,
        fp16_tflops: 125.0,       // datasheet (tensor)
        mem_bandwidth_gbs: 900.0, // datasheet
        load_static_w: 15.0,
        memory_power_w: 60.0,
        voltage_knee_mhz: 1095,
        voltage_max_ratio: 1.25,
    },
    GpuSpec {
        id: "rtx-4090",
        name: "NVIDIA GeForce RTX 4090",
        architecture: "Ada Lovelace",
        compute_capability: (8, 9),
        memory_bytes: 24_564 * MIB, // nvidia-smi
        power_min_w: 150.0,         // nvidia-smi (board dependent)
        power_default_w: 450.0,     // nvidia-smi, datasheet TGP
        power_max_w: 600.0,         // nvidia-smi (board dependent)
        idle_w: 25.0,               // est. (nvidia-smi idle readings 15-35 W)
        sm_clock_min_mhz: 210,      // nvidia-smi supported clocks
        sm_clock_base_mhz: 2235,    // datasheet
        sm_clock_max_mhz: 2520,     // datasheet boost
        mem_clock_mhz: 10_501,      // nvidia-smi
        slowdown_c: 92.0,           // est.
        shutdown_c: 95.0,           // est.
        gpu_max_operating_c: 90.0,  // datasheet "maximum GPU temperature"
        thermal_resistance_c_per_w: 0.105,
        thermal_tau_s: 30.0,
        has_fan: true,
        pcie_gen: 4,
        pcie_width: 16,
        fp16_tflops: 165.2,        // datasheet, dense, FP32 accumulate
        mem_bandwidth_gbs: 1008.0, // datasheet
        load_static_w: 60.0,
        memory_power_w: 80.0, // GDDR6X is power hungry
        voltage_knee_mhz: 2100,
        voltage_max_ratio: 1.25,
    },
    // The three below are here for the measured power-limit curves of Zeus (NSDI '23), whose
    // limits they must cover: their power-limit ranges are those of the traces (100 W up to
    // the default limit).
    GpuSpec {
        id: "rtx-6000",
        name: "Quadro RTX 6000",
        architecture: "Turing",
        compute_capability: (7, 5),
        memory_bytes: 24_576 * MIB, // datasheet
        power_min_w: 100.0,         // nvidia-smi (the traces' lowest limit)
        power_default_w: 260.0,     // datasheet (blower board)
        power_max_w: 260.0,         // nvidia-smi
        idle_w: 20.0,               // est.
        sm_clock_min_mhz: 300,      // nvidia-smi supported clocks
        sm_clock_base_mhz: 1440,    // datasheet
        sm_clock_max_mhz: 1770,     // datasheet boost
        mem_clock_mhz: 7001,        // nvidia-smi
        slowdown_c: 89.0,           // est.
        shutdown_c: 94.0,           // est.
        gpu_max_operating_c: 87.0,  // est.
        thermal_resistance_c_per_w: 0.2,
        thermal_tau_s: 20.0,
        has_fan: true,
        pcie_gen: 3,
        pcie_width: 16,
        fp16_tflops: 130.5,       // datasheet (tensor)
        mem_bandwidth_gbs: 672.0, // datasheet
        load_static_w: 50.0,
        memory_power_w: 40.0,
        voltage_knee_mhz: 1200,
        voltage_max_ratio: 1.2,
    },
    GpuSpec {
        id: "a40",
        name: "NVIDIA A40",
        architecture: "Ampere",
        compute_capability: (8, 6),
        memory_bytes: 46_068 * MIB, // nvidia-smi (recalled)
        power_min_w: 100.0,         // nvidia-smi (the traces' lowest limit)
        power_default_w: 300.0,     // datasheet
        power_max_w: 300.0,         // nvidia-smi
        idle_w: 30.0,               // est.
        sm_clock_min_mhz: 210,      // nvidia-smi supported clocks
        sm_clock_base_mhz: 1305,    // datasheet
        sm_clock_max_mhz: 1740,     // datasheet boost
        mem_clock_mhz: 7251,        // nvidia-smi
        slowdown_c: 88.0,           // est.
        shutdown_c: 93.0,           // est.
        gpu_max_operating_c: 85.0,  // est.
        thermal_resistance_c_per_w: 0.17,
        thermal_tau_s: 30.0,
        has_fan: false,
        pcie_gen: 4,
        pcie_width: 16,
        fp16_tflops: 149.7,       // datasheet (tensor)
        mem_bandwidth_gbs: 696.0, // datasheet
        load_static_w: 35.0,
        memory_power_w: 50.0,
        voltage_knee_mhz: 1100,
        voltage_max_ratio: 1.22,
    },
    GpuSpec {
        id: "v100-pcie",
        name: "Tesla V100-PCIE-32GB",
        architecture: "Volta",
        compute_capability: (7, 0),
        memory_bytes: 32_768 * MIB, // datasheet
        power_min_w: 100.0,         // nvidia-smi (the traces' lowest limit)
        power_default_w: 250.0,     // datasheet
        power_max_w: 250.0,         // nvidia-smi
        idle_w: 30.0,               // est.
        sm_clock_min_mhz: 135,      // nvidia-smi supported clocks
        sm_clock_base_mhz: 1230,    // datasheet
        sm_clock_max_mhz: 1380,     // datasheet boost
        mem_clock_mhz: 877,         // nvidia-smi
        slowdown_c: 87.0,           // nvidia-smi (recalled)
        shutdown_c: 90.0,           // nvidia-smi (recalled)
        gpu_max_operating_c: 83.0,  // nvidia-smi (recalled)
        thermal_resistance_c_per_w: 0.17,
        thermal_tau_s: 30.0,
        has_fan: false,
        pcie_gen: 3,
        pcie_width: 16,
        fp16_tflops: 112.0,       // datasheet (tensor)
        mem_bandwidth_gbs: 900.0, // datasheet
        load_static_w: 15.0,
        memory_power_w: 50.0,
        voltage_knee_mhz: 1000,
        voltage_max_ratio: 1.25,
    },
];

/// Loose names people type, mapped to catalog ids. Compared after [`normalize`].
const ALIASES: &[(&str, &str)] = &[
    ("h100", "h100-sxm"),
    ("h100sxm5", "h100-sxm"),
    ("h10080gb", "h100-sxm"),
    ("h200sxm", "h200"),
    ("h200141gb", "h200"),
    ("a100", "a100-sxm-80gb"),
    ("a100sxm", "a100-sxm-80gb"),
    ("a10080gb", "a100-sxm-80gb"),
    ("a100sxm480gb", "a100-sxm-80gb"),
    ("v100", "v100-sxm2"),
    ("v100sxm232gb", "v100-sxm2"),
    ("teslav100", "v100-sxm2"),
    ("rtx6000", "rtx-6000"),
    ("quadrortx6000", "rtx-6000"),
    ("v100pcie", "v100-pcie"),
    ("v100pcie32gb", "v100-pcie"),
    ("4090", "rtx-4090"),
    ("rtx4090", "rtx-4090"),
    ("geforcertx4090", "rtx-4090"),
];

/// Lowercase and drop separators, so "H100 SXM", "h100-sxm" and "h100_sxm" compare equal.
fn normalize(s: &str) -> String {
    s.chars()
        .filter(|c| !matches!(c, ' ' | '-' | '_' | '.'))
        .flat_map(char::to_lowercase)
        .collect()
}

/// Look a GPU up by id, NVML name or loose alias ("h100", "a100", "v100", "4090"), ignoring case,
/// spaces, dashes and a leading "NVIDIA".
pub fn find(id_or_name: &str) -> Option<&'static GpuSpec> {
    let q = normalize(id_or_name);
    let q = q.strip_prefix("nvidia").unwrap_or(&q).to_string();
    if q.is_empty() {
        return None;
    }
    let by_id = |id: &str| CATALOG.iter().find(|s| s.id == id);
    CATALOG
        .iter()
        .find(|s| {
            let name = normalize(s.name);
            normalize(s.id) == q || name.strip_prefix("nvidia").unwrap_or(&name) == q
        })
        .or_else(|| {
            ALIASES
                .iter()
                .find(|(alias, _)| *alias == q)
                .and_then(|(_, id)| by_id(id))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_accepts_ids_names_and_aliases() {
        for (query, id) in [
            ("h100-sxm", "h100-sxm"),
            ("H100", "h100-sxm"),
            ("NVIDIA H100 80GB HBM3", "h100-sxm"),
            ("h100 sxm", "h100-sxm"),
            ("H200", "h200"),
            ("a100", "a100-sxm-80gb"),
            ("NVIDIA A100-SXM4-80GB", "a100-sxm-80gb"),
            ("V100", "v100-sxm2"),
            ("Tesla V100-SXM2-32GB", "v100-sxm2"),
            ("4090", "rtx-4090"),
            ("RTX 4090", "rtx-4090"),
            ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ] {
            assert_eq!(find(query).map(|s| s.id), Some(id), "query {query:?}");
        }
        assert!(find("").is_none());
        assert!(find("nvidia").is_none());
        assert!(find("b200").is_none());
    }

    #[test]
    fn catalog_figures_are_consistent() {
        let mut ids: Vec<_> = CATALOG.iter().map(|s| s.id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), CATALOG.len(), "duplicate ids");
        for s in CATALOG {
            assert!(s.power_min_w < s.power_default_w && s.power_default_w <= s.power_max_w);
            assert!(s.idle_w < s.power_min_w, "{}", s.id);
            assert!(s.sm_clock_min_mhz < s.voltage_knee_mhz);
            assert!(s.voltage_knee_mhz < s.sm_clock_max_mhz);
            assert!(s.sm_clock_base_mhz <= s.sm_clock_max_mhz);
            assert!(s.gpu_max_operating_c <= s.slowdown_c && s.slowdown_c < s.shutdown_c);
            assert!(s.voltage_max_ratio > 1.0);
            // The model steps clocks on a 15 MHz grid from the minimum; the max must sit on it.
            assert_eq!(
                (s.sm_clock_max_mhz - s.sm_clock_min_mhz) % 15,
                0,
                "{}",
                s.id
            );
            assert_eq!(find(s.id), Some(s));
            assert_eq!(find(s.name), Some(s));
        }
        assert_eq!(find("h100").unwrap().memory_bytes, 85_520_809_984);
    }
}
