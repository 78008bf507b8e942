"""`grpolab diagnose hang|log|gpu` and `grpolab watchdog`: argument wiring only.

Each command's flags and behaviour live in its own module (hang.py, logdoctor.py, gpu.py,
watchdog.py); this file only attaches them to the `grpolab` parser. None of these modules imports
torch at import time, so `grpolab diagnose log` on a 150 MB log stays small.
"""

from __future__ import annotations

import argparse


def add_diagnose_parsers(sub: argparse._SubParsersAction) -> None:
    """Add `diagnose {hang,log,gpu}` and `watchdog` to the top-level `grpolab` subparsers."""
    from grpolab.diagnose import gpu, hang, logdoctor, watchdog

    diagnose = sub.add_parser(
        "diagnose",
        help="diagnose a hung run (py-spy on every rank), known failures in logs, or the GPUs",
        description="Diagnose a hung run, known failure signatures in logs, or the GPUs.",
    )
    which = diagnose.add_subparsers(dest="diagnose_command", required=True)
    hang.add_hang_arguments(
        which.add_parser(
            "hang",
            help="py-spy every rank of a run, confirm the hang and classify it",
            description=hang.__doc__.split("\n\n")[0] if hang.__doc__ else None,
        )
    )
    logdoctor.add_log_arguments(
        which.add_parser(
            "log",
            help="scan logs for known failure signatures (rule id, evidence lines, cause, fix)",
            description=logdoctor.__doc__.split("\n\n")[0] if logdoctor.__doc__ else None,
        )
    )
    gpu.add_gpu_arguments(
        which.add_parser(
            "gpu",
            help="one reading of every NVIDIA GPU (utilization, memory, temperature, clocks, throttles)",
            description=gpu.__doc__.split("\n\n")[0] if gpu.__doc__ else None,
        )
    )
    watchdog.add_watchdog_arguments(
        sub.add_parser(
            "watchdog",
            help="stop a run whose rollout engine died (the Miles 101 manual's 503 watchdog)",
            description=watchdog.__doc__.split("\n\n")[0] if watchdog.__doc__ else None,
        )
    )


def run_diagnose_command(args: argparse.Namespace) -> int:
    """Dispatch a parsed `diagnose …` or `watchdog` command; return its exit code."""
    if args.command == "watchdog":
        from grpolab.diagnose.watchdog import run_watchdog_command

        return run_watchdog_command(args)
    if args.diagnose_command == "hang":
        from grpolab.diagnose.hang import run_hang_command

        return run_hang_command(args)
    if args.diagnose_command == "log":
        from grpolab.diagnose.logdoctor import run_log_command

        return run_log_command(args)
    from grpolab.diagnose.gpu import run_gpu_command

    return run_gpu_command(args)
