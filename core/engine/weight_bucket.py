"""A weight-sync bucket as a safetensors file on tmpfs, for SGLang's `/update_weights_from_disk`.

The trainer's HTTP engine (`http_engine.HttpEngine.update_weights`) writes each bucket of (HF name,
tensor) pairs into a fresh directory under /dev/shm (memory-backed on Linux: no disk write; the
system temp dir when /dev/shm is missing or not writable), passes the directory to every engine and
removes it afterwards, also when a call failed.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

BUCKET_FILE = "bucket.safetensors"
"""The file name inside a bucket's directory."""


def shm_root() -> str | None:
    """/dev/shm when it is a writable directory (tmpfs on Linux), else None (the system temp dir)."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and _writable(shm) else None


def _writable(path: Path) -> bool:
    try:
        with tempfile.TemporaryFile(dir=path):
            return True
    except OSError:
        return False


@contextmanager
def bucket_on_disk(named_tensors: list[tuple[str, torch.Tensor]]) -> Iterator[Path]:
    """Write the tensors (any device; copied to CPU) as one safetensors file in a new directory under
    `shm_root()`; yield the directory; remove it on exit.

    Raises:
        OSError: the directory or file cannot be written (e.g. /dev/shm full).
    """
    from safetensors.torch import save_file

    folder = Path(tempfile.mkdtemp(prefix="grpolab-weights-", dir=shm_root()))
    try:
        tensors = {name: t.detach().to("cpu").clone() for name, t in named_tensors}
        save_file(tensors, str(folder / BUCKET_FILE))
        del tensors
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def tensor_checksum(tensor: torch.Tensor) -> str:
    """The first 16 hex digits of the sha256 of `tensor`'s bytes (contiguous, on CPU, in its own dtype):
    what `grpolab serve`'s `/weights_checker` "checksum" reports per tensor, and what a restarted
    engine's tensors must equal (`restart.check_restarted`)."""
    data = tensor.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(data).hexdigest()[:16]
