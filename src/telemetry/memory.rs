//! A GPU's memory health in words: rows remapped (A100 and later) or pages retired (before
//! A100), and what to do about it. One wording for the console's GPU detail and `status`.

use super::GpuSample;

/// What to do about a GPU's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryAdvice {
    /// A remap failed, or too many pages were retired: drain the GPU and replace it.
    Replace,
    /// A remap or a retirement waits for a reset: until then the bad memory stays in use.
    ResetPending,
}

impl MemoryAdvice {
    /// A few words, for a line that already names the GPU.
    pub fn words(self, remapping: bool) -> &'static str {
        match (self, remapping) {
            (MemoryAdvice::Replace, true) => "remap failed: replace",
            (MemoryAdvice::Replace, false) => "replace the GPU",
            (MemoryAdvice::ResetPending, _) => "reset pending",
        }
    }
}

/// A GPU's memory health worth saying.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryHealth {
    /// `3 + 1 rows remapped` or `3 sbe + 2 dbe pages retired`.
    pub what: String,
    /// Whether it is row remapping (else page retirement).
    pub remapping: bool,
    pub advice: Option<MemoryAdvice>,
}

/// None where the GPU reports neither remapping nor retirement, or its memory is spotless.
pub fn memory_health(g: &GpuSample) -> Option<MemoryHealth> {
    let (what, remapping, any, replace, pending) = if let Some(r) = g.remapped_rows {
        (
            format!("{} + {} rows remapped", r.correctable, r.uncorrectable),
            true,
            r.correctable + r.uncorrectable > 0,
            r.failure,
            r.pending,
        )
    } else {
        let p = g.retired_pages?;
        (
            format!("{} sbe + {} dbe pages retired", p.single_bit, p.double_bit),
            false,
            p.total() > 0,
            p.should_replace(),
            p.pending,
        )
    };
    let advice = if replace {
        Some(MemoryAdvice::Replace)
    } else if pending {
        Some(MemoryAdvice::ResetPending)
    } else {
        None
    };
    (any || advice.is_some()).then_some(MemoryHealth {
        what,
        remapping,
        advice,
    })
}
