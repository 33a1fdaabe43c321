//! The arithmetic of a measurement, apart from the GPU: how big the matrices and buffers are
//! for the memory that is free, how many FLOPs a GEMM is, the median of timed windows, what
//! the input holds. Pure, so each rule is tested here without a GPU.

use super::Precision;

/// The largest square matrix side tried: a 16384² BF16 GEMM is 8.8 TFLOP, about 10 ms on a
/// Hopper GPU's tensor cores and a few hundred ms in FP32 — long enough to keep the GPU busy,
/// short enough for many per timed window.
pub const MAX_SIDE: usize = 16384;

/// Matrix sides are multiples of this (cuBLAS's fastest tiles divide it).
pub const SIDE_STEP: usize = 256;

/// Side of the three square matrices of a GEMM, from the free memory: a quarter of it at most
/// (cuBLAS's workspace, the context, and whatever else runs there need the rest), a multiple
/// of 256 up to 16384. `None` when not even 256² fits.
pub fn gemm_side(free_bytes: u64, element_bytes: usize) -> Option<usize> {
    let budget = free_bytes / 4;
    let per_matrix = budget / (3 * element_bytes as u64);
    let side = (per_matrix as f64).sqrt().floor() as usize;
    let side = side.min(MAX_SIDE) / SIDE_STEP * SIDE_STEP;
    (side >= SIDE_STEP).then_some(side)
}

/// FLOPs of one n×n by n×n product: n² outputs, each n multiplies and n adds.
pub fn gemm_flops(n: usize) -> f64 {
    2.0 * (n as f64).powi(3)
}

/// The largest copy buffer: large enough that caches do not count, small enough to allocate
/// twice next to a training job's leftovers.
pub const MAX_COPY_BYTES: u64 = 4 << 30;

/// Smallest buffer worth timing: below this the L2 cache (50 MB on H100) holds it.
pub const MIN_COPY_BYTES: u64 = 256 << 20;

/// Size of each of the two copy buffers: a quarter of the free memory at most (both together
/// half), up to 4 GiB, a whole number of MiB. `None` below 256 MiB.
pub fn copy_bytes(free_bytes: u64) -> Option<u64> {
    let b = (free_bytes / 4).min(MAX_COPY_BYTES) >> 20 << 20;
    (b >= MIN_COPY_BYTES).then_some(b)
}

/// Bytes a device-to-device copy of `bytes` moves through memory: each byte is read once and
/// written once.
pub fn copy_traffic(bytes: u64) -> f64 {
    2.0 * bytes as f64
}

/// The memory's theoretical peak from the driver's memory clock (kHz) and bus width (bits):
/// two transfers per clock (double data rate) across the bus.
pub fn peak_bytes_per_s(clock_khz: i32, bus_bits: i32) -> f64 {
    2.0 * f64::from(clock_khz) * 1e3 * f64::from(bus_bits) / 8.0
}

/// The median of `values` (the mean of the middle two for an even count); `None` if empty.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    })
}

/// How many operations to queue between two waits so that one batch takes about `target_s`
/// (a wait per GEMM would leave the GPU idle between them); at least one.
pub fn batch_for(one_s: f64, target_s: f64) -> usize {
    if one_s.is_finite() && one_s > 0.0 {
        ((target_s / one_s).floor() as usize).clamp(1, 10_000)
    } else {
        1
    }
}

/// Timed windows of a measurement of `total_s` seconds: five, none shorter than 0.2 s.
pub fn windows(total_s: f64) -> (usize, f64) {
    let n = ((total_s / 0.2).floor() as usize).clamp(1, 5);
    (n, total_s / n as f64)
}

/// 32-bit words for the input matrices: one value per word in FP32, two per word in BF16 and
/// FP16. Values are in ±[1/32, 1) with random signs, so sums of products stay small (no
/// overflow in FP16) and are not zeros (zeros cost less power than real data).
pub fn seed_words(precision: Precision, count: usize) -> Vec<u32> {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        // xorshift64*: cheap, and any fixed sequence will do.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        (state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as u32
    };
    (0..count)
        .map(|_| {
            let r = next();
            match precision {
                // sign, exponent 122..=126 (2^-5 .. 2^-1), 23 mantissa bits.
                Precision::Fp32 => ((r & 1) << 31) | ((122 + (r >> 1) % 5) << 23) | (r >> 9),
                Precision::Bf16 => u32::from(bf16(r)) | (u32::from(bf16(r.rotate_left(16))) << 16),
                Precision::Fp16 => u32::from(fp16(r)) | (u32::from(fp16(r.rotate_left(16))) << 16),
            }
        })
        .collect()
}

