"""Read every NVIDIA GPU through NVML: a one-shot reading, a sampler writing gpu.jsonl, clean steps.

`grpolab diagnose gpu` prints one reading per GPU (utilization, memory, temperature, SM clock and
the clock event reasons NVML reports). During `grpolab train`, global rank 0 runs a `GpuSampler`
that appends one JSON line per GPU every `--gpu-sample-interval` seconds to RUN_DIR/gpu.jsonl. On a
machine without an NVIDIA driver nothing is sampled and the run logs one "GPU sampling off" line.

Clean steps (Miles 101 manual, section 1.2 "Guard the GPU heat" and section 5.3 "Time only clean
steps"): a step whose window overlapped a thermal pause took longer for a reason that is not the
work, so times are compared over the steps that no pause touched. grpolab applies the same rule to
NVML's thermal and power clock reasons: `throttle_times` lists the samples that saw one and
`clean_step_mask` keeps the steps whose window holds none of them.

The throttle logic (first half of this file) is pure and needs no GPU; NVML is imported only when
a reading is taken, and torch never.
"""

from __future__ import annotations

import argparse
import bisect
import json
import logging
import math
import numbers
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

GPU_FILE = "gpu.jsonl"
"""The sampler's file in the run directory: one JSON object per GPU per sample."""

log = logging.getLogger("grpolab")  # core.rundir.LOGGER_NAME; not imported from there (rundir imports torch)


# ---------------------------------------------------------------------------------------------------
# Clock event ("throttle") reasons: pure decoding
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClockReason:
    """One bit of NVML's clock event reason mask and what it says about a step's time."""

    bit: int
    """The bit in nvmlDeviceGetCurrentClocksEventReasons' mask (nvml.h `nvmlClocksEventReason*`)."""
    name: str
    """The readable name written to gpu.jsonl `throttle_reasons`."""
    kinds: tuple[str, ...]
    """"thermal" and/or "power" when the reason slows the GPU for a cause that is not the work."""


CLOCK_REASONS: tuple[ClockReason, ...] = (
    ClockReason(0x001, "gpu_idle", ()),
    ClockReason(0x002, "applications_clocks_setting", ()),
    ClockReason(0x004, "sw_power_cap", ("power",)),
    ClockReason(0x008, "hw_slowdown", ("thermal", "power")),
    ClockReason(0x010, "sync_boost", ()),
    ClockReason(0x020, "sw_thermal_slowdown", ("thermal",)),
    ClockReason(0x040, "hw_thermal_slowdown", ("thermal",)),
    ClockReason(0x080, "hw_power_brake_slowdown", ("power",)),
    ClockReason(0x100, "display_clocks_setting", ()),
    ClockReason(0x200, "board_limit", ()),
    ClockReason(0x400, "reliability", ()),
)
"""NVML's clock event reason bits (nvml.h, `nvmlClocksEventReason*`, formerly
`nvmlClocksThrottleReason*`; same values) with grpolab's reading of each.

Counted as a throttle (the step was slowed by heat or power, not by its work):
sw_power_cap ("the clocks have been optimized to ensure not to exceed currently set power
limits"), sw/hw_thermal_slowdown, hw_power_brake_slowdown, and hw_slowdown, which NVML documents
as either "temperature being too high", an external power brake or a power draw too high, so it
is both kinds unless a more specific hw bit is set with it. Not counted: gpu_idle (nothing runs:
the step is waiting, not slowed), clocks held by an application/display setting, sync boost
(a group policy, not heat), and board_limit / reliability, which NVML documents by name only.
"""

_HW_SPECIFIC = frozenset({"hw_thermal_slowdown", "hw_power_brake_slowdown"})


def decode_clock_reasons(mask: int) -> list[str]:
    """Names of every bit set in an NVML clock event reason mask, in bit order.

    Bits grpolab does not know are kept as "unknown_0x…" so nothing is dropped.

    Raises:
        ValueError: a negative mask.
    """
    if mask < 0:
        raise ValueError(f"a clock event reason mask is a non-negative bit mask, got {mask}")
    names = [reason.name for reason in CLOCK_REASONS if mask & reason.bit]
    known = 0
    for reason in CLOCK_REASONS:
        known |= reason.bit
    rest, bit = mask & ~known, 1
    while rest:
        if rest & bit:
            names.append(f"unknown_{bit:#x}")
            rest &= ~bit
        bit <<= 1
    return names


