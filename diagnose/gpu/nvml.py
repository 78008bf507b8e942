"""Read every NVIDIA GPU through NVML (nvidia-ml-py's pynvml): one reading per GPU.

A reading holds utilization, memory, temperature, SM clock and the clock event reasons NVML reports,
decoded with `grpolab.diagnose.gpu.throttle`. pynvml is imported only when a session opens, and
torch never.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from grpolab.diagnose.gpu.throttle import decode_clock_reasons, throttle_kinds


class NoNvidiaDriver(RuntimeError):
    """NVML could not start: no driver library, driver not loaded, or NVML refused to initialize.

    `str(error)` is the user-facing reason, e.g. "no NVIDIA driver (NVML library not found)".
    """


_CLOCK_REASON_FUNCTIONS = (
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
)
"""Newest name first: pynvml and drivers before the rename only have the second."""
_TEMPERATURE_FUNCTIONS = ("nvmlDeviceGetTemperature", "nvmlDeviceGetTemperatureV")
"""The first is deprecated "to be removed in CUDA 14.0"; the second needs a newer driver."""


def _import_pynvml() -> ModuleType:
    try:
        import pynvml
    except ImportError as e:  # nvidia-ml-py is a dependency; a broken install lands here
        raise NoNvidiaDriver(f"no NVIDIA driver bindings (nvidia-ml-py is not installed: {e})") from e
    return pynvml


def _init_failure(nvml: ModuleType, error: Exception) -> NoNvidiaDriver:
    if isinstance(error, getattr(nvml, "NVMLError_LibraryNotFound", ())):
        return NoNvidiaDriver("no NVIDIA driver (NVML library not found)")
    if isinstance(error, getattr(nvml, "NVMLError_DriverNotLoaded", ())):
        return NoNvidiaDriver("no NVIDIA driver (driver not loaded)")
    return NoNvidiaDriver(f"NVIDIA driver not usable (NVML: {error})")


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvmlSession:
    """An initialized NVML (nvmlInit … nvmlShutdown) that reads every GPU. Thread-safe reads.

    Use `NvmlSession.open()` (or `with NvmlSession.open() as nvml:`), then `read()`.
    """

    def __init__(self, nvml: ModuleType) -> None:
        self._nvml = nvml
        self._resolved: dict[tuple[str, ...], Callable[..., Any]] = {}
        self._closed = False
        # an error that means "this pynvml or driver lacks that call": try the next name
        self._absent = tuple(
            cls
            for cls in (
                getattr(nvml, "NVMLError_FunctionNotFound", None),
                getattr(nvml, "NVMLError_ArgumentVersionMismatch", None),
            )
            if cls is not None
        )

    @classmethod
    def open(cls) -> NvmlSession:
        """Import pynvml and call nvmlInit.

        Raises:
            NoNvidiaDriver: pynvml missing, or nvmlInit raised an NVMLError (library not found,
                driver not loaded, permission, version mismatch …).
        """
        nvml = _import_pynvml()
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as e:
            raise _init_failure(nvml, e) from e
        return cls(nvml)

    def close(self) -> None:
        """nvmlShutdown (once); errors at shutdown are ignored."""
        if self._closed:
            return
        self._closed = True
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass

    def __enter__(self) -> NvmlSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def device_count(self) -> int:
        """GPUs NVML sees on this host (all of them: CUDA_VISIBLE_DEVICES does not apply to NVML)."""
        return int(self._nvml.nvmlDeviceGetCount())

    def read(self) -> list[dict[str, Any]]:
        """One reading per GPU, in NVML index order (see `read_gpus` for the fields)."""
        return [self.read_device(index) for index in range(self.device_count())]

    def read_device(self, index: int) -> dict[str, Any]:
        """One reading of the GPU at NVML index `index` (see `read_gpus`)."""
        nv = self._nvml
        errors: dict[str, str] = {}
        reading: dict[str, Any] = {"time": time.time(), "index": index}
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
        except nv.NVMLError as e:  # GPU lost, no permission …: the reading is all null
            handle, errors["handle"] = None, str(e)

        def field(name: str, call: Callable[[], Any]) -> Any:
            if handle is None:
                return None
            try:
                return call()
            except nv.NVMLError_NotSupported:
                return None
            except nv.NVMLError as e:
                errors[name] = str(e)
                return None

        name = field("name", lambda: nv.nvmlDeviceGetName(handle))
        uuid = field("uuid", lambda: nv.nvmlDeviceGetUUID(handle))
        utilization = field("utilization_gpu", lambda: nv.nvmlDeviceGetUtilizationRates(handle).gpu)
        memory = field("memory", lambda: nv.nvmlDeviceGetMemoryInfo(handle))
        temperature = field(
            "temperature_c", lambda: self._call_first(_TEMPERATURE_FUNCTIONS, handle, nv.NVML_TEMPERATURE_GPU)
        )
        sm_clock = field("sm_clock_mhz", lambda: nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM))
        mask = field("throttle_reasons", lambda: self._call_first(_CLOCK_REASON_FUNCTIONS, handle))
        reasons = None if mask is None else decode_clock_reasons(int(mask))
        kinds = None if reasons is None else throttle_kinds(reasons)
        reading.update(
            name=None if name is None else _text(name),
            uuid=None if uuid is None else _text(uuid),
            utilization_gpu=None if utilization is None else int(utilization),
            memory_used_bytes=None if memory is None else int(memory.used),
            memory_total_bytes=None if memory is None else int(memory.total),
            temperature_c=None if temperature is None else int(temperature),
            sm_clock_mhz=None if sm_clock is None else int(sm_clock),
            throttle_reasons=reasons,
            throttle=None if kinds is None else bool(kinds),
            throttle_kind=kinds,
        )
        if errors:
            reading["errors"] = errors
        return reading

    def _call_first(self, names: tuple[str, ...], *args: Any) -> Any:
        """Call the first of `names` that both pynvml and the driver provide (cached once found)."""
        fn = self._resolved.get(names)
        if fn is not None:
            return fn(*args)
        last: Exception | None = None
        for name in names:
            candidate = getattr(self._nvml, name, None)
            if candidate is None:
                continue
            try:
                value = candidate(*args)
            except self._absent as e:
                last = e
                continue
            self._resolved[names] = candidate
            return value
        if last is not None:
            raise last
        raise self._nvml.NVMLError(self._nvml.NVML_ERROR_FUNCTION_NOT_FOUND)


def read_gpus() -> list[dict[str, Any]]:
    """One reading of every GPU on this host (NVML index order; [] when NVML sees none).

    Fields of each reading:
        time (Unix s, when the reading began), index (NVML index: PCI bus order, which is not
        CUDA's default order; match GPUs by uuid), name, uuid, utilization_gpu (% of the last
        sample period with a kernel running), memory_used_bytes, memory_total_bytes (bytes),
        temperature_c (°C, GPU die), sm_clock_mhz (MHz), throttle_reasons (names of every active
        clock event reason, see throttle.CLOCK_REASONS), throttle (a thermal or power reason
        is active), throttle_kind (["thermal"], ["power"], both or []).
        A field the GPU does not support (NVMLError_NotSupported, e.g. utilization under MIG) is
        None; another NVML error also gives None and is kept in an `errors` {field: message} entry.

    Raises:
        NoNvidiaDriver: NVML could not be initialized (no driver on this machine).
    """
    with NvmlSession.open() as nvml:
        return nvml.read()
