"""Which rollouts a run produces, and the recordings they read and write, checked before the first one.

`planned_rollout_ids` / `planned_eval_ids` say what a run (or a resumed run from rollout `start`) will
do; `check_recordings` checks, before any work, that what the rollout path reads is there
(`RolloutPath.check_ready`) and that no recording the run writes replaces another run's.
"""

from __future__ import annotations

from pathlib import Path

from grpolab.core.config import Config
from grpolab.replay.paths import eval_rollout_id
from grpolab.replay.replayer import RolloutRecorder
from grpolab.rollout.base import RolloutPath


def planned_rollout_ids(start: int, num_rollout: int, exit_after: int | None) -> list[int]:
    """The rollout ids a run produces from `start`: up to `--num-rollout` - 1, and with
    `--debug-exit-after-rollout N` none after the first id >= N (the loop stops there)."""
    end = num_rollout if exit_after is None else min(num_rollout, max(exit_after, start) + 1)
    return list(range(start, end))


def planned_eval_ids(rollout_ids: list[int], eval_interval: int | None) -> list[int]:
    """The evals the loop runs (`--eval-interval`): before each rollout whose id it divides, and one
    after the last rollout; none when no rollout is left (a resumed run that is complete)."""
    if eval_interval is None or not rollout_ids:
        return []
    return [r for r in rollout_ids if r % eval_interval == 0] + [rollout_ids[-1] + 1]


def check_recordings(
    config: Config,
    path: RolloutPath,
    recorder: RolloutRecorder | None,
    *,
    start: int,
    evals: bool,
) -> list[Path]:
    """Before the first rollout of a run starting at rollout `start`: every recording the rollout `path`
    reads is ready (`RolloutPath.check_ready`), and none the run writes (rollouts and, when `evals` (an
    engine evaluates), its `eval_<id>` files) replaces another run's recording; the temp files a
    killed run left beside those files are removed (`RolloutRecorder.remove_leftover_temps`).

    Returns:
        The files `--overwrite-debug-rollout-data` lets this run replace.

    Raises:
        FileNotFoundError / RecordingMismatchError / RecordingError: see `RolloutReplayer.check_ready`.
        FileExistsError: see `RolloutRecorder.check_free`.
    """
    debug = config.debug
    ids = planned_rollout_ids(start, config.rollout.num_rollout, debug.debug_exit_after_rollout)
    path.check_ready(ids)
    if recorder is None:
        return []
    eval_ids = planned_eval_ids(ids, config.eval.eval_interval) if evals else []
    written: list[int | str] = [*ids, *map(eval_rollout_id, eval_ids)]
    if config.dynamic_sampling.active:  # every scored group, beside each rollout (dynamic_path.py)
        from grpolab.rollout.dynamic_path import candidates_rollout_id

        written += [candidates_rollout_id(i) for i in ids]
    replaced = recorder.check_free(written, overwrite=debug.overwrite_debug_rollout_data)
    recorder.remove_leftover_temps(written)
    return replaced
