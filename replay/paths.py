"""Recording path templates: `{rollout_id}` expanded the Miles way, one file per rollout.

`--save-debug-rollout-data`, `--load-debug-rollout-data` and `--ci-inject-rollout-data-path` take a
path with `{rollout_id}`: the integer id for training rollouts, "eval_<id>" for eval rollouts
(Miles, notes 1.3: `/tmp/r_{rollout_id}.pt` -> `/tmp/r_eval_20.pt`).
"""

from __future__ import annotations

import re
import string
from typing import Any

from grpolab.core.config.validation import register_value_check

SAVE_FLAG = "--save-debug-rollout-data"
LOAD_FLAG = "--load-debug-rollout-data"
INJECT_FLAG = "--ci-inject-rollout-data-path"
_WITHOUT_FIELD = {
    SAVE_FLAG: "without it every rollout overwrites one file",
    LOAD_FLAG: "without it every rollout would train on the same recorded file",
    INJECT_FLAG: "without it every rollout would be compared with, and trained on, the same recorded file",
}
"""Why a template needs `{rollout_id}`, by the flag that reads or writes it."""
_ROLLOUT_ID = re.compile(r"(eval_|candidates_)?\d+")


def eval_rollout_id(rollout_id: int) -> str:
    """The id an eval rollout uses in path templates: "eval_<id>" (Miles convention)."""
    return f"eval_{int(rollout_id)}"


def check_rollout_id(rollout_id: Any) -> None:
    """Raise ValueError unless `rollout_id` is an int >= 0 (not a bool) or a string "eval_N" or
    "candidates_N" (a dynamic-sampling rollout's every scored group, rollout/dynamic_path.py)."""
    ok_int = isinstance(rollout_id, int) and not isinstance(rollout_id, bool) and rollout_id >= 0
    if not (ok_int or (isinstance(rollout_id, str) and _ROLLOUT_ID.fullmatch(rollout_id))):
        raise ValueError(f"rollout id must be an int >= 0, 'eval_N' or 'candidates_N', got {rollout_id!r}")


def format_path(template: str, rollout_id: int | str, *, flag: str = SAVE_FLAG) -> str:
    """Expand a recording path template.

    Args:
        template: a path containing `{rollout_id}` exactly as a field (no other fields; `{{`/`}}`
            are literal braces).
        rollout_id: int >= 0 for training rollouts, "eval_N" for eval rollouts, "candidates_N" for a
            dynamic-sampling rollout's candidates.
        flag: the flag the template came from; it picks the reason given when `{rollout_id}` is
            missing (saving overwrites one file; loading would train every rollout on one file).

    Raises:
        ValueError: the template lacks `{rollout_id}`, has any other field, a conversion or
            format spec, or a stray brace; or rollout_id is neither an int >= 0 nor "eval_N".
    """
    check_rollout_id(rollout_id)
    only = "the only field allowed is {rollout_id} (write {{ or }} for a literal brace)"
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as e:
        raise ValueError(f"path template {template!r} has a stray brace ({e}); {only}") from None
    fields = [(f, spec, conv) for _, f, spec, conv in parts if f is not None]
    for fname, spec, conv in fields:
        if fname != "rollout_id":
            raise ValueError(f"path template {template!r} has field {{{fname}}}; {only}")
        if spec or conv:
            raise ValueError(
                f"path template {template!r}: write {{rollout_id}} without a conversion or format spec"
            )
    if not fields:
        reason = _WITHOUT_FIELD.get(flag, _WITHOUT_FIELD[SAVE_FLAG])
        raise ValueError(f"path template {template!r} must contain {{rollout_id}}; {reason}")
    return template.format(rollout_id=rollout_id)


def check_template(template: str, *, flag: str) -> None:
    """Validate a template given to `flag` (see `format_path`).

    Raises:
        ValueError: what `format_path` rejects, the message starting with `flag`.
    """
    try:
        format_path(template, 0, flag=flag)
    except ValueError as e:
        raise ValueError(f"{flag}: {e}") from None


for _flag in (SAVE_FLAG, LOAD_FLAG, INJECT_FLAG):  # the config checks each template it is given
    register_value_check(_flag, lambda template, flag: check_template(template, flag=flag))
