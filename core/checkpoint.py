"""Checkpoints: `--save DIR` writes `DIR/iter_<N>/`, `--load DIR` resumes from the newest one.

An iteration directory holds the policy weights (safetensors), optimizer and scheduler state and
RNG state (`torch.save`, read back with `weights_only=True`), and `trainer_state.json` (next
rollout id, data position, weight version, model fingerprint). It is written under a temporary
name and renamed into place, then `latest_checkpointed_iteration.txt` is replaced atomically, so
a crash mid-save never leaves a half checkpoint that `--load` would pick.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from grpolab.core.actor import Actor
from grpolab.core.atomic import atomic_write_bytes
from grpolab.core.dist import barrier

LATEST_FILE = "latest_checkpointed_iteration.txt"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used with this run (names the directory and the reason)."""


@dataclass(frozen=True, kw_only=True)
class TrainerState:
    """Counters restored on resume."""

    next_rollout_id: int
    data_position: int
    weight_version: int
    model_fingerprint: str


def iteration_dir(parent: str | Path, next_rollout_id: int) -> Path:
    """`parent/iter_0000007` for a checkpoint taken before rollout 7 runs."""
    return Path(parent) / f"iter_{next_rollout_id:07d}"


def save_checkpoint(parent: str | Path, actor: Actor, state: TrainerState) -> Path:
    """Write one checkpoint atomically; return its directory.

    Multi-rank: every rank calls it (gathering weights and optimizer state are collectives); rank 0
    writes full tensors, so a checkpoint loads at any world size with the same optimizer layout.
    """
    parent = Path(parent)
    final = iteration_dir(parent, state.next_rollout_id)
    weights = {name: t.detach().cpu().contiguous() for name, t in actor.named_weights()}
    optimizer_state = actor.optimizer_state()
    if not actor.dist.is_primary:
        barrier(actor.dist)  # rank 0 writes; return once the directory is in place
        return final
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=f".{final.name}."))
    try:
        save_file(weights, tmp / "model.safetensors", metadata={"format": "pt"})
        if optimizer_state is not None and actor.scheduler is not None:
            torch.save(optimizer_state, tmp / "optimizer.pt")
            torch.save(actor.scheduler.state_dict(), tmp / "scheduler.pt")
        rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        torch.save(rng, tmp / "rng.pt")
        (tmp / "trainer_state.json").write_text(json.dumps(state.__dict__, indent=2) + "\n")
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    atomic_write_bytes(parent / LATEST_FILE, f"{state.next_rollout_id}\n".encode())
    barrier(actor.dist)
    return final


def find_latest(parent: str | Path) -> Path | None:
    """The newest complete iteration directory under `parent` (or `parent` itself if it is one), or None.

    None means an empty directory: the run starts fresh.

    Raises:
        CheckpointError: the latest-file names a directory that does not exist, or iteration
            directories exist without a latest-file.
    """
    parent = Path(parent)
    if (parent / "trainer_state.json").exists():
        return parent  # an iteration directory itself
    latest = parent / LATEST_FILE
    if not latest.exists():
        iters = sorted(p.name for p in parent.glob("iter_*") if p.is_dir())
        if iters:
            raise CheckpointError(
                f"--load: {parent} has {', '.join(iters[-3:])} but no {LATEST_FILE}; pass one iteration directory to --load"
            )
        return None
    text = latest.read_text().strip()
    if not text.isdigit():
        raise CheckpointError(f"--load: {latest} should hold an iteration number, found {text[:40]!r}")
    path = iteration_dir(parent, int(text))
    if not (path / "trainer_state.json").exists():
        raise CheckpointError(f"--load: {latest} names {path.name}, but {path} is missing or incomplete")
    return path


def load_checkpoint(path: str | Path, actor: Actor, *, model_fingerprint: str) -> TrainerState:
    """Restore weights, optimizer, scheduler and RNG into `actor`; return the counters.

    Raises:
        CheckpointError: the checkpoint was made from another model (fingerprint or tensor
            names/shapes differ), or one of its files is missing or unreadable (names the file).
    """
    path = Path(path)
    try:
        return _load_checkpoint(path, actor, model_fingerprint=model_fingerprint)
    except CheckpointError:
        raise
    except Exception as e:  # truncated safetensors, empty .pt, edited json: say which checkpoint
        raise CheckpointError(f"--load: {path} is unreadable ({type(e).__name__}: {e})") from e


def _load_checkpoint(path: Path, actor: Actor, *, model_fingerprint: str) -> TrainerState:
    state = TrainerState(**json.loads((path / "trainer_state.json").read_text()))
    if state.model_fingerprint != model_fingerprint:
        raise CheckpointError(
            f"--load: {path} was saved from another model (model fingerprint {state.model_fingerprint} != "
            f"{model_fingerprint} of --hf-checkpoint)"
        )
    weights = load_file(path / "model.safetensors")
    own = dict(actor.named_weights())
    missing, unexpected = sorted(set(own) - set(weights)), sorted(set(weights) - set(own))
    wrong = [
        f"{k}: {tuple(weights[k].shape)} vs {tuple(v.shape)}"
        for k, v in own.items()
        if k in weights and weights[k].shape != v.shape
    ]
    if missing or unexpected or wrong:
        raise CheckpointError(
            f"--load: {path} does not fit --hf-checkpoint: missing {missing[:5]}, unexpected {unexpected[:5]}, shape mismatches {wrong[:5]}"
        )
    optimizer_state = None
    if actor.optimizer is not None and (path / "optimizer.pt").exists():
        optimizer_state = torch.load(path / "optimizer.pt", weights_only=True, map_location=actor.device)
    actor.load_state(weights, optimizer_state)
    if optimizer_state is not None:
        assert actor.scheduler is not None
        actor.scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
    rng = torch.load(path / "rng.pt", weights_only=True)
    torch.set_rng_state(rng["torch"])
    random.setstate(_as_random_state(rng["python"]))
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    return state


def _as_random_state(state: object) -> tuple:
    """`random.setstate` needs tuples; the safe loader may hand back lists."""
    version, internal, gauss = state  # type: ignore[misc]
    return (version, tuple(internal), gauss)
