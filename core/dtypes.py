"""The parameter dtypes a run may use (`--rollout-dtype`, `--train-dtype`), by name: the one list.

The config validates the flags against `DTYPES` with `check_dtype` (no torch: a flag error of
`grpolab train` answers before torch is imported), and the trainer and engine turn them into torch
dtypes with `parse_dtype`; float16 is not offered (no loss scaling in the trainer).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DTYPES: tuple[str, ...] = ("float32", "bfloat16")
"""The valid dtype names; each is the name of a torch dtype (`torch.float32`, `torch.bfloat16`)."""


def check_dtype(name: str, flag: str) -> str:
    """Return `name` when it is one of `DTYPES` (imports no torch).

    Raises:
        ValueError: naming `flag` and listing the valid names when `name` is unknown.
    """
    if name not in DTYPES:
        raise ValueError(f"{flag} must be one of {', '.join(DTYPES)}, got {name!r}")
    return name


def parse_dtype(name: str, flag: str) -> torch.dtype:
    """Map a dtype flag value ("float32" or "bfloat16") to a torch dtype (imports torch).

    Raises:
        ValueError: naming `flag` and listing the valid names when `name` is unknown.
    """
    import torch

    return getattr(torch, check_dtype(name, flag))
