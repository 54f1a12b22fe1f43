"""The C symbols the fake NVML answers, by name: what a scenario's hang or error fault
may name as its `call` (tests/test_fake_hook.py keeps this list equal to the fake's).

Faults match the symbol pynvml looks up, so a versioned one keeps its suffix
(`nvmlDeviceGetHandleByIndex_v2`). A name not here would be accepted and never fire.
"""

from __future__ import annotations

SYMBOLS = frozenset({
    "nvmlDeviceGetAttributes_v2",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetDecoderUtilization",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
    "nvmlDeviceGetEncoderUtilization",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetFanSpeed",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetMaxClockInfo",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetName",
    "nvmlDeviceGetNvLinkErrorCounter",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetPcieReplayCounter",
    "nvmlDeviceGetPerformanceState",
    "nvmlDeviceGetPowerManagementDefaultLimit",
    "nvmlDeviceGetPowerManagementLimit",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetProcessUtilization",
    "nvmlDeviceGetSamples",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceIsMigDeviceHandle",
    "nvmlDeviceRegisterEvents",
    "nvmlErrorString",
    "nvmlEventSetCreate",
    "nvmlEventSetFree",
    "nvmlEventSetWait_v2",
    "nvmlGpmMetricsGet",
    "nvmlGpmQueryDeviceSupport",
    "nvmlGpmSampleAlloc",
    "nvmlGpmSampleFree",
    "nvmlGpmSampleGet",
    "nvmlInitWithFlags",
    "nvmlInit_v2",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetNVMLVersion",
})

# Symbols that block by design (an event wait): no cost is charged and no fault applies.
WAITING = frozenset({"nvmlEventSetWait_v2"})
