"""The one check helper of the config sections: a failed condition is a ValueError naming the flag."""

from __future__ import annotations


def require(condition: bool, message: str) -> None:
    """Raise ValueError(message) unless `condition` holds.

    `message` names the flag and what was expected (`grpolab train` prints it with exit code 2).

    Raises:
        ValueError: `condition` is false.
    """
    if not condition:
        raise ValueError(message)
