"""Counted nouns in the diagnose commands' messages: `1 line`, `2 lines`, `1,024 errors`."""

from __future__ import annotations


def plural(count: int, noun: str, many: str | None = None) -> str:
    """`count` and `noun`, in the plural unless `count` is 1 (thousands grouped: `12,345 lines`).

    Args:
        count: how many.
        noun: the singular ("line", "error from the rollout engine").
        many: the plural when it is not `noun` + "s" (for a phrase: "errors from the rollout engine").
    """
    return f"{count:,} {noun if count == 1 else (many or noun + 's')}"


__all__ = ["plural"]
