"""Custom rollout loggers the monitoring tests pass as --custom-rollout-log-function-path
`rollout_loggers.<name>` (tests/monitor is on sys.path under pytest)."""

from __future__ import annotations

from typing import Any

CALLS: list[dict[str, Any]] = []
"""One entry per call of `keep` / `replace`: what the logger was given."""


def _note(rollout_id: int, args: Any, samples: list, extra: dict, rollout_time: float) -> None:
    CALLS.append(
        {
            "rollout_id": rollout_id,
            "rollout_batch_size": args.rollout_batch_size,
            "rewards": [s.reward for s in samples],
            "extra": extra,
            "rollout_time": rollout_time,
        }
    )


def keep(rollout_id: int, args: Any, samples: list, extra: dict, rollout_time: float) -> bool:
    """Miles' example shape: log elsewhere, keep the default logging."""
    _note(rollout_id, args, samples, extra, rollout_time)
    return False


async def replace(rollout_id: int, args: Any, samples: list, extra: dict, rollout_time: float) -> bool:
    """An async logger that replaces the default rollout logging."""
    _note(rollout_id, args, samples, extra, rollout_time)
    return True


def boom(rollout_id: int, args: Any, samples: list, extra: dict, rollout_time: float) -> bool:
    """Raises at rollout 0."""
    raise KeyError(f"no statsd at rollout {rollout_id}")


def boom_at_2(rollout_id: int, args: Any, samples: list, extra: dict, rollout_time: float) -> bool:
    """Raises at rollout 2 (the run fails inside a profiler window of rollouts 1..3)."""
    if rollout_id == 2:
        raise KeyError(f"no statsd at rollout {rollout_id}")
    return False


def two_args(rollout_id: int, samples: list) -> bool:
    """The wrong shape: Miles calls a rollout logger with five positional arguments."""
    return False


BOOM_AT_3 = {"armed": True}
"""Whether `boom_at_3` raises (a test disarms it to continue the failed run with the same flags)."""


def boom_at_3(rollout_id: int, args: Any, samples: list, extra: dict, rollout_time: float) -> bool:
    """Raises at rollout 3 while armed (rollouts 0..2 reached every sink)."""
    if rollout_id == 3 and BOOM_AT_3["armed"]:
        raise KeyError(f"no statsd at rollout {rollout_id}")
    return False
