"""Read every NVIDIA GPU through NVML: a one-shot reading, a sampler writing gpu.jsonl, clean steps.

`grpolab diagnose gpu` prints one reading per GPU (utilization, memory, temperature, SM clock and
the clock event reasons NVML reports). During `grpolab train`, global rank 0 runs a `GpuSampler`
that appends one JSON line per GPU every `--gpu-sample-interval` seconds to RUN_DIR/gpu.jsonl. On a
machine without an NVIDIA driver nothing is sampled and the run logs one "GPU sampling off" line.

This module holds the sampler and the command. The readings come from `grpolab.diagnose.nvml`
(NVML is imported only when a reading is taken, and torch never); which samples count as a
throttle and which steps stay clean is the pure `grpolab.diagnose.gpu_throttle`.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from grpolab.diagnose.nvml import NoNvidiaDriver, NvmlSession, read_gpus

GPU_FILE = "gpu.jsonl"
"""The sampler's file in the run directory: one JSON object per GPU per sample."""

log = logging.getLogger("grpolab")  # core.rundir.LOGGER_NAME; not imported from there (rundir imports torch)

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
