"""`grpolab diagnose gpu`: one reading of every NVIDIA GPU through NVML, as text or JSON.

Exit codes: 0 every GPU was read; 2 no reading (no NVIDIA driver, NVML refused, or no GPU).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import Any

from grpolab.diagnose.gpu.nvml import NoNvidiaDriver, read_gpus


def add_gpu_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `grpolab diagnose gpu`."""
    parser.add_argument("--json", action="store_true", help='print {"gpus": [reading, …]} as JSON')
    parser.epilog = (
        "Exit codes: 0 every GPU was read; 2 no reading (no NVIDIA driver, NVML refused, or no GPU)."
    )


def _show(value: Any, unit: str = "") -> str:
    return "n/a" if value is None else f"{value}{unit}"


def format_reading(reading: Mapping[str, Any]) -> str:
    """A small text table of one reading (None → "n/a")."""
    used, total = reading.get("memory_used_bytes"), reading.get("memory_total_bytes")
    memory = "n/a"
    if used is not None and total is not None:
        memory = (
            f"{used / 2**30:.1f} / {total / 2**30:.1f} GiB ({100 * used / total:.0f} %)" if total else "n/a"
        )
    reasons = reading.get("throttle_reasons")
    kinds = reading.get("throttle_kind")
    if reasons is None:
        throttle = "n/a"
    else:
        throttle = ("yes (" + ", ".join(kinds) + ")") if kinds else "no"
    rows = [
        ("utilization", _show(reading.get("utilization_gpu"), " %")),
        ("memory", memory),
        ("temperature", _show(reading.get("temperature_c"), " C")),
        ("SM clock", _show(reading.get("sm_clock_mhz"), " MHz")),
        ("clock reasons", "n/a" if reasons is None else (", ".join(reasons) or "none")),
        ("throttle", throttle),
    ]
    lines = [f"GPU {reading.get('index')}  {_show(reading.get('name'))}  {_show(reading.get('uuid'))}"]
    lines += [f"  {label:<14} {value}" for label, value in rows]
    for field, message in (reading.get("errors") or {}).items():
        lines.append(f"  error: {field}: {message}")
    return "\n".join(lines)


def run_gpu_command(args: argparse.Namespace) -> int:
    """`grpolab diagnose gpu`: print one reading of every GPU; return the exit code (0 or 2)."""
    try:
        readings = read_gpus()
    except NoNvidiaDriver as e:
        return _fail(args, str(e))
    if not readings:
        return _fail(args, "NVML sees no GPU on this host")
    if args.json:
        print(json.dumps({"gpus": readings}, indent=2))
    else:
        print("\n\n".join(format_reading(r) for r in readings))
    return 0


def _fail(args: argparse.Namespace, message: str) -> int:
    if args.json:
        print(json.dumps({"gpus": [], "error": message}, indent=2))
    else:
        print(f"grpolab diagnose gpu: {message}", file=sys.stderr)
    return 2
