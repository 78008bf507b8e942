"""Dynamic sampling filters: which scored groups a rollout trains on (`--dynamic-sampling-filter-path`).

The contract is Miles' (`miles/rollout/filter_hub`): `fn(args, samples, **kwargs)` gets one group's
scored samples (`core.batch.Sample`, the group's `--n-samples-per-prompt` answers, rewards filled; a
Miles filter's `sample.get_reward_value(args)` works on them) and returns `DynamicFilterOutput(keep,
reason)` or a bool. A dropped group's reason names its metric, `rollout/dynamic_filter/drop_<reason>`
(a drop without a reason is counted as `unspecified`). `args` holds every `grpolab train` flag by its
Miles attribute name, as custom generate functions get it. Shipped:

- `check_reward_nonzero_std`: Miles' reward-variance filter (`check_reward_nonzero_std`, the
  `apply_reward_nonzero_std_filter` of its docs): keep a group whose rewards' float64 standard deviation
  exceeds 1e-6; a dropped one's reason is `zero_std_<reward rounded to 1 decimal>` (a group GRPO gives
  all-zero advantages: DAPO's dynamic sampling, arXiv 2503.14476 section 3.2);
- `check_no_aborted`: drop a group with an aborted sample (finish reason "abort"), reason `aborted`.

A filter that raises, or returns anything else, fails the run naming the function, the group and the
user's file:line (core/reward_calls.py's error location), as a reward function does. Imports no torch
(train/preflight.py loads the filter before the model).
"""

from __future__ import annotations

import argparse
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from grpolab.core.dotted_path import import_callable
from grpolab.core.reward_calls import error_location, function_name, is_async

if TYPE_CHECKING:
    from grpolab.core.batch import Sample

FLAG = "--dynamic-sampling-filter-path"
ZERO_STD_EPS = 1e-6
"""Miles' threshold: a group's rewards must have a float64 standard deviation above this to be kept."""


@dataclass
class DynamicFilterOutput:
    """A filter's verdict on one group (Miles' `filter_hub.base_types.DynamicFilterOutput`).

    Attributes:
        keep: train on the group. reason: why it was dropped (the metric's suffix), or None.
    """

    keep: bool
    reason: str | None = None


class FilterError(RuntimeError):
    """The user's filter raised or returned something other than a bool or a DynamicFilterOutput."""


def check_reward_nonzero_std(args: Any, samples: list[Sample], **kwargs: Any) -> DynamicFilterOutput:
    """Keep a group whose rewards vary (float64 sample std, n − 1, as torch.std: > 1e-6); reason
    `zero_std_<reward>` otherwise."""
    rewards = [float(s.reward) for s in samples]
    mean = math.fsum(rewards) / len(rewards)
    std = (
        math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1))
        if len(rewards) > 1
        else 0.0
    )
    keep = std > ZERO_STD_EPS
    return DynamicFilterOutput(keep=keep, reason=None if keep else f"zero_std_{round(samples[0].reward, 1)}")


def check_no_aborted(args: Any, samples: list[Sample], **kwargs: Any) -> DynamicFilterOutput:
    """Keep a group none of whose samples was aborted; reason `aborted` otherwise."""
    keep = not any(s.finish_reason == "abort" for s in samples)
    return DynamicFilterOutput(keep=keep, reason=None if keep else "aborted")


def load_filter(path: str, flag: str = FLAG) -> Callable[..., Any]:
    """Import `pkg.mod.fn` (`--dynamic-sampling-filter-path`; before the run, by train/preflight.py).

    Raises:
        ValueError: naming the flag: no module part, a module that does not import, a missing or
            non-callable attribute, an `async def` function (Miles calls filters synchronously), or one
            that cannot take `(args, samples)` (its signature named).
    """
    fn = import_callable(path, flag)
    if is_async(fn):
        raise ValueError(
            f"{flag} {path!r}: the filter must be a plain function (Miles calls it synchronously)"
        )
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature to read (a C callable): the call will tell
        return fn
    try:
        signature.bind(None, [])
    except TypeError as e:
        raise ValueError(f"{flag} {path}{signature}: must be `fn(args, samples, **kwargs)` ({e})") from None
    return fn


def apply_filter(
    fn: Callable[..., Any], args: argparse.Namespace, group: list[Sample], flag: str = FLAG
) -> DynamicFilterOutput:
    """`fn`'s verdict on one scored group.

    Raises:
        FilterError: `fn` raised (its file:line named) or returned something else; the message names the
            function, the group's prompt row and the first sample's index.
    """
    where = f"{flag} {function_name(fn)} on the group of prompt row {group[0].prompt_index}"
    try:
        out = fn(args, group)
    except Exception as e:
        raise FilterError(f"{where} raised {type(e).__name__}: {e}{error_location(fn, e)}") from e
    if isinstance(out, bool):
        return DynamicFilterOutput(keep=out)
    if isinstance(out, DynamicFilterOutput) or (hasattr(out, "keep") and hasattr(out, "reason")):
        if not isinstance(out.keep, bool) and type(out.keep).__name__ not in ("Tensor", "bool_"):
            raise FilterError(f"{where} returned keep={out.keep!r}: expected a bool")
        reason = out.reason
        if reason is not None and not isinstance(reason, str):
            raise FilterError(f"{where} returned reason={reason!r}: expected a string or None")
        return DynamicFilterOutput(keep=bool(out.keep), reason=reason)
    if inspect.iscoroutine(out):
        out.close()  # never awaited: said here, not as a RuntimeWarning at exit
    raise FilterError(f"{where} returned {type(out).__name__} {str(out)[:80]}: expected a bool or a "
                      "DynamicFilterOutput(keep, reason) (grpolab.rollout.filters)")  # fmt: skip
