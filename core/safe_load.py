"""Reading `.pt` files without running what they hold: `torch.load(weights_only=True)`, with errors
that name the file.

A `.pt` file is a pickle; unpickling arbitrary classes can run code, so a foreign file (a Miles
dump, a grad-norm file) or a checkpoint's optimizer/scheduler/RNG state is loaded with
`weights_only=True` only (plain containers, numbers, strings and tensors). A file that needs more
is refused on purpose, naming the file and the classes it would unpickle, and never with advice to
load it unsafely (torch's own message suggests `weights_only=False`).
"""

from __future__ import annotations

import io
import pickle
import re
from pathlib import Path
from typing import Any

_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")
_UNSAFE_WORDS = ("GLOBAL", "global", "reduce", "build", "allowlist")


class UnsafeFileError(ValueError):
    """A `.pt` file that only unpickling arbitrary classes could read; refused on purpose."""


class UnreadableFileError(ValueError):
    """Not a readable torch.save file (no such file, truncated, not a zip/legacy torch file)."""


def _unsafe_classes(source: str | io.BytesIO, err: Exception) -> list[str]:
    """The classes the pickle needs, found by static disassembly (nothing is executed)."""
    import torch

    found: list[str] = []
    if isinstance(source, str):
        try:
            found = sorted(torch.serialization.get_unsafe_globals_in_checkpoint(source))
        except Exception:
            found = []
    return found or sorted(set(_GLOBAL.findall(str(err))))


def _detail(err: Exception) -> str:
    """The specific reason inside torch's long "Weights only load failed" message."""
    m = re.search(r"WeightsUnpickler error:\s*(.*?)(?:\n\s*\n|$)", str(err), re.S)
    return (m.group(1) if m else str(err)).strip()


def load_pt(path: str | Path, *, data: bytes | None = None, map_location: Any = None) -> Any:
    """`torch.load(path, weights_only=True, map_location=map_location)`.

    Args:
        path: the file (named in every error).
        data: its bytes when the caller read them already (then `path` is only named).
        map_location: torch.load's (e.g. "cpu" or a device).

    Raises:
        UnsafeFileError: the file needs classes beyond plain containers and tensors (named when
            they can be found without executing anything); the message says it is refused on
            purpose and how to re-save it with plain types.
        UnreadableFileError: missing, truncated, or not a torch.save file.
    """
    import torch

    path = Path(path)
    source: str | io.BytesIO = io.BytesIO(data) if data is not None else str(path)
    try:
        return torch.load(source, weights_only=True, map_location=map_location)
    except pickle.UnpicklingError as e:
        classes, detail = _unsafe_classes(source, e), _detail(e)
        if not classes and not any(w in detail for w in _UNSAFE_WORDS):
            raise UnreadableFileError(
                f"{path}: not a readable torch.save file (UnpicklingError: {detail})"
            ) from None
        named = ", ".join(classes) if classes else "classes beyond plain containers and tensors"
        raise UnsafeFileError(
            f"{path}: refused on purpose: this file can only be read by unpickling arbitrary classes "
            f"({named}), which can run code; grpolab reads .pt files as plain data only "
            "(torch.load(weights_only=True)). Re-save it with plain types: dicts, lists, "
            "str/int/float/bool/None and torch tensors (numpy arrays via .tolist() or torch.from_numpy, "
            "enums as their string value, dataclasses as dicts)."
        ) from None
    except FileNotFoundError:
        raise UnreadableFileError(f"{path}: no such file") from None
    except Exception as e:  # not a zip / legacy torch file, truncated, etc.
        raise UnreadableFileError(
            f"{path}: not a readable torch.save file ({type(e).__name__}: {e})"
        ) from None


__all__ = ["UnreadableFileError", "UnsafeFileError", "load_pt"]
