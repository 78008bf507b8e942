"""`grpolab ui [RUNS_ROOT ...] [--host 127.0.0.1] [--port 8501]`: start the Streamlit app.

Runs `streamlit run ui/app.py --server.address HOST --server.port PORT --server.headless true
--browser.gatherUsageStats false -- ROOT ...` (loopback only unless `--host` says otherwise;
the explicit address also keeps Streamlit from looking up an external IP) and prints the URL.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

APP = Path(__file__).resolve().parent / "app.py"


def add_ui_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the `ui` command to an argparse subparsers object; returns its parser."""
    ui = subparsers.add_parser("ui", help="Streamlit app: runs, compare, health, rollouts, diagnose")
    ui.add_argument(
        "roots",
        nargs="*",
        default=["runs"],
        metavar="RUNS_ROOT",
        help="run directories, Miles/slime logs, or folders holding them (default: runs)",
    )
    ui.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    ui.add_argument("--port", type=int, default=8501, help="port (default 8501)")
    return ui


def streamlit_command(roots: list[str], host: str, port: int) -> list[str]:
    """The `streamlit run` command line `grpolab ui` executes."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP),
        "--server.address",
        host,
        "--server.port",
        str(port),
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
        "--client.toolbarMode",
        "minimal",
        "--",
        *[str(Path(r).expanduser().resolve()) for r in roots],
    ]


def run_ui_command(args: argparse.Namespace) -> int:
    """Start Streamlit and wait for it; returns its exit code (0 after Ctrl+C).

    SIGTERM/SIGHUP sent to `grpolab ui` are passed on to Streamlit, so stopping the launcher
    never leaves a server behind.
    """
    if not 0 < args.port < 65536:
        print(f"grpolab ui: error: --port must be 1..65535, got {args.port}", file=sys.stderr)
        return 2
    shown = f"[{args.host}]" if ":" in args.host else args.host
    print(f"grpolab ui: serving {', '.join(args.roots)} at http://{shown}:{args.port}", flush=True)
    child = subprocess.Popen(streamlit_command(args.roots, args.host, args.port))

    def forward(signum: int, _frame: object) -> None:
        child.send_signal(signum)

    for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is not None:
            signal.signal(sig, forward)
    while True:
        try:
            code = child.wait()
            break
        except KeyboardInterrupt:
            continue  # the terminal sent SIGINT to Streamlit too; wait for it to stop
    return 0 if code in (0, -signal.SIGINT, -signal.SIGTERM) else code