def reason_kinds(name: str) -> tuple[str, ...]:
    """ "thermal"/"power" for one reason name; () for a reason that is not a throttle.

    Accepts grpolab's names and other tools' spellings of the same reasons (nvidia-smi's
    "SW Thermal Slowdown", DCGM's "HW_POWER_BRAKE", a shortened "sw_thermal"): a name mentioning
    "thermal" is thermal, one mentioning "power" is power, and "hw_slowdown" is both.
    """
    key = name.strip().lower().replace(" ", "_").replace("-", "_")
    if key == "hw_slowdown":
        return ("thermal", "power")
    return tuple(kind for kind in ("thermal", "power") if kind in key)


def throttle_kinds(names: Iterable[str]) -> list[str]:
    """The throttle kinds ("thermal", "power", in that order) of a list of active reason names.

    A bare "hw_slowdown" counts as both kinds; next to hw_thermal_slowdown or
    hw_power_brake_slowdown it adds nothing (those bits say which one it is).
    """
    names = list(names)
    specific = any(n in _HW_SPECIFIC for n in names)
    kinds: set[str] = set()
    for name in names:
        if name == "hw_slowdown" and specific:
            continue
        kinds.update(reason_kinds(name))
    return [kind for kind in ("thermal", "power") if kind in kinds]


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def sample_is_throttled(sample: Mapping[str, Any]) -> bool:
    """Whether one gpu.jsonl sample saw a thermal or power throttle.

    Uses the sample's `throttle` field when it has a value; otherwise (files without it, or other
    tools' files) the thermal/power names in `throttle_reasons` (a list of names, or a raw NVML
    mask). A null or missing field (the GPU could not report reasons) is not a throttle; neither
    is gpu_idle.
    """
    flag = sample.get("throttle")
    if not _missing(flag):
        return bool(flag)
    reasons = sample.get("throttle_reasons")
    if isinstance(reasons, bool) or _missing(reasons):
        return False
    if isinstance(reasons, numbers.Real):
        mask = float(reasons)
        return math.isfinite(mask) and mask >= 0 and bool(throttle_kinds(decode_clock_reasons(int(mask))))
    if isinstance(reasons, str):
        reasons = [reasons]
    try:
        return bool(throttle_kinds(str(name) for name in reasons))
    except TypeError:  # not a list of names: no usable reason
        return False


def throttle_times(samples: Iterable[Mapping[str, Any]]) -> list[float]:
    """Sorted Unix times (seconds) of the samples that saw a thermal or power throttle.

    Samples without a usable `time` are skipped.
    """
    times = []
    for sample in samples:
        t = sample.get("time")
        if isinstance(t, numbers.Real) and not isinstance(t, bool) and math.isfinite(t):
            if sample_is_throttled(sample):
                times.append(float(t))
    return sorted(times)


def clean_step_mask(
    step_ends: Sequence[float | None],
    step_durations: Sequence[float | None],
    throttle_times: Sequence[float],
    *,
    margin_s: float = 0.0,
) -> list[bool]:
    """Which steps are clean: no throttled sample inside [end − duration − margin, end + margin].

    Miles 101 manual, lab notes, "The timing rule": the window ends at the timestamp of the metrics
    line and lasts perf/step_time (perf/rollout_time for rollout times); "a step counts when that
    window overlaps no pause". Both edges are inclusive.

    margin_s (seconds, default 0) widens the window on both sides. grpolab's default is not to
    widen: a sample shows the GPU at one instant, so a throttle that this rule misses overlapped
    the step by less than one sample interval (1 s by default, against steps of tens of seconds),
    while widening by the interval would also drop neighbouring steps that no throttle touched.
    Pass the sample interval to be strict.

    Args:
        step_ends: Unix time (s) at which each step ended; None/NaN = unknown.
        step_durations: each step's length (s); None/NaN counts as 0 (the window is its end).
        throttle_times: Unix times (s) of throttled samples (`throttle_times`), any order.
        margin_s: seconds added on both sides of every window.

    Returns:
        One bool per step (True = clean). With no throttled sample every step is clean; otherwise
        a step with an unknown end is not (it cannot be shown clear).

    Raises:
        ValueError: the two step sequences differ in length, or margin_s < 0.
    """
    if len(step_ends) != len(step_durations):
        raise ValueError(
            f"clean_step_mask: {len(step_ends)} step ends but {len(step_durations)} step durations"
        )
    if not margin_s >= 0:
        raise ValueError(f"clean_step_mask: margin_s must be >= 0 seconds, got {margin_s}")
    marks = sorted(float(t) for t in throttle_times)
    if not marks:
        return [True] * len(step_ends)
    clean = []
    for end, duration in zip(step_ends, step_durations, strict=True):
        if _missing(end):
            clean.append(False)
            continue
        length = 0.0 if _missing(duration) else float(duration)
        lo = bisect.bisect_left(marks, float(end) - length - margin_s)
        hi = bisect.bisect_right(marks, float(end) + margin_s)
        clean.append(hi <= lo)
    return clean


