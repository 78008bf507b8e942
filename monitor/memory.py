"""`--record-memory-history`: a memory snapshot written once rollout `--memory-snapshot-num-steps - 1`
has trained (Miles monitoring page, reference/miles-monitoring.md, "Built-in PyTorch profiler").

Two recorders (`--memory-recorder`):

- torch: the CUDA caching allocator's history (`torch.cuda.memory._record_memory_history`), dumped
  with `torch.cuda.memory._dump_snapshot` to `<dir>/memory_snapshot-rank<r>-rollout<k>.pickle`; a
  `torch.cuda.OutOfMemoryError` that ends the run dumps `<dir>/oom-rank<r>-rollout<k>.pickle`. CUDA
  only: on a machine without CUDA it is refused at start (monitor/checks.py).
- memray: host memory through `memray.Tracker`, writing `<dir>/memray-rank<r>.bin` from the start of
  the run's loop until rollout N-1 has trained (or the run ends before).

`<dir>` is `--memory-snapshot-dir`, else RUN_DIR/memory. Each written file is a `memory_snapshot`
event (absolute path, bytes, recorder, reason). grpolab never loads a snapshot: torch's pickle is opened with
`python -m torch.cuda._memory_viz`, memray's file with `memray flamegraph`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from grpolab.core.config.monitoring import ProfilingConfig

log = logging.getLogger("grpolab")

MAX_ENTRIES = 100_000
"""Allocator events kept by torch's recorder (the value of PyTorch's memory-snapshot docs example)."""


def snapshot_dir(memory_snapshot_dir: str | None, run_dir: Path) -> Path:
    """Where snapshots go: `--memory-snapshot-dir` when given, else RUN_DIR/memory."""
    return Path(memory_snapshot_dir) if memory_snapshot_dir else run_dir / "memory"


class MemoryRecorder:
    """The memory recorder of one rank; every method is a no-op without `--record-memory-history`."""

    def __init__(
        self,
        cfg: ProfilingConfig,
        out_dir: Path,
        *,
        rank: int,
        on_snapshot: Callable[[Path, int, str], None] | None = None,
    ) -> None:
        """`on_snapshot(path, bytes, reason)` is called for each written file (the loop records an event)."""
        self.cfg, self.out_dir, self.rank = cfg, out_dir, rank
        self.last_rollout = cfg.memory_snapshot_num_steps - 1
        """The rollout id after whose training the snapshot is written."""
        self.on_snapshot = on_snapshot
        self._tracker: Any = None
        self._torch_on = False
        self._memray_path = out_dir / f"memray-rank{rank}.bin"

    @classmethod
    def for_run(cls, config: Any, run_dir: Any, rank: int) -> MemoryRecorder:
        """The recorder of a run (`config`: core.config.Config; `run_dir`: rundir.writer.RunDirectory,
        which gets a `memory_snapshot` event per file)."""
        prof = config.profiling

        def event(path: Path, size: int, reason: str) -> None:
            run_dir.event(
                "memory_snapshot",
                path=str(path.absolute()),
                bytes=size,
                recorder=prof.memory_recorder,
                reason=reason,
            )

        return cls(prof, snapshot_dir(prof.memory_snapshot_dir, run_dir.path), rank=rank, on_snapshot=event)

    def start(self, next_rollout_id: int) -> None:
        """Begin recording before rollout `next_rollout_id` (nothing when the snapshot's rollout is past).

        Raises:
            OSError: the snapshot directory cannot be made.
        """
        if not self.cfg.record_memory_history or next_rollout_id > self.last_rollout:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if self.cfg.memory_recorder == "torch":
            torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES)
            self._torch_on = True
            return
        import memray

        if self._memray_path.exists():  # an earlier start of this run directory: memray will not overwrite
            log.info(f"memory: replacing {self._memray_path} of an earlier start")
            self._memray_path.unlink()
        self._tracker = memray.Tracker(self._memray_path)
        self._tracker.__enter__()

    def after_train(self, rollout_id: int) -> None:
        """Write the snapshot when `rollout_id` is rollout N-1 (called once its training is done)."""
        if rollout_id == self.last_rollout:
            self._finish(rollout_id, "num_steps")

    def on_error(self, error: BaseException, rollout_id: int) -> None:
        """The run is failing: a CUDA OOM dumps the torch history as `oom-...`; either way stop recording.

        Never raises: a failure to write is logged, so that the run's own error is the one reported."""
        try:
            if self._torch_on and isinstance(error, torch.cuda.OutOfMemoryError):
                path = self.out_dir / f"oom-rank{self.rank}-rollout{rollout_id}.pickle"
                self._dump(path, "oom")
            self._finish(rollout_id, "run_ended")
        except Exception as e:  # noqa: BLE001 - the run is already failing with `error`
            log.info(f"warning: memory: could not write the snapshot after {type(error).__name__}: {e}")

    def close(self, rollout_id: int) -> None:
        """The run ends: a recording still open is written (memray) or dropped (torch, no snapshot due)."""
        self._finish(rollout_id, "run_ended")

    def _finish(self, rollout_id: int, reason: str) -> None:
        if self._torch_on:
            if reason == "num_steps":
                self._dump(
                    self.out_dir / f"memory_snapshot-rank{self.rank}-rollout{rollout_id}.pickle", reason
                )
            torch.cuda.memory._record_memory_history(enabled=None)
            self._torch_on = False
        if self._tracker is not None:
            tracker, self._tracker = self._tracker, None
            tracker.__exit__(None, None, None)
            self._written(self._memray_path, reason)

    def _dump(self, path: Path, reason: str) -> None:
        torch.cuda.memory._dump_snapshot(str(path))
        self._written(path, reason)

    def _written(self, path: Path, reason: str) -> None:
        size = path.stat().st_size
        log.info(f"memory: wrote {path} ({size / 1e6:.1f} MB, {reason})")
        if self.on_snapshot is not None:
            self.on_snapshot(path, size, reason)
