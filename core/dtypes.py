"""The parameter dtypes a run may use (`--rollout-dtype`, `--train-dtype`), by name: the one list.

The config validates the flags against `DTYPES` and the trainer and engine parse them with
`parse_dtype`; float16 is not offered (no loss scaling in the trainer). Imports torch only.
"""

from __future__ import annotations

import torch

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
}


def parse_dtype(name: str, flag: str) -> torch.dtype:
    """Map a dtype flag value ("float32" or "bfloat16") to a torch dtype.

    Raises:
        ValueError: naming `flag` and listing the valid names when `name` is unknown.
    """
    if name not in DTYPES:
        raise ValueError(f"{flag} must be one of {', '.join(DTYPES)}, got {name!r}")
    return DTYPES[name]
