//! Fixed facts about each simulated board that gpusim does not model: UUID, serial, PCI
//! address and ids, core counts, BAR1 size. Derived from the scenario seed, the GPU index and
//! the catalog entry, so every process (and every run with the same seed) agrees on them.

use gpusim::GpuSpec;

use crate::ffi;

/// Identity of one simulated GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct Identity {
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub uuid: String,
    /// 13 digits, like a real board serial.
    pub serial: String,
    pub pci_domain: u32,
    pub pci_bus: u32,
    /// `pciDeviceId`: device id in the high 16 bits, vendor 0x10DE in the low 16.
    pub pci_device_id: u32,
    pub pci_subsystem_id: u32,
    pub minor: u32,
}

/// PCI buses of the eight GPUs on an HGX H100 board, in index order.
const HGX_BUSES: [u32; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];

/// splitmix64: a tiny, well-mixed hash step (Steele et al.).
fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Identity {
    pub fn new(seed: u64, index: usize, spec: &GpuSpec) -> Identity {
        let a = splitmix64(seed ^ 0x6670_6e76_6d6c_0000 ^ index as u64);
        let b = splitmix64(a);
        let uuid = format!(
            "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xffff,
            b >> 48,
            b & 0xffff_ffff_ffff
        );
        let serial = format!("165{:010}", splitmix64(b) % 10_000_000_000);
        Identity {
            uuid,
            serial,
            pci_domain: (index / HGX_BUSES.len()) as u32,
            pci_bus: HGX_BUSES[index % HGX_BUSES.len()],
            pci_device_id: (device_id(spec) << 16) | 0x10de,
            pci_subsystem_id: (0x16c1 << 16) | 0x10de,
            minor: index as u32,
        }
    }

    /// `00000000:18:00.0`: the form NVML's `busId` uses.
    pub fn bus_id(&self) -> String {
        format!("{:08X}:{:02X}:00.0", self.pci_domain, self.pci_bus)
    }

    /// `0000:18:00.0`: the legacy 16-byte form.
    pub fn bus_id_legacy(&self) -> String {
        format!("{:04X}:{:02X}:00.0", self.pci_domain, self.pci_bus)
    }
}

/// Parses the bus-id forms NVML accepts (`[domain:]bus:device[.function]`, hex, any case)
/// into (domain, bus, device).
pub fn parse_bus_id(s: &str) -> Option<(u32, u32, u32)> {
    let s = s.trim();
    let (addr, _function) = s.split_once('.').unwrap_or((s, "0"));
    let parts: Vec<&str> = addr.split(':').collect();
    let hex = |p: &str| u32::from_str_radix(p, 16).ok();
    match parts.as_slice() {
        [domain, bus, device] => Some((hex(domain)?, hex(bus)?, hex(device)?)),
        [bus, device] => Some((0, hex(bus)?, hex(device)?)),
        _ => None,
    }
}

/// PCI device id of the catalog's parts (the real ones); a plausible one otherwise.
fn device_id(spec: &GpuSpec) -> u32 {
    match spec.id {
        "h100-sxm" => 0x2330,
        "h100-pcie" => 0x2331,
        "h200" => 0x2335,
        "a100-sxm-80gb" => 0x20b2,
        "a100-sxm-40gb" | "a100-sxm" => 0x20b0,
        "a100-pcie" => 0x20f1,
        "v100-sxm2" => 0x1db1,
        "rtx-4090" => 0x2684,
        "l40s" => 0x26b9,
        _ => 0x2300 | (crate::scenario::fnv1a(spec.id.as_bytes()) & 0xff) as u32,
    }
}

