"""Nested dicts (a run.json section, an environment manifest) as dotted keys, and where two differ."""

from __future__ import annotations

from typing import Any


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts → {"section.field": value}; lists, scalars and empty dicts are leaves."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, name + "."))
        else:
            out[name] = v
    return out


def differing(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any, str]]:
    """(dotted key, value in a, value in b, "a" | "b" when only that side has the key, else "") for every
    flattened key whose values differ (compared by repr, so 1 and 1.0 or NaN and NaN are told apart as
    JSON shows them), sorted by key; a missing value is None."""
    fa, fb = flatten(a), flatten(b)
    out = []
    for key in sorted(set(fa) | set(fb)):
        va, vb = fa.get(key), fb.get(key)
        if repr(va) != repr(vb) or (key in fa) != (key in fb):
            out.append((key, va, vb, "" if key in fa and key in fb else "a" if key in fa else "b"))
    return out
