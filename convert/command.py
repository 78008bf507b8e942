"""`grpolab convert --to-hf CKPT_DIR --output-dir OUT [--origin-hf-dir M] [--force]` (convert/to_hf.py).

Exit 0 with the folder written and verified, 1 when the export loads back to other numbers, 2 for bad
input (no checkpoint, an origin that does not exist, a tensor that does not map, OUT not empty).
`--origin-hf-dir` defaults to the `--hf-checkpoint` the checkpoint's run recorded in its run.json when
the checkpoint says which run saved it (`trainer_state.json`'s `hf_checkpoint`); else it is required.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PROG = "grpolab convert"


def add_convert_parser(sub: argparse._SubParsersAction) -> None:
    """Add `grpolab convert` (imports no torch)."""
    p = sub.add_parser(
        "convert",
        help="export a --save checkpoint as a transformers save_pretrained folder (checked to give the "
        "trainer's log-probs)",
        description=__doc__.splitlines()[0],
    )
    p.add_argument(
        "--to-hf", required=True, metavar="CKPT_DIR", help="an iter_* folder of --save (or --save itself)"
    )
    p.add_argument("--output-dir", required=True, metavar="OUT", help="the folder to write (atomic)")
    p.add_argument(
        "--origin-hf-dir", metavar="M", help="the model the run started from (its --hf-checkpoint)"
    )
    p.add_argument("--force", action="store_true", help="replace an earlier export at --output-dir")


def run_convert_command(args: argparse.Namespace) -> int:
    """Run `grpolab convert`; return the exit code (see the module docstring)."""
    from grpolab.convert.to_hf import ExportError, export_to_hf
    from grpolab.core.checkpoint import find_latest, read_trainer_state

    ckpt = Path(args.to_hf)
    origin = args.origin_hf_dir
    try:
        latest = find_latest(ckpt, flag="--to-hf") if ckpt.is_dir() else None
        if latest is None:
            raise ExportError(f"--to-hf {ckpt}: no checkpoint there")
        if origin is None:
            origin = read_trainer_state(latest, flag="--to-hf").hf_checkpoint
            if origin is None:
                raise ExportError(
                    f"--to-hf {latest}: the checkpoint does not name its model; pass --origin-hf-dir"
                )
        done = export_to_hf(latest, Path(args.output_dir), origin, force=args.force)
    except (ValueError, OSError) as e:  # ExportError, CheckpointError, JSON: all name the file or flag
        verify = isinstance(e, ExportError) and "loads to other numbers" in str(e)
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1 if verify else 2
    tied = f", tied {', '.join(done.tied)}" if done.tied else ""
    print(f"{PROG}: wrote {done.out} from {latest} ({done.tensors} tensors{tied}); transformers loads it to the "
          f"trainer's log-probs, bitwise on {done.verified_positions} positions")  # fmt: skip
    return 0
