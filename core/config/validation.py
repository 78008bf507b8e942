"""The check helpers of the config sections: a failed condition is a ValueError naming the flag."""

from __future__ import annotations

import dataclasses
import math


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