/// A BF16 in ±[1/32, 1): sign, exponent 122..=126, 7 mantissa bits.
fn bf16(r: u32) -> u16 {
    (((r & 1) << 15) | ((122 + (r >> 1) % 5) << 7) | ((r >> 4) & 0x7f)) as u16
}

/// An FP16 in ±[1/32, 1): sign, exponent 10..=14 (bias 15), 10 mantissa bits.
fn fp16(r: u32) -> u16 {
    (((r & 1) << 15) | ((10 + (r >> 1) % 5) << 10) | ((r >> 4) & 0x3ff)) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn matrices_fit_a_quarter_of_free_memory_in_steps_of_256() {
        // 140 GiB free (an idle H200): capped at 16384 in every precision.
        assert_eq!(gemm_side(140 * GIB, 4), Some(16384));
        assert_eq!(gemm_side(140 * GIB, 2), Some(16384));
        // 2 GiB free, FP32: a quarter is 512 MiB, three matrices of 178,956,970 B: side
        // sqrt(44,739,242) = 6688.7 → 6656.
        assert_eq!(gemm_side(2 * GIB, 4), Some(6656));
        let n = gemm_side(2 * GIB, 4).unwrap() as u64;
        assert!(3 * n * n * 4 <= 2 * GIB / 4);
        // Too little for 256²×3 FP32 (768 KiB) in a quarter.
        assert_eq!(gemm_side((3 << 20) - 4, 4), None);
        assert_eq!(gemm_side(4 << 20, 2), Some(256));
    }

    #[test]
    fn a_gemm_counts_two_flops_per_multiply_add() {
        assert_eq!(gemm_flops(2), 16.0);
        assert_eq!(gemm_flops(16384), 2.0 * 16384f64.powi(3));
        // 8.8 TFLOP at the largest side.
        assert!((gemm_flops(MAX_SIDE) / 1e12 - 8.796).abs() < 0.001);
    }

    #[test]
    fn copy_buffers_are_a_quarter_of_free_memory_up_to_4_gib() {
        assert_eq!(copy_bytes(140 * GIB), Some(4 * GIB));
        assert_eq!(copy_bytes(8 * GIB), Some(2 * GIB));
        assert_eq!(copy_bytes((4 * GIB) + 12345), Some(GIB));
        assert_eq!(copy_bytes(GIB - 1), None);
        assert_eq!(copy_traffic(GIB), 2.0 * GIB as f64);
    }

    #[test]
    fn peak_is_double_data_rate_across_the_bus() {
        // 1593 MHz HBM2e over 5120 bits (A100 80GB): 2039 GB/s, its data-sheet figure.
        let p = peak_bytes_per_s(1_593_000, 5120);
        assert!((p / 1e9 - 2039.04).abs() < 0.01, "{p}");
    }

    #[test]
    fn median_of_windows() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0]), Some(3.0));
        assert_eq!(median(&[5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN, 2.0, 9.0, 1.0]), Some(2.0));
    }

    #[test]
    fn batches_and_windows() {
        assert_eq!(batch_for(0.01, 0.05), 5);
        assert_eq!(batch_for(0.2, 0.05), 1);
        assert_eq!(batch_for(0.0, 0.05), 1);
        assert_eq!(batch_for(1e-9, 0.05), 10_000);
        assert_eq!(windows(10.0), (5, 2.0));
        assert_eq!(windows(0.5), (2, 0.25));
        assert_eq!(windows(0.1), (1, 0.1));
    }

    #[test]
    fn seeds_are_small_nonzero_values_of_each_type() {
        let f = seed_words(Precision::Fp32, 1000);
        for w in &f {
            let v = f32::from_bits(*w).abs();
            assert!((1.0 / 32.0..1.0).contains(&v), "{v}");
        }
        assert!(f.iter().any(|w| w >> 31 == 1) && f.iter().any(|w| w >> 31 == 0));
        for w in seed_words(Precision::Bf16, 1000) {
            for half in [w & 0xffff, w >> 16] {
                // A BF16 is the top half of an f32.
                let v = f32::from_bits(half << 16).abs();
                assert!((1.0 / 32.0..1.0).contains(&v), "{v}");
            }
        }
        for w in seed_words(Precision::Fp16, 1000) {
            for half in [w & 0xffff, w >> 16] {
                let exp = (half >> 10) & 0x1f;
                assert!((10..=14).contains(&exp), "{half:#x}");
            }
        }
    }
}