/// `nvmlDeviceArchitecture_t` of a catalog architecture name.
pub fn architecture(spec: &GpuSpec) -> u32 {
    match spec.architecture.to_ascii_lowercase().as_str() {
        "volta" => ffi::NVML_DEVICE_ARCH_VOLTA,
        "turing" => ffi::NVML_DEVICE_ARCH_TURING,
        "ampere" => ffi::NVML_DEVICE_ARCH_AMPERE,
        "ada" | "ada lovelace" => ffi::NVML_DEVICE_ARCH_ADA,
        "hopper" => ffi::NVML_DEVICE_ARCH_HOPPER,
        "blackwell" => ffi::NVML_DEVICE_ARCH_BLACKWELL,
        _ => ffi::NVML_DEVICE_ARCH_UNKNOWN,
    }
}

/// Whether the part is a data-centre board (SXM, no fan): ECC on, MIG where the architecture
/// has it, HBM memory temperature reported.
pub fn is_datacenter(spec: &GpuSpec) -> bool {
    !spec.has_fan
}

/// Whether the architecture offers MIG (A100, H100, H200, B200).
pub fn has_mig(spec: &GpuSpec) -> bool {
    is_datacenter(spec)
        && matches!(
            architecture(spec),
            ffi::NVML_DEVICE_ARCH_AMPERE
                | ffi::NVML_DEVICE_ARCH_HOPPER
                | ffi::NVML_DEVICE_ARCH_BLACKWELL
        )
}

/// CUDA cores: SMs × cores per SM of the real part.
pub fn cuda_cores(spec: &GpuSpec) -> u32 {
    match spec.id {
        "h100-sxm" | "h200" => 132 * 128,
        "h100-pcie" => 114 * 128,
        "a100-sxm-80gb" | "a100-sxm-40gb" | "a100-sxm" | "a100-pcie" => 108 * 64,
        "v100-sxm2" => 80 * 64,
        "rtx-4090" => 128 * 128,
        "l40s" => 142 * 128,
        _ => match architecture(spec) {
            ffi::NVML_DEVICE_ARCH_HOPPER => 132 * 128,
            ffi::NVML_DEVICE_ARCH_AMPERE => 108 * 64,
            ffi::NVML_DEVICE_ARCH_VOLTA => 80 * 64,
            _ => 128 * 128,
        },
    }
}

/// BAR1 aperture: data-centre parts map all of memory (next power of two), consumer parts
/// 256 MiB.
pub fn bar1_bytes(spec: &GpuSpec) -> u64 {
    if is_datacenter(spec) {
        spec.memory_bytes.next_power_of_two()
    } else {
        256 << 20
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> &'static GpuSpec {
        gpusim::find("h100").expect("the catalog has an H100")
    }

    #[test]
    fn uuid_is_stable_unique_and_well_formed() {
        let a = Identity::new(0, 0, spec());
        assert_eq!(a, Identity::new(0, 0, spec()));
        assert_ne!(a.uuid, Identity::new(0, 1, spec()).uuid);
        assert_ne!(a.uuid, Identity::new(1, 0, spec()).uuid);
        let groups: Vec<usize> = a
            .uuid
            .trim_start_matches("GPU-")
            .split('-')
            .map(str::len)
            .collect();
        assert_eq!(groups, [8, 4, 4, 4, 12], "{}", a.uuid);
        assert_eq!(a.uuid.len(), 40);
        assert_eq!(a.serial.len(), 13);
    }

    #[test]
    fn bus_ids() {
        let id = Identity::new(0, 1, spec());
        assert_eq!(id.bus_id(), "00000000:2A:00.0");
        assert_eq!(id.bus_id_legacy(), "0000:2A:00.0");
        assert_eq!(parse_bus_id("00000000:2A:00.0"), Some((0, 0x2a, 0)));
        assert_eq!(parse_bus_id("0000:2a:00.0"), Some((0, 0x2a, 0)));
        assert_eq!(parse_bus_id("2a:00"), Some((0, 0x2a, 0)));
        assert_eq!(parse_bus_id("nonsense"), None);
        assert_eq!(Identity::new(0, 9, spec()).bus_id(), "00000001:2A:00.0");
    }
}
