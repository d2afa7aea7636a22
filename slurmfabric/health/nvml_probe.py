"""Child process that reads GPU facts through NVML and prints them as JSON.

Run as ``python -m slurmfabric.health.nvml_probe`` by ``gpu.collect_nvml``: NVML calls can
block in the kernel on a wedged GPU, and only a separate process can be abandoned safely.
Prints ``{"missing": true}`` when nvidia-ml-py or libnvidia-ml is not installed, so the
caller falls back to nvidia-smi. Keys match the nvidia-smi parser's.
"""

from __future__ import annotations

import contextlib
import json
import sys

# NVML return codes (nvml.h nvmlReturn_t) that mean the node itself is broken.
_NODE_FAULTS = {8, 9, 11, 14, 15, 16}


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _gpu(nv, index: int) -> dict[str, object]:
    handle = nv.nvmlDeviceGetHandleByIndex(index)

    def get(func_name: str, *args: object) -> object:
        func = getattr(nv, func_name, None)
        if func is None:
            return None
        try:
            return func(handle, *args)
        except nv.NVMLError as exc:
            if getattr(exc, "value", None) in (nv.NVML_ERROR_NOT_SUPPORTED,):
                return None
            return f"[{_text(nv.nvmlErrorString(exc.value))}]"

    gpu: dict[str, object] = {"index": index}
    gpu["uuid"] = _text(get("nvmlDeviceGetUUID"))
    gpu["name"] = _text(get("nvmlDeviceGetName"))
    pci = get("nvmlDeviceGetPciInfo")
    gpu["bus_id"] = _text(getattr(pci, "busId", pci))
    gpu["temp_c"] = get("nvmlDeviceGetTemperature", nv.NVML_TEMPERATURE_GPU)
    gpu["ecc_uncorrected"] = get("nvmlDeviceGetTotalEccErrors",
                                 nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)
    sbe = get("nvmlDeviceGetRetiredPages",
              nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
    dbe = get("nvmlDeviceGetRetiredPages", nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
    gpu["retired_sbe"] = len(sbe) if isinstance(sbe, list) else None
    gpu["retired_dbe"] = len(dbe) if isinstance(dbe, list) else None
    pending = get("nvmlDeviceGetRetiredPagesPendingStatus")
    gpu["retired_pending"] = None if pending is None or isinstance(pending, str) else bool(pending)
    remap = get("nvmlDeviceGetRemappedRows")  # (correctable, uncorrectable, pending, failure)
    if isinstance(remap, (tuple, list)) and len(remap) == 4:
        gpu["remap_uncorrectable"] = int(remap[1])
        gpu["remap_pending"] = bool(remap[2])
        gpu["remap_failure"] = bool(remap[3])
    # Renamed from ...ThrottleReasons in newer NVML; older bindings only have the old name.
    reasons = get("nvmlDeviceGetCurrentClocksEventReasons")
    if reasons is None:
        reasons = get("nvmlDeviceGetCurrentClocksThrottleReasons")
    gpu["clocks_event_reasons"] = reasons
    gpu["pcie_gen"] = get("nvmlDeviceGetCurrPcieLinkGeneration")
    gpu["pcie_gen_max"] = get("nvmlDeviceGetMaxPcieLinkGeneration")
    gpu["pcie_width"] = get("nvmlDeviceGetCurrPcieLinkWidth")
    gpu["pcie_width_max"] = get("nvmlDeviceGetMaxPcieLinkWidth")
    gpu.update(_limits(nv, handle))
    procs = get("nvmlDeviceGetComputeRunningProcesses")
    if isinstance(procs, str):
        gpu["procs_error"] = procs
        gpu["procs"] = []
    else:
        gpu["procs"] = [{"pid": int(p.pid), "process": None} for p in procs or []]
    return gpu


def _limits(nv, handle) -> dict[str, object]:
    """Power limits (mW -> W) and clocks (MHz) for gpu.clocks (health/checks/clocks.py keys), from
    the NVML device queries of the same names (NVML API reference, Device Queries). Any
    error reads as None: these fields never fail the other GPU checks."""
    def get(func_name: str, *args: object) -> object:
        func = getattr(nv, func_name, None)
        try:
            return None if func is None else func(handle, *args)
        except nv.NVMLError:
            return None

    def watts(value: object) -> float | None:
        return value / 1000.0 if isinstance(value, int) else None

    out: dict[str, object] = {
        "power_enforced_w": watts(get("nvmlDeviceGetEnforcedPowerLimit")),
        "power_requested_w": watts(get("nvmlDeviceGetPowerManagementLimit")),
        "power_default_w": watts(get("nvmlDeviceGetPowerManagementDefaultLimit")),
        "vbios": get("nvmlDeviceGetVbiosVersion"),
    }
    bounds = get("nvmlDeviceGetPowerManagementLimitConstraints")  # (min, max) in mW
    if isinstance(bounds, (tuple, list)) and len(bounds) == 2:
        out["power_min_w"], out["power_max_w"] = watts(bounds[0]), watts(bounds[1])
    clock_sm = getattr(nv, "NVML_CLOCK_SM", 1)
    graphics, memory = getattr(nv, "NVML_CLOCK_GRAPHICS", 0), getattr(nv, "NVML_CLOCK_MEM", 2)
    out["sm_mhz"] = get("nvmlDeviceGetClockInfo", clock_sm)
    out["sm_max_mhz"] = get("nvmlDeviceGetMaxClockInfo", clock_sm)
    out["app_graphics_mhz"] = get("nvmlDeviceGetApplicationsClock", graphics)
    out["app_default_graphics_mhz"] = get("nvmlDeviceGetDefaultApplicationsClock", graphics)
    out["app_memory_mhz"] = get("nvmlDeviceGetApplicationsClock", memory)
    out["app_default_memory_mhz"] = get("nvmlDeviceGetDefaultApplicationsClock", memory)
    rates = get("nvmlDeviceGetUtilizationRates")
    out["util_pct"] = getattr(rates, "gpu", None)
    if isinstance(out["vbios"], bytes):
        out["vbios"] = out["vbios"].decode()
    return out


def collect() -> dict[str, object]:
    try:
        import pynvml as nv
    except ImportError:
        return {"missing": True}
    try:
        nv.nvmlInit()
    except nv.NVMLError as exc:
        code = getattr(exc, "value", None)
        if code == nv.NVML_ERROR_LIBRARY_NOT_FOUND:
            return {"missing": True}
        return {"error": f"nvmlInit: {_text(nv.nvmlErrorString(code))}",
                "node_fault": code in _NODE_FAULTS}
    try:
        driver = _text(nv.nvmlSystemGetDriverVersion())
        cuda = None
        with contextlib.suppress(nv.NVMLError, AttributeError):
            version = int(nv.nvmlSystemGetCudaDriverVersion())  # 12040 -> "12.4"
            cuda = f"{version // 1000}.{version % 1000 // 10}"
        count = nv.nvmlDeviceGetCount()
        gpus = []
        for index in range(count):
            try:
                gpus.append(_gpu(nv, index))
            except nv.NVMLError as exc:
                code = getattr(exc, "value", None)
                return {"error": f"GPU{index}: {_text(nv.nvmlErrorString(code))}",
                        "node_fault": code in _NODE_FAULTS}
        return {"gpus": gpus, "driver": driver, "cuda": cuda}
    finally:
        with contextlib.suppress(nv.NVMLError):
            nv.nvmlShutdown()


if __name__ == "__main__":
    json.dump(collect(), sys.stdout)
    sys.stdout.write("\n")
