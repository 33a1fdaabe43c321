//! `nvmlDeviceGetFieldValues` with a scope id per entry.
//!
//! NVML serves per-link NVLink counters (`NVML_FI_DEV_NVLINK_THROUGHPUT_*`, link state and
//! version) as field values whose `scopeId` names the link; nvml-wrapper 0.13's
//! `Device::field_values_for` zeroes `scopeId`, so it can read link 0 only. This crate is the
//! one call that sets it, through the library nvml-wrapper already loaded. It exists so that
//! the console crate can keep `#![forbid(unsafe_code)]`: the only `unsafe` here is that call
//! and the union read of its answer.

#![deny(clippy::unwrap_used, clippy::panic)]

use nvml_wrapper::Device;
use nvml_wrapper::error::{NvmlError, nvml_try};
use nvml_wrapper_sys::bindings::nvmlFieldValue_t;

/// One field to read: `field` an `NVML_FI_*` id, `scope` the link (or `u32::MAX`: all links).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scoped {
    pub field: u32,
    pub scope: u32,
}

/// One field's answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    /// The value as a float; absent when that field answered an error (NOT_SUPPORTED is the
    /// usual: a part without NVLink, a link that does not exist).
    pub value: Option<f64>,
    /// When the driver read it, microseconds since the Unix epoch: rates divide by these.
    pub timestamp_us: i64,
}

/// Reads `fields` of `device` in one `nvmlDeviceGetFieldValues` call. The outer error is the
/// call's (a missing symbol, a lost GPU); each entry carries its own.
pub fn read(device: &Device<'_>, fields: &[Scoped]) -> Result<Vec<Reading>, NvmlError> {
    let sym = device
        .nvml()
        .lib()
        .nvmlDeviceGetFieldValues
        .as_ref()
        .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    let count = i32::try_from(fields.len()).map_err(|_| NvmlError::InvalidArg)?;
    let mut raw: Vec<nvmlFieldValue_t> = fields
        .iter()
        .map(|f| {
            // SAFETY: nvmlFieldValue_t is plain C data (integers and a union of numbers), for
            // which all-zero bytes are a valid value.
            let mut v: nvmlFieldValue_t = unsafe { std::mem::zeroed() };
            v.fieldId = f.field;
            v.scopeId = f.scope;
            v
        })
        .collect();
    // SAFETY: `handle()` is a live device handle of the library `sym` came from; `raw` holds
    // `count` initialised entries, which NVML fills in place and does not keep.
    nvml_try(unsafe { sym(device.handle(), count, raw.as_mut_ptr()) })?;
    Ok(raw
        .iter()
        .map(|v| Reading {
            value: nvml_try(v.nvmlReturn).ok().map(|()| number(v)),
            timestamp_us: v.timestamp,
        })
        .collect())
}

/// The entry's value as a float, by its `valueType` (nvml.h's `nvmlValueType_t`: double,
/// unsigned int, unsigned long, unsigned long long, signed long long, signed int, unsigned short).
fn number(v: &nvmlFieldValue_t) -> f64 {
    // SAFETY: NVML wrote the member `valueType` names; every member is plain data, so even a
    // wrong type would read as a number, not undefined behaviour.
    unsafe {
        match v.valueType {
            0 => v.value.dVal,
            1 => f64::from(v.value.uiVal),
            2 => v.value.ulVal as f64,
            3 => v.value.ullVal as f64,
            4 => v.value.sllVal as f64,
            5 => f64::from(v.value.siVal),
            6 => f64::from(v.value.usVal),
            _ => v.value.ullVal as f64,
        }
    }
}
