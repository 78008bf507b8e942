"""The `grpolab train` flags, generated from the config dataclasses, and parsed flags back into a Config.

One flag per dataclass field: the field name with dashes (`rollout_batch_size` → `--rollout-batch-size`),
or the field's metadata "flag" where Miles' name differs (`show_progress` → `--progress`). Its help
text is the first paragraph of the field's attribute docstring (the string literal after the field in
the class source, read with `ast` once, when the flags are first built) plus its default; further
paragraphs are notes for readers of the code. The annotation gives the kind:
`bool` (or `bool | None`) → `--x/--no-x`; `int`, `float`, `str` (or `X | None`) → one value;
`list[str]` → one or more values (metadata "metavar" names them; a tuple of names, e.g. ("LOW",
"HIGH"), makes it exactly that many values). Every flag defaults to None, "not
given", so the dataclass default applies: the dataclasses are the one table of defaults.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import math
import textwrap
import types
import typing
from dataclasses import dataclass
from typing import Any

from grpolab.core.config import Config, sections
from grpolab.core.config.validation import flag_of

SCALARS = (bool, int, float, str)


@dataclass(frozen=True)
class TrainFlag:
    """One `grpolab train` flag and the config field it sets.

    Attributes:
        section: the `Config` section, e.g. "optimizer".
        field: the field name, also the argparse dest (unique over all sections).
        flag: the option string, e.g. "--adam-beta1".
        kind: bool, int, float or str (the type of one value).
        many: the field is a list: the flag takes one or more values.
        help: the help text (the docstring's first paragraph, whitespace collapsed, plus the default).
        metavar: the values' name in --help (None: argparse's default); a tuple names each of exactly
            that many values.
    """

    section: str
    field: str
    flag: str
    kind: type
    many: bool
    help: str
    metavar: str | tuple[str, ...] | None = None


def attribute_docs(cls: type) -> dict[str, str]:
    """Field name → its attribute docstring (cleaned with `inspect.cleandoc`) from `cls`'s source.

    Raises:
        OSError: the class source is not available (`inspect.getsource`).
    """
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, after in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def _kind(hint: Any, where: str) -> tuple[type, bool]:
    """(type of one value, is a list) of a field annotation `X`, `X | None` or `list[X]`.

    Raises:
        TypeError: naming `where` for any other annotation (a field the flags cannot set).
    """
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = args[0] if len(args) == 1 else hint
    if typing.get_origin(hint) is list and typing.get_args(hint)[0] in SCALARS:
        return typing.get_args(hint)[0], True
    if hint in SCALARS:
        return hint, False
    raise TypeError(f"{where}: a flag cannot set a field of type {hint!r}")


def help_text(doc: str, f: dataclasses.Field) -> str:
    """The first paragraph of `doc`, whitespace collapsed, with " (default: X)" before its final period,
    unless it names its default itself or the default is None or a factory (a list)."""
    text = " ".join(doc.split("\n\n")[0].split())
    if "(default:" in text or f.default is dataclasses.MISSING or f.default is None:
        return text
    shown = ("on" if f.default else "off") if isinstance(f.default, bool) else f.default
    stem, period = (text[:-1], ".") if text.endswith(".") else (text, "")
    return f"{stem} (default: {shown}){period}"


@functools.cache
def train_flags() -> tuple[TrainFlag, ...]:
    """Every `grpolab train` flag that sets a config field, in `Config` section and field order.

    Raises:
        TypeError: a field without an attribute docstring (its help text), of a type a flag cannot
            set, or whose name another section uses too (argparse dests must be unique).
    """
    out: list[TrainFlag] = []
    for section, cls in sections().items():
        hints = typing.get_type_hints(cls)
        docs = attribute_docs(cls)
        for f in dataclasses.fields(cls):
            where = f"{cls.__name__}.{f.name}"
            if f.name not in docs:
                raise TypeError(f"{where} has no attribute docstring (the help text of its flag)")
            if any(other.field == f.name for other in out):
                raise TypeError(f"{where}: another section has a field of the same name")
            kind, many = _kind(hints[f.name], where)
            text = help_text(docs[f.name], f)
            flag = flag_of(f)
            metavar = f.metadata.get("metavar")
            out.append(TrainFlag(section, f.name, flag, kind, many, text, metavar))
    return tuple(out)


def add_train_flags(parser: argparse.ArgumentParser) -> None:
    """Add every config flag to `parser`, one argument group per config section (titled by its name).

    Every flag defaults to None, so a flag that is not given leaves the dataclass default.
    """
    groups: dict[str, Any] = {}
    for tf in train_flags():
        if tf.section not in groups:
            description = inspect.getdoc(sections()[tf.section]) or ""
            groups[tf.section] = parser.add_argument_group(tf.section, description.split("\n")[0])
        kw: dict[str, Any] = {"dest": tf.field, "default": None, "help": tf.help.replace("%", "%%")}
        if tf.kind is bool:
            kw["action"] = argparse.BooleanOptionalAction
        else:
            kind = finite_float if tf.kind is float else tf.kind
            nargs = len(tf.metavar) if isinstance(tf.metavar, tuple) else "+" if tf.many else None
            kw.update(type=kind, metavar=tf.metavar, nargs=nargs)
        groups[tf.section].add_argument(tf.flag, **kw)


def finite_float(text: str) -> float:
    """argparse type of the float flags: a finite number (inf and nan pass range checks like `>= 0`).

    Raises:
        argparse.ArgumentTypeError: not a number, or not finite (argparse names the flag, exit 2).
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def config_from_args(args: argparse.Namespace) -> Config:
    """The validated Config of parsed `grpolab train` flags (flags not given keep the defaults).

    Raises:
        ValueError: a value a section rejects; the message names the flag.
    """
    given: dict[str, dict[str, Any]] = {name: {} for name in sections()}
    for tf in train_flags():
        value = getattr(args, tf.field)
        if value is not None:
            given[tf.section][tf.field] = list(value) if tf.many else value
    return Config(**{name: cls(**given[name]) for name, cls in sections().items()})
