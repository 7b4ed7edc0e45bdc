"""The one NVML layer (nvidia-ml-py): GPU samples, detection and driver pins; a machine without NVML gets placeholders,
never an exception."""

from __future__ import annotations

import importlib
import logging
from typing import Any

log = logging.getLogger(__name__)

GIB = 1024**3


class GpuSampler:
    """The node's GPUs through NVML. Without NVML (no library, no driver, no nvidia-ml-py) `available` is False and
    `sample()` returns []; a field a GPU or driver does not support is None, never an exception (nvitop style)."""

    def __init__(self) -> None:
        self.available = False
        self._handles: list[Any] = []
        try:
            # Imported here, not at module level: the module must load on machines without nvidia-ml-py, and
            # tests swap in a fake module through sys.modules.
            self._nvml = importlib.import_module("pynvml")
            self._nvml.nvmlInit()
        except Exception as e:  # ImportError, NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, ...
            log.debug("NVML unavailable: %s", e)
            return
        try:
            count = self._nvml.nvmlDeviceGetCount()
            self._handles = [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception as e:
            log.warning("NVML initialised but listing GPUs failed: %s", e)
            self._shutdown()
            return
        self.available = True

    def _query(self, fn_name: str, *args: Any) -> Any:
        # Looked up by name inside the try: an older nvidia-ml-py lacks some functions (AttributeError), a newer
        # one raises NVMLLibraryMismatchError against an old driver, a GPU raises NVMLError NotSupported,
        # NoPermission, GpuIsLost... Each of these is one missing field, not a failed sample.
        try:
            return getattr(self._nvml, fn_name)(*args)
        except Exception as e:
            log.debug("NVML %s: %s", fn_name, e)
            return None

    def sample(self, pid_to_rank: dict[int, int] | None = None) -> list[dict[str, Any]]:
        """One dict per GPU; `ranks` lists the ranks (from `pid_to_rank`) with a compute context on that GPU."""
        if not self.available:
            return []
        nv, q = self._nvml, self._query
        pid_to_rank = pid_to_rank or {}
        out = []
        for index, h in enumerate(self._handles):
            mem = q("nvmlDeviceGetMemoryInfo", h)
            util = q("nvmlDeviceGetUtilizationRates", h)
            power_mw = q("nvmlDeviceGetPowerUsage", h)
            procs = q("nvmlDeviceGetComputeRunningProcesses", h) or []
            out.append(
                {
                    "index": index,
                    "name": _text(q("nvmlDeviceGetName", h)),
                    "uuid": _text(q("nvmlDeviceGetUUID", h)),
                    "util_pct": None if util is None else float(util.gpu),
                    "mem_used_gib": None if mem is None else mem.used / GIB,
                    "mem_total_gib": None if mem is None else mem.total / GIB,
                    "temp_c": q("nvmlDeviceGetTemperature", h, nv.NVML_TEMPERATURE_GPU),
                    "power_w": None if power_mw is None else power_mw / 1000.0,
                    "sm_clock_mhz": q("nvmlDeviceGetClockInfo", h, nv.NVML_CLOCK_SM),
                    # Pids are those of NVML's PID namespace: inside a container without --pid=host they do
                    # not match the ranks' pids and the list stays empty.
                    "ranks": sorted({pid_to_rank[p.pid] for p in procs if p.pid in pid_to_rank}),
                }
            )
        return out

    def close(self) -> None:
        if self.available:
            self.available = False
            self._shutdown()

    def _shutdown(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception as e:
            log.debug("nvmlShutdown: %s", e)


def _text(v: Any) -> str | None:
    # Older nvidia-ml-py returns bytes for names and UUIDs, newer returns str.
    return v.decode(errors="replace") if isinstance(v, bytes) else v


def detect_gpus() -> list[dict[str, Any]]:
    """index, name, mem_total_gib of each GPU of this machine, for `hardware.gpu=auto`; [] without NVML."""
    gpu = GpuSampler()
    try:
        return [{k: g[k] for k in ("index", "name", "mem_total_gib")} for g in gpu.sample()]
    finally:
        gpu.close()


def driver_pins() -> dict[str, Any]:
    """Driver, names and count of this machine's GPUs; empty on machines without NVIDIA GPUs."""
    gpu = GpuSampler()
    if not gpu.available:
        return {"driver": None, "count": 0, "names": []}
    try:
        names = [g["name"] for g in gpu.sample()]
        return {"driver": _text(gpu._query("nvmlSystemGetDriverVersion")), "count": len(names), "names": names}
    finally:
        gpu.close()
