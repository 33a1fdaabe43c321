//! The names of every symbol the library exports, for validating scenario fault lists and for
//! the test that compares them with the built library's dynamic symbol table.

use crate::faults::strip_version;

/// Every exported NVML function, sorted.
pub const EXPORTED: &[&str] = &[
    "nvmlDeviceGetApplicationsClock",
    "nvmlDeviceGetArchitecture",
    "nvmlDeviceGetAttributes",
    "nvmlDeviceGetAttributes_v2",
    "nvmlDeviceGetBAR1MemoryInfo",
    "nvmlDeviceGetBoardId",
    "nvmlDeviceGetBrand",
    "nvmlDeviceGetBusType",
    "nvmlDeviceGetClock",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceGetComputeMode",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetCpuAffinity",
    "nvmlDeviceGetCpuAffinityWithinScope",
    "nvmlDeviceGetCudaComputeCapability",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetDecoderUtilization",
    "nvmlDeviceGetDefaultApplicationsClock",
    "nvmlDeviceGetDetailedEccErrors",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
    "nvmlDeviceGetDisplayActive",
    "nvmlDeviceGetDisplayMode",
    "nvmlDeviceGetDriverModel",
    "nvmlDeviceGetDriverModel_v2",
    "nvmlDeviceGetEccMode",
    "nvmlDeviceGetEncoderUtilization",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetFanSpeed",
    "nvmlDeviceGetFanSpeed_v2",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetGpuInstanceProfileInfo",
    "nvmlDeviceGetGpuMaxPcieLinkGeneration",
    "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses_v2",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetHandleByPciBusId",
    "nvmlDeviceGetHandleByPciBusId_v2",
    "nvmlDeviceGetHandleBySerial",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetMPSComputeRunningProcesses",
    "nvmlDeviceGetMPSComputeRunningProcesses_v2",
    "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    "nvmlDeviceGetMarginTemperature",
    "nvmlDeviceGetMaxClockInfo",
    "nvmlDeviceGetMaxCustomerBoostClock",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetMemoryAffinity",
    "nvmlDeviceGetMemoryErrorCounter",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetMultiGpuBoard",
    "nvmlDeviceGetName",
    "nvmlDeviceGetNumFans",
    "nvmlDeviceGetNumGpuCores",
    "nvmlDeviceGetNumaNodeId",
    "nvmlDeviceGetNvLinkRemoteDeviceType",
    "nvmlDeviceGetNvLinkRemotePciInfo_v2",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkVersion",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetPciInfo_v2",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetPcieLinkMaxSpeed",
    "nvmlDeviceGetPcieReplayCounter",
    "nvmlDeviceGetPcieSpeed",
    "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetPerformanceState",
    "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceGetPowerManagementDefaultLimit",
    "nvmlDeviceGetPowerManagementLimit",
    "nvmlDeviceGetPowerManagementLimitConstraints",
    "nvmlDeviceGetPowerManagementMode",
    "nvmlDeviceGetPowerState",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetProcessUtilization",
    "nvmlDeviceGetRetiredPages",
    "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetRetiredPages_v2",
    "nvmlDeviceGetRunningProcessDetailList",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetSupportedClocksEventReasons",
    "nvmlDeviceGetSupportedClocksThrottleReasons",
    "nvmlDeviceGetSupportedEventTypes",
    "nvmlDeviceGetSupportedGraphicsClocks",
    "nvmlDeviceGetSupportedMemoryClocks",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetTemperatureThreshold",
    "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetTopologyCommonAncestor",
    "nvmlDeviceGetTopologyNearestGpus",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetVbiosVersion",
    "nvmlDeviceIsMigDeviceHandle",
    "nvmlDeviceRegisterEvents",
    "nvmlDeviceResetApplicationsClocks",
    "nvmlDeviceResetGpuLockedClocks",
    "nvmlDeviceSetApplicationsClocks",
    "nvmlDeviceSetGpuLockedClocks",
    "nvmlDeviceSetPersistenceMode",
    "nvmlDeviceSetPowerManagementLimit",
    "nvmlDeviceSetTemperatureThreshold",
    "nvmlErrorString",
    "nvmlEventSetCreate",
    "nvmlEventSetFree",
    "nvmlEventSetWait",
    "nvmlEventSetWait_v2",
    "nvmlInit",
    "nvmlInitWithFlags",
    "nvmlInit_v2",
    "nvmlShutdown",
    "nvmlSystemGetCudaDriverVersion",
    "nvmlSystemGetCudaDriverVersion_v2",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetNVMLVersion",
    "nvmlSystemGetProcessName",
];

/// The exported functions that change GPU settings (subject to `no_permission` faults).
pub const SETTERS: &[&str] = &[
    "nvmlDeviceResetApplicationsClocks",
    "nvmlDeviceResetGpuLockedClocks",
    "nvmlDeviceSetApplicationsClocks",
    "nvmlDeviceSetGpuLockedClocks",
    "nvmlDeviceSetPersistenceMode",
    "nvmlDeviceSetPowerManagementLimit",
    "nvmlDeviceSetTemperatureThreshold",
];

/// Whether `name` is an exported function or the unversioned family name of one.
pub fn is_exported_family(name: &str) -> bool {
    EXPORTED
        .iter()
        .any(|s| *s == name || strip_version(s) == name)
}

/// Whether `name` is a setter or the unversioned family name of one.
pub fn is_setter_family(name: &str) -> bool {
    SETTERS
        .iter()
        .any(|s| *s == name || strip_version(s) == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every exported function's body passes its own name to the call helpers, so faults match
    /// the symbol that was actually called. Checked on the source text.
    #[test]
    fn every_export_names_itself() {
        let sources = [
            include_str!("exports/system.rs"),
            include_str!("exports/handles.rs"),
            include_str!("exports/device_info.rs"),
            include_str!("exports/telemetry.rs"),
            include_str!("exports/clocks.rs"),
            include_str!("exports/power.rs"),
            include_str!("exports/processes.rs"),
            include_str!("exports/control.rs"),
            include_str!("exports/events.rs"),
            include_str!("exports/nvlink.rs"),
            include_str!("exports/topology.rs"),
            include_str!("exports/mig.rs"),
            include_str!("exports/retired.rs"),
        ];
        let mut seen = Vec::new();
        for src in sources {
            for chunk in src.split("pub unsafe extern \"C\" fn ").skip(1) {
                let name = &chunk[..chunk.find('(').unwrap()];
                let body_end = chunk.find("\n}\n").unwrap_or(chunk.len());
                let body = &chunk[..body_end];
                if name != "nvmlErrorString" && name != "nvmlShutdown" {
                    assert!(
                        body.contains(&format!("\"{name}\"")),
                        "{name} does not pass its own name"
                    );
                }
                seen.push(name.to_string());
            }
        }
        seen.sort();
        assert_eq!(seen, EXPORTED, "EXPORTED is out of date");
        assert!(
            EXPORTED.windows(2).all(|w| w[0] < w[1]),
            "EXPORTED is sorted and unique"
        );
    }

    #[test]
    fn families() {
        assert!(is_exported_family("nvmlDeviceGetComputeRunningProcesses"));
        assert!(is_exported_family("nvmlDeviceGetMemoryInfo_v2"));
        assert!(!is_exported_family("nvmlDeviceGetNothing"));
        assert!(is_setter_family("nvmlDeviceSetPowerManagementLimit"));
        assert!(!is_setter_family("nvmlDeviceGetPowerUsage"));
    }
}
