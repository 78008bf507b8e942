"""`--custom-rollout-log-function-path pkg.mod.fn`: a user's function called after each rollout (Miles).

The function is called as `fn(rollout_id, args, samples, extra, rollout_time)` on rank 0, once per
rollout, when the rollout's metrics are known (after the trainer's log-probs), before training:

- rollout_id (int): the rollout's id.
- args (argparse.Namespace): the run's resolved config, one attribute per `grpolab train` flag under
  its field name (`args.rollout_batch_size`, `args.lr`, ...: Miles' `args`), values as in run.json's
  "config" (a copy; changing it changes nothing).
- samples (list[grpolab.core.batch.Sample]): the whole rollout's samples with reward and advantage.
- extra (dict): "metrics": the rollout's metrics as metrics.jsonl records them (`rollout/raw_reward`,
  ...; name → float); "run_dir": the run directory (str).
- rollout_time (float): seconds the rollout's generation took (`perf/rollout_time`; 0.0 when the
  rollout was read from a recording).

It may be a coroutine function (its coroutine is run to completion with asyncio.run). Its result is
read as a bool (Miles reads it the same way): True replaces the default rollout logging, False (or
None) keeps it. The default rollout logging is what the `rollout N:` record shows people: the
`rollout N: {...}` line on stdout and in console.log, and the rollout/* scalars sent to wandb and
TensorBoard. metrics.jsonl keeps the rollout record either way (it is the run's record: the UI,
checkers and `grpolab diagnose` read it), and the one-row summary line is kept.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from grpolab.core.dotted_path import import_callable

if TYPE_CHECKING:  # torch-free import for preflight
    from grpolab.core.batch import Sample
    from grpolab.core.config import Config

FLAG = "--custom-rollout-log-function-path"


def load_rollout_logger(path: str) -> RolloutLogger:
    """Import `pkg.mod.fn` (importable from sys.path / PYTHONPATH) and wrap it.

    Raises:
        ValueError: naming the flag and the path: no module part, the module does not import (with
            its error), no such attribute, not callable, or not callable with five positional
            arguments (`check_signature`; `grpolab train` exits 2 before the run).
    """
    fn = import_callable(path, FLAG)
    check_signature(path, fn)
    return RolloutLogger(path, fn)


def check_signature(path: str, fn: Callable[..., Any]) -> None:
    """`fn` accepts Miles' five positional arguments (rollout_id, args, samples, extra, rollout_time).

    A callable whose signature Python cannot tell (some builtins) is accepted as it is.

    Raises:
        ValueError: naming the flag, the path, its signature and the call it must accept.
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*range(5))
    except TypeError as error:
        raise ValueError(
            f"{FLAG} {path!r}: {path}{signature} cannot be called as "
            f"fn(rollout_id, args, samples, extra, rollout_time) ({error})"
        ) from None


def flat_args(config: Config) -> argparse.Namespace:
    """The resolved config as Miles' flat `args`: field name → value over every section (field names
    are unique across sections; core/config/flags.py relies on the same)."""
    return argparse.Namespace(**{k: v for section in config.to_dict().values() for k, v in section.items()})


class RolloutLogger:
    """A user's rollout logger (see the module docstring for its arguments and what True means)."""

    def __init__(self, path: str, fn: Callable[..., Any]) -> None:
        self.path, self.fn = path, fn

    def __call__(
        self,
        rollout_id: int,
        args: argparse.Namespace,
        samples: list[Sample],
        extra: dict[str, Any],
        rollout_time: float,
    ) -> bool:
        """Call the function (running its coroutine if it returns one); True: it replaced the default
        rollout logging.

        Raises:
            RuntimeError: the function raised (an Exception); the message names the flag, the
                function and the rollout, and the error (`grpolab train` exits 1, status failed).
        """
        try:
            result = self.fn(rollout_id, args, samples, extra, rollout_time)
            if inspect.isawaitable(result):
                result = asyncio.run(_wait(result))
        except Exception as error:
            raise RuntimeError(
                f"{FLAG} {self.path} raised at rollout {rollout_id}: {type(error).__name__}: {error}"
            ) from error
        return bool(result)


async def _wait(awaitable: Any) -> Any:
    return await awaitable
