"""Import a user's function named by a dotted path (`--custom-rm-path`, `--custom-rollout-log-function-path`).

One reader of `pkg.mod.fn` flags, so that every such flag fails the same way, naming itself: no
module part, a module that does not import (with its own error), a missing attribute, a value that
is not callable. Imports no torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def import_attribute(path: str, flag: str) -> Any:
    """The attribute `path` ("package.module.NAME", importable from sys.path / PYTHONPATH) names.

    Raises:
        ValueError: naming `flag` and `path`: no module part, the module does not import (its error
            quoted), or no such attribute.
    """
    module_name, _, attribute = path.rpartition(".")
    if not module_name or not attribute:
        raise ValueError(f"{flag} {path!r} must look like 'package.module.function'")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # import-time errors of any kind belong to the user's module
        raise ValueError(
            f"{flag} {path!r}: cannot import module {module_name!r}: {type(error).__name__}: {error}"
        ) from error
    if not hasattr(module, attribute):
        raise ValueError(f"{flag} {path!r}: module {module_name!r} has no attribute {attribute!r}")
    return getattr(module, attribute)


def import_callable(path: str, flag: str) -> Callable[..., Any]:
    """The callable `path` ("package.module.function") names (`import_attribute`, then callable).

    Raises:
        ValueError: what `import_attribute` raises, or the attribute is not callable.
    """
    fn = import_attribute(path, flag)
    if not callable(fn):
        raise ValueError(f"{flag} {path!r}: {path} is not callable ({type(fn).__name__})")
    return fn
