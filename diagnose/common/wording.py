"""Words in the diagnose commands' messages: counted nouns (`1 line`, `2 lines`, `1,024 errors`) and
paths as the user should read them (`runs/x/console.log`, never `runs/x//console.log`)."""

from __future__ import annotations

from pathlib import Path


def plural(count: int, noun: str, many: str | None = None) -> str:
    """`count` and `noun`, in the plural unless `count` is 1 (thousands grouped: `12,345 lines`).

    Args:
        count: how many.
        noun: the singular ("line", "error from the rollout engine").
        many: the plural when it is not `noun` + "s" (for a phrase: "errors from the rollout engine").
    """
    return f"{count:,} {noun if count == 1 else (many or noun + 's')}"


def display_path(path: str | Path) -> str:
    """A path argument as messages show it: repeated and trailing slashes dropped (`runs/x//` →
    `runs/x`), `.` and `..` kept, relative stays relative; so `runs/x/` names its console.log
    `runs/x/console.log`. An empty argument shows as `.`, the directory it means."""
    return str(Path(path))


__all__ = ["display_path", "plural"]
