"""`grpolab diagnose hang|log|gpu` and `grpolab watchdog`: argument wiring only.

Each command's flags and behaviour live in its own module (hang/command.py, logdoctor/command.py, gpu/sampler.py,
watchdog/command.py); this file only attaches them to the `grpolab` parser. None of these modules imports
torch at import time, so `grpolab diagnose log` on a 150 MB log stays small.
"""

from __future__ import annotations

import argparse

HANG_DESCRIPTION = (
    "Take py-spy stacks of every rank of a run (RUN_DIR, --pid or --match) twice, confirm that it hangs "
    "(no run file changed and the stacks did not move), and name the pattern (AReaL debugging guide) with "
    "the ranks and frames as evidence and the next steps. Dumps and verdict.json go to RUN_DIR/diagnose/."
)
LOG_DESCRIPTION = (
    "Scan logs (grpolab console.log, router.log, engines/<i>.log or a whole run directory, Miles/slime with "
    "Ray prefixes, torchrun) for known failure signatures; each finding gives its rule id, severity, "
    "evidence lines (file:line), cause, fix and source. A run directory is told engine first, then the "
    "router, then the trainer."
)
GPU_DESCRIPTION = (
    "Print one reading of every NVIDIA GPU through NVML: utilization, memory, temperature, SM clock and "
    "the clock event (throttle) reasons."
)
WATCHDOG_DESCRIPTION = (
    "Follow a run's log and stop the run when its rollout engine died: every --interval seconds count "
    "the error lines (503 Service Unavailable) of the last --window seconds; after --checks counts above "
    "--limit in a row send SIGTERM, then SIGKILL after --grace-seconds (the Miles 101 manual's watchdog, "
    "section 1.2). Start it with every unattended run; it waits for a run directory that does not exist yet."
)


def add_diagnose_parsers(sub: argparse._SubParsersAction) -> None:
    """Add `diagnose {hang,log,gpu}` and `watchdog` to the top-level `grpolab` subparsers."""
    from grpolab.diagnose import gpu, hang, logdoctor, watchdog

    diagnose = sub.add_parser(
        "diagnose",
        help="diagnose a hung run (py-spy on every rank), known failures in logs, or the GPUs",
        description="Diagnose a hung run, known failure signatures in logs, or the GPUs.",
    )
    which = diagnose.add_subparsers(dest="diagnose_command", required=True, title="commands")
    hang.add_hang_arguments(
        which.add_parser(
            "hang",
            help="py-spy every rank of a run, confirm the hang and classify it",
            description=HANG_DESCRIPTION,
        )
    )
    logdoctor.add_log_arguments(
        which.add_parser(
            "log",
            help="scan logs for known failure signatures (rule id, evidence lines, cause, fix)",
            description=LOG_DESCRIPTION,
        )
    )
    gpu.add_gpu_arguments(
        which.add_parser(
            "gpu",
            help="one reading of every NVIDIA GPU (utilization, memory, temperature, clocks, throttles)",
            description=GPU_DESCRIPTION,
        )
    )
    which.metavar = "{" + ",".join(which.choices) + "}"  # "required: {hang,log,gpu}", not the dest
    watchdog.add_watchdog_arguments(
        sub.add_parser(
            "watchdog",
            help="stop a run whose rollout engine died (the Miles 101 manual's 503 watchdog)",
            description=WATCHDOG_DESCRIPTION,
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
