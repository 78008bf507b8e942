"""Seeds derived from (run seed, rollout id, prompt index, sample index).

Each sample's sampling seed depends only on these four integers, so a sample's randomness does
not change with batch size, batch order or world size, and a recording can name it.
"""

from __future__ import annotations

import hashlib
import random

import numpy as np
import torch


def derive_sample_seed(run_seed: int, rollout_id: int, prompt_index: int, sample_index: int) -> int:
    """A 63-bit seed from SHA-256 of the four integers (stable across Python versions and platforms)."""
    digest = hashlib.sha256(
        f"grpolab/{run_seed}/{rollout_id}/{prompt_index}/{sample_index}".encode()
    ).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def seed_everything(seed: int) -> None:
    """Seed Python's `random`, NumPy and torch (CPU and CUDA) with `seed`."""
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)


def derive_turn_seed(sample_seed: int, turn: int) -> int:
    """The sampling seed of model turn `turn` (0-based) of a multi-turn sample: turn 0 uses the sample's
    own seed (so a one-turn episode samples what a single-turn rollout samples), later turns a 63-bit
    SHA-256 digest of (sample seed, turn)."""
    if turn == 0:
        return sample_seed
    digest = hashlib.sha256(f"grpolab/turn/{sample_seed}/{turn}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)
