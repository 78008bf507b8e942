"""The check helpers of the config sections: a failed condition is a ValueError naming the flag.

The config's validation hook: a value whose format a room owns (the `--ci-ft-test-actions` table
is parsed in checkers/faults.py, the recording path templates in replay/paths.py, the grad-norm
templates in checkers/grad_norm.py) is checked by a function that room registers for its flag
(`register_value_check`, when the room's module is imported); each section's `__post_init__` runs
the checks registered for its fields (`run_value_checks`), so the config imports no room. The run's
checks before it starts (train/preflight.py) import every such room before a config is built from the
command line; a config built in a process that imported none of them skips those checks, and the
room parses the value again where it uses it (a bad value fails there, never passes).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

ValueCheck = Callable[[Any, str], None]
"""Checks one config value that is set: `(value, flag)`; raises ValueError naming the flag."""

_VALUE_CHECKS: dict[str, list[ValueCheck]] = {}
"""The registered checks, by the flag of the field they check."""


def require(condition: bool, message: str) -> None:
    """Raise ValueError(message) unless `condition` holds.

    `message` names the flag and what was expected (`grpolab train` prints it with exit code 2).

    Raises:
        ValueError: `condition` is false.
    """
    if not condition:
        raise ValueError(message)


def flag_of(f: dataclasses.Field) -> str:
    """The `grpolab train` flag of a config field: its metadata "flag", else `--` + the name with dashes."""
    return f.metadata.get("flag", "--" + f.name.replace("_", "-"))


def require_finite(section: object) -> None:
    """Every float field of the config section `section` that is set is a finite number.

    A value of inf or nan passes the range checks written as comparisons (`--lr inf` is >= 0) and
    would reach the optimizer or the sampler, so each float flag is checked here once.

    Raises:
        ValueError: naming the first non-finite field's flag and value.
    """
    for f in dataclasses.fields(section):  # type: ignore[arg-type]
        value = getattr(section, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{flag_of(f)} must be a finite number, got {value}")


def register_value_check(flag: str, check: ValueCheck) -> None:
    """Have config validation run `check(value, flag)` on the field of `flag` whenever it is set (not None).

    Registering the same function for the same flag again (a module imported twice) adds nothing.
    """
    checks = _VALUE_CHECKS.setdefault(flag, [])
    if check not in checks:
        checks.append(check)


def run_value_checks(section: object) -> None:
    """Run the checks registered for the fields of the config section `section` that are set, in
    field order (see the module docstring).

    Raises:
        ValueError: from the first check that fails (it names the flag).
    """
    for f in dataclasses.fields(section):  # type: ignore[arg-type]
        value = getattr(section, f.name)
        if value is None:
            continue
        flag = flag_of(f)
        for check in _VALUE_CHECKS.get(flag, ()):
            check(value, flag)