# ---------------------------------------------------------------------------------------------------
# NVML readings
# ---------------------------------------------------------------------------------------------------


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
        clock event reason, see CLOCK_REASONS), throttle (a thermal or power reason is active),
        throttle_kind (["thermal"], ["power"], both or []).
        A field the GPU does not support (NVMLError_NotSupported, e.g. utilization under MIG) is
        None; another NVML error also gives None and is kept in an `errors` {field: message} entry.

    Raises:
        NoNvidiaDriver: NVML could not be initialized (no driver on this machine).
    """
    with NvmlSession.open() as nvml:
        return nvml.read()


# ---------------------------------------------------------------------------------------------------
# The sampler
# ---------------------------------------------------------------------------------------------------


class GpuSampler:
    """A daemon thread appending one JSON line per GPU per sample to `path` (gpu.jsonl).

    The only writer of the file: append mode, flushed after every sample, so a reader sees whole
    samples. The first sample is taken at `start()`, then one every `interval_s` seconds (no drift;
    a slow reading skips ahead instead of bursting). A reading that fails is logged once and
    retried at the next tick; a failed write ends the sampler with one warning. Neither stops the
    run.

    Args:
        path: the file to append to (RUN_DIR/gpu.jsonl).
        interval_s: seconds between samples (> 0).
        read: a callable returning the readings of one sample (list of dicts, each with `time`).
            Default: NVML through `NvmlSession.read`, opened at `start()`.

    Raises:
        ValueError: interval_s <= 0 (the flag's 0 means "do not build a sampler").
    """

    def __init__(
        self,
        path: str | Path,
        interval_s: float,
        *,
        read: Callable[[], list[dict[str, Any]]] | None = None,
    ) -> None:
        if not (isinstance(interval_s, int | float) and math.isfinite(interval_s) and interval_s > 0):
            raise ValueError(f"--gpu-sample-interval must be > 0 seconds to sample, got {interval_s}")
        self.path = Path(path)
        self.interval_s = float(interval_s)
        self._read = read
        self._session: NvmlSession | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.samples_written = 0
        """Samples (not lines) written so far."""

    @property
    def running(self) -> bool:
        """Whether the sampling thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> bool:
        """Open NVML (unless a `read` was given) and the file, start the thread; True when sampling.

        Without a usable NVIDIA driver, or when NVML sees no GPU, logs one line "GPU sampling off:
        …" on the `grpolab` logger, writes nothing and returns False.

        Raises:
            RuntimeError: called twice.
            OSError: the file cannot be opened for appending.
        """
        if self._thread is not None or self._stop.is_set():
            raise RuntimeError("GpuSampler.start: a sampler starts once")
        read = self._read
        if read is None:
            try:
                session = NvmlSession.open()
            except NoNvidiaDriver as e:
                log.info(f"GPU sampling off: {e}")
                return False
            try:
                count = session.device_count()
            except Exception as e:
                session.close()
                log.info(f"GPU sampling off: NVML could not count the GPUs ({e})")
                return False
            if count == 0:
                session.close()
                log.info("GPU sampling off: NVML sees no GPU on this host")
                return False
            self._session, read = session, session.read
        try:
            out = open(self.path, "a", encoding="utf-8")
        except OSError:
            if self._session is not None:
                self._session.close()
            raise
        self._thread = threading.Thread(
            target=self._loop, args=(read, out), name="grpolab-gpu-sampler", daemon=True
        )
        self._thread.start()
        return True

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask the thread to stop and wait up to `timeout_s` seconds for its current sample.

        The thread closes the file and calls nvmlShutdown on its way out. Safe to call when the
        sampler never started or already stopped.
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _loop(self, read: Callable[[], list[dict[str, Any]]], out: Any) -> None:
        warned = False
        due = time.monotonic()
        try:
            while not self._stop.is_set():
                try:
                    readings = read()
                except Exception as e:  # a GPU reading must never stop the run
                    if not warned:
                        log.warning(
                            f"GPU sampling: a reading failed ({type(e).__name__}: {e}); "
                            f"retrying every {self.interval_s:g} s"
                        )
                        warned = True
                    readings = []
                if readings:
                    try:
                        out.write("".join(json.dumps(r, default=str) + "\n" for r in readings))
                        out.flush()
                    except OSError as e:
                        log.warning(f"GPU sampling stopped: cannot write {self.path}: {e}")
                        return
                    self.samples_written += 1
                due += self.interval_s
                now = time.monotonic()
                if due < now:  # the reading took longer than the interval: skip the missed ticks
                    due = now
                self._stop.wait(due - now)
        finally:
            out.close()
            if self._session is not None:
                self._session.close()


def start_run_sampler(run_path: str | Path, interval_s: float) -> GpuSampler | None:
    """The training loop's sampler: RUN_DIR/gpu.jsonl every `interval_s` s; None when not sampling.

    The loop starts it on global rank 0 only (one writer), so it samples the GPUs of rank 0's host.

    interval_s = 0 (`--gpu-sample-interval 0`) builds nothing and logs nothing; without a driver
    the sampler logs its one "GPU sampling off" line, and so does a gpu.jsonl that cannot be
    opened (sampling never stops a run). Stop a returned sampler with `stop()`.
    """
    if interval_s <= 0:
        return None
    path = Path(run_path) / GPU_FILE
    try:
        sampler = GpuSampler(path, interval_s)
        return sampler if sampler.start() else None
    except ValueError as e:  # an infinite interval
        log.warning(f"GPU sampling off: {e}")
    except OSError as e:
        log.warning(f"GPU sampling off: cannot open {path} for appending: {e}")
    return None


# ---------------------------------------------------------------------------------------------------
# `grpolab diagnose gpu`
# ---------------------------------------------------------------------------------------------------


def add_gpu_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `grpolab diagnose gpu`."""
    parser.add_argument("--json", action="store_true", help='print {"gpus": [reading, …]} as JSON')
    parser.epilog = (
        "Exit codes: 0 every GPU was read; 2 no reading (no NVIDIA driver, NVML refused, or no GPU)."
    )


def _show(value: Any, unit: str = "") -> str:
    return "n/a" if value is None else f"{value}{unit}"


def format_reading(reading: Mapping[str, Any]) -> str:
    """A small text table of one reading (None → "n/a")."""
    used, total = reading.get("memory_used_bytes"), reading.get("memory_total_bytes")
    memory = "n/a"
    if used is not None and total is not None:
        memory = (
            f"{used / 2**30:.1f} / {total / 2**30:.1f} GiB ({100 * used / total:.0f} %)" if total else "n/a"
        )
    reasons = reading.get("throttle_reasons")
    kinds = reading.get("throttle_kind")
    if reasons is None:
        throttle = "n/a"
    else:
        throttle = ("yes (" + ", ".join(kinds) + ")") if kinds else "no"
    rows = [
        ("utilization", _show(reading.get("utilization_gpu"), " %")),
        ("memory", memory),
        ("temperature", _show(reading.get("temperature_c"), " C")),
        ("SM clock", _show(reading.get("sm_clock_mhz"), " MHz")),
        ("clock reasons", "n/a" if reasons is None else (", ".join(reasons) or "none")),
        ("throttle", throttle),
    ]
    lines = [f"GPU {reading.get('index')}  {_show(reading.get('name'))}  {_show(reading.get('uuid'))}"]
    lines += [f"  {label:<14} {value}" for label, value in rows]
    for field, message in (reading.get("errors") or {}).items():
        lines.append(f"  error: {field}: {message}")
    return "\n".join(lines)


def run_gpu_command(args: argparse.Namespace) -> int:
    """`grpolab diagnose gpu`: print one reading of every GPU; return the exit code (0 or 2)."""
    try:
        readings = read_gpus()
    except NoNvidiaDriver as e:
        return _fail(args, str(e))
    if not readings:
        return _fail(args, "NVML sees no GPU on this host")
    if args.json:
        print(json.dumps({"gpus": readings}, indent=2))
    else:
        print("\n\n".join(format_reading(r) for r in readings))
    return 0


def _fail(args: argparse.Namespace, message: str) -> int:
    if args.json:
        print(json.dumps({"gpus": [], "error": message}, indent=2))
    else:
        print(f"grpolab diagnose gpu: {message}", file=sys.stderr)
    return 2
