"""The devices a run or an engine may name (`grpolab train --device`, `grpolab serve --device`): the one
rule for the name, and whether this machine has the device.

The name is checked without torch (a flag error answers before torch is imported); whether a CUDA
device exists imports torch, and only for a CUDA name.
"""

from __future__ import annotations

import re

_DEVICE = re.compile(r"cpu|cuda(:\d+)?")


def check_device(name: str, flag: str) -> str:
    """Return `name` when it is "cpu", "cuda" or "cuda:N" (imports no torch).

    Raises:
        ValueError: naming `flag` and what was expected.
    """
    if not _DEVICE.fullmatch(name):
        raise ValueError(f"{flag} must be cpu, cuda or cuda:N, got {name!r}")
    return name


def check_device_present(name: str, flag: str) -> None:
    """Check that this machine has the (valid, `check_device`) device `name`: always for "cpu"; for CUDA,
    a CUDA build of torch that sees the device (imports torch, unless the installed torch's version says
    it is a CPU build: then it answers in milliseconds).

    Raises:
        ValueError: naming `flag`: no CUDA in this torch build or machine, or no such CUDA index.
    """
    if not name.startswith("cuda"):
        return
    build = _torch_build()
    if build.endswith("+cpu"):  # PyTorch's CPU wheels ("2.13.0+cpu"): no import needed to know
        raise ValueError(f"{flag} {name}: this torch build or machine has no CUDA device (torch {build})")
    import torch

    if not torch.cuda.is_available():
        raise ValueError(f"{flag} {name}: this torch build or machine has no CUDA device")
    index = int(name.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        raise ValueError(f"{flag} {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")


def _torch_build() -> str:
    """The installed torch's version string ("2.13.0+cpu"), read from its package metadata; "" if none."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return ""
