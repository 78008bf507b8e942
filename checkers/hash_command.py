"""The `grpolab hash` command: `hash diff A B [--json]` names the first layer where two checkpoints differ.

Its parser and its runner live together here; the hashing and the diff are in `model_hash.py`, which
is imported only when the command runs, so building the `grpolab` parser does not import torch.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO


def add_hash_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add `hash diff A B [--json]` to an argparse subparsers object (sets `args.command = "hash"`)."""
    parser = subparsers.add_parser("hash", help="per-layer model hashes: find where two checkpoints differ")
    sub = parser.add_subparsers(dest="hash_command", required=True)
    diff = sub.add_parser(
        "diff",
        help="first differing layer between two checkpoints (exit 0 identical, 1 different, 2 bad input)",
    )
    for side in ("a", "b"):
        diff.add_argument(
            side, metavar=side.upper(), help="checkpoint iter_<N> dir, HF model dir, or .safetensors file"
        )
    diff.add_argument("--json", action="store_true", help="print the result as JSON")
    return parser


def run_hash_command(
    args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Run `hash diff`: 0 identical, 1 different (with a table), 2 bad input (message names the path)."""
    from grpolab.checkers.model_hash import HashInputError, diff_checkpoints, diff_to_json, format_diff

    out = out or sys.stdout
    err = err or sys.stderr
    try:
        if args.hash_command != "diff":
            raise HashInputError(f"unknown hash command {args.hash_command!r}")
        diff = diff_checkpoints(args.a, args.b)
    except (HashInputError, OSError) as e:
        print(f"grpolab hash {args.hash_command}: error: {e}", file=err)
        return 2
    if args.json:
        print(json.dumps(diff_to_json(diff), indent=2), file=out)
    else:
        for line in format_diff(diff):
            print(line, file=out)
    return 0 if diff.identical else 1
