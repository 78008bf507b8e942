"""`grpolab ui [RUNS_ROOT ...] [--host 127.0.0.1] [--port 8501]`: start the Streamlit app.

Runs `streamlit run ui/app.py --server.address HOST --server.port PORT --server.headless true
--browser.gatherUsageStats false -- ROOT ...` (loopback only unless `--host` says otherwise;
the explicit address also keeps Streamlit from looking up an external IP) and prints the URL.

Before that it checks what the terminal should hear first: a port already taken (or an address
this machine cannot bind) is an error, exit 2, before anything says "serving"; a RUNS_ROOT that
does not exist is a warning on stderr, and the server still starts, because the app looks for
runs again on every page load, so a root that a run is about to create (the default `runs`
before the first `grpolab train`) shows up once it exists.
"""

from __future__ import annotations

import argparse
import errno
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

APP = Path(__file__).resolve().parent / "app.py"


def add_ui_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the `ui` command to an argparse subparsers object; returns its parser."""
    ui = subparsers.add_parser(
        "ui", help="Streamlit app: runs, compare, health, timeline, rollouts, diagnose, bisect"
    )
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


def missing_roots(roots: list[str]) -> list[str]:
    """The RUNS_ROOT arguments that name nothing on disk (shown as given)."""
    return [r for r in roots if not Path(r).expanduser().exists()]


def port_problem(host: str, port: int) -> str | None:
    """Why Streamlit could not listen on host:port, or None when a test bind succeeds.

    The test socket sets SO_REUSEADDR as Streamlit's server (Tornado, Uvicorn) does, so a port left in
    TIME_WAIT by a server just stopped passes, and only a port another process listens on (or an
    address that is not this machine's) fails. The answer can go stale before Streamlit binds; it
    is there so the common case, a second `grpolab ui` on the default port, is said first.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        return f"--host {host}: cannot resolve it ({e.strerror})"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return f"--port {port}: already in use on {host} (another grpolab ui?); pick another --port"
            return f"cannot listen on {host}:{port} (--host/--port): {e.strerror or e}"
    return None


def run_ui_command(args: argparse.Namespace) -> int:
    """Start Streamlit and wait for it; returns its exit code (0 after Ctrl+C), or 2 before starting
    it for a bad --port or a port/address it cannot listen on (`port_problem`); a missing RUNS_ROOT
    is a warning (module docstring).

    SIGTERM/SIGHUP sent to `grpolab ui` are passed on to Streamlit, so stopping the launcher
    never leaves a server behind.
    """
    if not 0 < args.port < 65536:
        print(f"grpolab ui: error: --port must be 1..65535, got {args.port}", file=sys.stderr)
        return 2
    problem = port_problem(args.host, args.port)
    if problem is not None:
        print(f"grpolab ui: error: {problem}", file=sys.stderr)
        return 2
    for root in missing_roots(args.roots):
        print(
            f"grpolab ui: warning: RUNS_ROOT {root} does not exist; nothing to show from it until it does",
            file=sys.stderr,
        )
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
