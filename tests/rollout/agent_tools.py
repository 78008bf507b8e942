"""Tool executors for the tool-loop tests: each one a way a user's tool can fail (imported by path)."""

from __future__ import annotations

import asyncio


async def raises(name: str, params: dict) -> str:
    """Fails on every call."""
    raise KeyError(f"no answer for {params}")


async def sleeps(name: str, params: dict) -> str:
    """Outlasts any small --agent-timeout."""
    await asyncio.sleep(30)
    return "late"


async def returns_number(name: str, params: dict) -> int:
    """Returns a number, not the tool message's text."""
    return 5


def not_async(name: str, params: dict) -> str:
    """Miles awaits the executor: a plain function is refused."""
    return "5"


BAD_SCHEMA = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "no-such-type"}}}]
"""A tool whose parameters are not a JSON schema."""
