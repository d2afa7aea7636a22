"""GPUs: NVIDIA PCI functions (vendor 0x10de, class 0x0302xx/0x0300xx) with names, UUIDs
and minor numbers from /proc/driver/nvidia or, when asked, NVML (nvidia-ml-py, imported
lazily: it costs ~45 ms (python -X importtime) and needs the driver); and AMD Instinct
functions bound to amdgpu (vendor 0x1002), numbered by their DRM render minor.

RCCL reads the same NCCL_* variables as NCCL, so the plan is the same for both vendors;
only the device numbering and the GPUDirect RDMA module differ."""

from __future__ import annotations

from slurmfabric.topology import pci
from slurmfabric.topology._io import Reader
from slurmfabric.topology.model import Gpu, PciDevice

NVIDIA = "0x10de"
AMD = "0x1002"
GPU_CLASSES = ("0x0302", "0x0300")  # 3D controller (datacenter GPUs), VGA controller
# amdgpu binds Instinct parts as display controller (0x0380: MI100, MI200) or processing
# accelerator (0x1200: MI300 series; PCI Code and ID Assignment spec, base class 12h).
AMD_CLASSES = ("0x0380", "0x1200", "0x0302", "0x0300")


def _candidates(reader: Reader) -> list[str]:
    # With the driver loaded its bind directory lists the GPUs (and NVSwitches) directly,
    # which saves reading every PCI function's vendor file on a 300-function node.
    bound = [e for e in reader.listdir("/sys/bus/pci/drivers/nvidia") if ":" in e]
    if bound:
        return bound
    return [
        e
        for e in reader.listdir("/sys/bus/pci/devices")
        if reader.text(f"/sys/bus/pci/devices/{e}/vendor") == NVIDIA
    ]


def _proc_info(reader: Reader, bus_id: str) -> dict[str, str]:
    """/proc/driver/nvidia/gpus/<bus>/information: ``Model:``, ``GPU UUID:``, ``Device Minor:``."""
    text = reader.text(f"/proc/driver/nvidia/gpus/{bus_id}/information") or ""
    info: dict[str, str] = {}
    for line in text.splitlines():
        if ":" in line:
            key, _, value = line.partition(":")
            info[key.strip()] = value.strip()
    return info


def _nvml_info() -> dict[str, dict[str, object]] | None:
    """bus id -> {uuid, name, minor, index} from NVML, or None when NVML is unusable."""
    try:
        import pynvml  # optional dependency: slurmfabric[nvml]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound / DriverNotLoaded: fall back to sysfs
        return None
    info: dict[str, dict[str, object]] = {}
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            bus = pynvml.nvmlDeviceGetPciInfo(handle).busId
            bus = bus.decode() if isinstance(bus, bytes) else bus
            # NVML spells the domain with 8 digits ("00000000:18:00.0"); sysfs with 4.
            bus = bus.lower()[-12:]
            entry: dict[str, object] = {"index": index}
            for key, call in (
                ("uuid", pynvml.nvmlDeviceGetUUID),
                ("name", pynvml.nvmlDeviceGetName),
                ("minor", pynvml.nvmlDeviceGetMinorNumber),
            ):
                try:
                    value = call(handle)
                    entry[key] = value.decode() if isinstance(value, bytes) else value
                except Exception:  # not supported on this GPU/driver
                    pass
            info[bus] = entry
    except Exception:
        return None
    finally:
        import contextlib  # here, not at the top: ~3 ms on every rank of a GPU job

        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    return info


def _amd_gpus(reader: Reader) -> list[Gpu]:
    """Instinct GPUs bound to amdgpu, in PCI order, each numbered by its render node: Slurm's
    gres File=/dev/dri/renderD<N> and ROCm's device order both follow it."""
    gpus: list[Gpu] = []
    for entry in sorted(e for e in reader.listdir("/sys/bus/pci/drivers/amdgpu") if ":" in e):
        klass = (reader.text(f"/sys/bus/pci/devices/{entry}/class") or "").lower()
        if not klass.startswith(AMD_CLASSES):
            continue
        device = pci.read_device(reader, f"/sys/bus/pci/devices/{entry}")
        if device is None or device.vendor != AMD:
            continue
        minor = None
        for name in reader.listdir(f"/sys/bus/pci/devices/{entry}/drm"):
            if name.startswith("renderD") and name[7:].isdecimal():
                minor = int(name[7:])
        gpus.append(Gpu(index=len(gpus), pci=device, name="AMD Instinct", minor=minor))
    return gpus


def discover_gpus(reader: Reader, use_nvml: bool = False) -> tuple[tuple[Gpu, ...], str]:
    devices: list[PciDevice] = []
    for entry in _candidates(reader):
        klass = (reader.text(f"/sys/bus/pci/devices/{entry}/class") or "").lower()
        if not klass.startswith(GPU_CLASSES):
            continue  # NVSwitch (0x0680), audio functions, ...
        device = pci.read_device(reader, f"/sys/bus/pci/devices/{entry}")
        if device is not None and device.vendor == NVIDIA:
            devices.append(device)
    if not devices:
        amd = _amd_gpus(reader)
        if amd:
            return tuple(amd), "sysfs"
    devices.sort(key=lambda d: d.address)
    nvml = _nvml_info() if use_nvml and devices else None
    gpus: list[Gpu] = []
    for index, device in enumerate(devices):
        proc = _proc_info(reader, device.address)
        from_nvml = (nvml or {}).get(device.address, {})
        minor = from_nvml.get("minor", proc.get("Device Minor"))
        try:
            minor_int = int(minor) if minor is not None else None  # type: ignore[arg-type]
        except ValueError:
            minor_int = None
        gpus.append(
            Gpu(
                index=int(from_nvml.get("index", index)),  # type: ignore[arg-type]
                pci=device,
                uuid=str(from_nvml.get("uuid") or proc.get("GPU UUID") or "") or None,
                name=str(from_nvml.get("name") or proc.get("Model") or "") or None,
                minor=minor_int,
            )
        )
    return tuple(gpus), ("nvml" if nvml else "sysfs")
