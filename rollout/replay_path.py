"""The `replay` rollout path: train on recorded rollouts, no engine (`--load-debug-rollout-data`).

Each rollout's samples are read from the recording of the same rollout id (replay/replayer.py checks
that it is intact, holds that rollout and comes from a run with this run's setup), with their
recorded rewards; every rank keeps its contiguous share. `report_notes` is shared with inject: what
the replayer noticed about a recording's origin (or a mismatch `--allow-recording-mismatch` let
through) goes to the console and an event.
"""

from __future__ import annotations

import logging

from grpolab.core.batch import Sample
from grpolab.core.config import Config
from grpolab.replay.replayer import RolloutReplayer
from grpolab.rollout.base import RolloutInputs, rank_share
from grpolab.rundir.writer import RunDirectory

log = logging.getLogger("grpolab")


class ReplayPath:
    """Recorded samples instead of generated ones (see the module docstring)."""

    name = "replay"
    generates = False

    @staticmethod
    def chosen(config: Config, world_size: int) -> bool:
        """`--load-debug-rollout-data` is set."""
        return config.debug.load_debug_rollout_data is not None

    def __init__(self, inputs: RolloutInputs) -> None:
        debug = inputs.config.debug
        assert debug.load_debug_rollout_data is not None  # `chosen`
        self.inputs = inputs
        self.replayer = RolloutReplayer(
            debug.load_debug_rollout_data,
            inputs.identity,
            allow_mismatch=debug.allow_recording_mismatch,
            subsample=debug.load_debug_rollout_data_subsample,
            flag="--load-debug-rollout-data",
        )

    def check_ready(self, rollout_ids: list[int]) -> None:
        """Every recording of `rollout_ids` exists, is intact, holds its rollout and comes from one run
        with this run's setup.

        Raises:
            FileNotFoundError / RecordingMismatchError / RecordingError: see `RolloutReplayer.check_ready`.
        """
        self.replayer.check_ready(rollout_ids)
        report_notes(self.replayer, self.inputs.run_dir)

    def rollout(self, rollout_id: int) -> list[Sample]:
        """This rank's share of the recorded rollout `rollout_id` (`perf/load_rollout_data_time`)."""
        inputs = self.inputs
        with inputs.timer("load_rollout_data"):
            samples, version = self.replayer.load(rollout_id)
            samples = rank_share(samples, inputs.dist)
        report_notes(self.replayer, inputs.run_dir)
        inputs.run_dir.event(
            "rollout_replayed", rollout_id=rollout_id, weight_version=version, samples=len(samples)
        )
        return samples

    def rewards(self, rollout_id: int, samples: list[Sample]) -> list[Sample]:
        """The recorded rewards stay: `samples` unchanged."""
        return samples


def report_notes(replayer: RolloutReplayer, run_dir: RunDirectory) -> None:
    """Log and record what `replayer` noticed since the last call (its `notes` and `warnings`), then clear them."""
    for message in replayer.notes:
        log.info(f"warning: {message}")
        run_dir.event("recording_origin_unknown", detail=message)
    replayer.notes.clear()
    for message in replayer.warnings:
        log.info(f"warning: {message} (--allow-recording-mismatch)")
        run_dir.event("recording_mismatch_allowed", detail=message)
    replayer.warnings.clear()
