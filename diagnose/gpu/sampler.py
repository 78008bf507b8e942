"""The GPU sampler of `grpolab train`: one JSON line per GPU per sample in RUN_DIR/gpu.jsonl.

During `grpolab train`, global rank 0 runs a `GpuSampler` that appends one JSON line per GPU every
`--gpu-sample-interval` seconds to RUN_DIR/gpu.jsonl. On a machine without an NVIDIA driver nothing
is sampled and the run logs one "GPU sampling off" line. The readings come from nvml.py (NVML is
imported only when a reading is taken, and torch never); which samples count as a throttle and which
steps stay clean is the pure throttle.py; the one-shot `grpolab diagnose gpu` is command.py.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpolab.diagnose.gpu.nvml import NoNvidiaDriver, NvmlSession

GPU_FILE = "gpu.jsonl"
"""The sampler's file in the run directory: one JSON object per GPU per sample."""

log = logging.getLogger(
    "grpolab"
)  # rundir.writer.LOGGER_NAME; not imported from there (the writer imports torch)


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
