"""Launch and tear down a local engine fleet: N `grpolab serve` processes behind the real sglang-router.

What `grpolab train --rollout-num-engines N` runs, the way Miles runs it: each engine is
`python -m grpolab serve --hf-checkpoint M --port 0` (its log: `RUN_DIR/engines/<i>.log`, where it
prints `grpolab serve: listening on URL`), the router is `python -m sglang_router.launch_router
--host 127.0.0.1 --port P --request-timeout-secs T` (PyPI `sglang-router`, a Rust router that runs
on CPU; its log: `RUN_DIR/router.log`; its Prometheus exporter on a free loopback port, so that
several runs can share a machine), and each engine is registered through the router's worker
API (`POST /workers {"url"}`, an async job; `GET /workers` lists it once registered and healthy).

No orphan survives the trainer: every child starts in its own session (one process group, so
`close` ends the engine and anything it started) and with the Linux parent-death signal set to
SIGKILL, so even a SIGKILLed trainer takes its fleet with it. `close` (idempotent; also registered
with `atexit`) sends SIGTERM (and SIGCONT, for a stopped one) to each group, waits `STOP_GRACE_S`,
then SIGKILLs what is left.
"""

from __future__ import annotations

import atexit
import ctypes
import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from grpolab.core.engine.http_calls import HttpCallError, call_json

ROUTER_MODULE = "sglang_router.launch_router"
"""The router's launcher module in the `sglang-router` wheel (Miles: `sglang_router.launch_server`'s sibling)."""
LISTENING = "grpolab serve: listening on "
"""The line `grpolab serve` prints once it accepts connections (serve/command.py)."""
STARTUP_TIMEOUT_S = 180.0
"""Seconds an engine or the router may take to answer after launch (grpolab's: a tiny model starts in
~5 s, SmolLM2-135M in ~20 s on a busy 2-core CPU machine; a real model on a GPU needs a longer wait,
which is why an already running fleet can be used with --sglang-router-ip instead)."""
ROUTER_PROBE_NOISE = "Invalid HTTP request received."
"""uvicorn's warning when sglang-router 0.3.2 probes an engine for gRPC at registration (router.log: "Step
failed ... detect_connection_mode"): twice in every engine log, it is no sign of the engine's state, so
a quoted log tail leaves it out."""
STOP_GRACE_S = 10.0
"""Seconds between SIGTERM and SIGKILL at teardown (the router's graceful shutdown takes ~2 s)."""
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_PROBLEM = re.compile(r"\b(ERROR|WARN)\b")  # sglang-router's level words (tests/diagnose/router_logs/)


class FleetError(RuntimeError):
    """A fleet process failed to start or register; the message quotes its log tail."""


class PortInUseError(ValueError):
    """`--sglang-router-port` is taken (a flag error: exit 2)."""


def _die_with_parent() -> None:  # runs in the child between fork and exec
    os.setsid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not Linux: the atexit hook and process groups still apply
        pass


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on `host` now (the kernel's pick for port 0)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def check_port_free(host: str, port: int, flag: str) -> None:
    """Raise PortInUseError naming `flag` when (host, port) cannot be bound."""
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError as e:
            raise PortInUseError(f"{flag} {port}: {host}:{port} is in use ({e.strerror or e})") from e


ROUTER_HOST = "127.0.0.1"
"""Where a launched router listens (loopback: the trainer is its only client)."""


def check_can_launch(router_port: int | None) -> None:
    """A router can be launched here: the sglang-router package is installed and `router_port`
    (`--sglang-router-port`; None: a free one is picked at launch) can be bound on `ROUTER_HOST`.

    Checked by `grpolab train`'s preflight (before any run directory or torch import) and again by
    `Fleet.launch`; binds the port for an instant, so only one process of a run may call it at a time.

    Raises:
        ValueError: sglang-router is not installed (says how to install it).
        PortInUseError: the port is taken (names `--sglang-router-port`, the address and the OS's reason).
    """
    if importlib.util.find_spec("sglang_router") is None:
        raise ValueError(
            "--rollout-num-engines needs the sglang-router package (its Rust router runs on CPU): "
            "pip install -e '.[servers]'"
        )
    if router_port is not None:
        check_port_free(ROUTER_HOST, router_port, "--sglang-router-port")


def log_tail(path: Path, n: int, *, skip: str | None = None) -> list[str]:
    """The last `n` lines of the log file at `path` (ANSI colour codes removed), leaving out lines that
    contain `skip`; [] when it is missing."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    kept = [line for line in lines if skip is None or skip not in line]
    return [_strip_ansi(line) for line in kept[-n:]]


def _strip_ansi(line: str) -> str:
    out, i = [], 0
    while i < len(line):
        if line[i] == "\x1b" and i + 1 < len(line) and line[i + 1] == "[":
            j = i + 2
            while j < len(line) and not line[j].isalpha():
                j += 1
            i = j + 1
            continue
        out.append(line[i])
        i += 1
    return "".join(out)


@dataclass
class FleetProcess:
    """One launched process: a name for messages ("engine 0", "router"), its Popen, log and URL."""

    name: str
    proc: subprocess.Popen
    log_path: Path
    url: str = ""
    log_start: int = 0  # the log's size at launch: a reused run directory's log holds older runs' lines

    def new_log_lines(self) -> list[str]:
        """The lines this process wrote to its log (not an earlier run's)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_start)
                return f.read().decode(errors="replace").splitlines()
        except OSError:
            return []

    def problems_about(self, url: str, n: int) -> list[str]:
        """The last `n` ERROR/WARN lines this process logged that name `url` (ANSI colours removed): the
        router's lines that explain why an engine failed (e.g. "Failed to send typed request worker_url=URL",
        "HTTP health check failed for URL/health")."""
        mentions = re.compile(re.escape(url) + r"(?!\d)")  # not :3000 inside :30001
        lines = (_strip_ansi(line) for line in self.new_log_lines())
        return [line for line in lines if _PROBLEM.search(line) and mentions.search(line)][-n:]

    def exited(self) -> int | None:
        """The exit code once the process has ended, else None."""
        return self.proc.poll()

    def describe_exit(self) -> str:
        """ "engine 0 (http://...) exited with code -9 (killed by SIGKILL)" for messages."""
        code = self.proc.returncode
        how = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"code {code}"
        return f"{self.name} ({self.url or 'not started'}) exited ({how})"


def _spawn(name: str, argv: list[str], log_path: Path) -> FleetProcess:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        start = out.tell()
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent
        )
    return FleetProcess(name, proc, log_path, log_start=start)


class Fleet:
    """N `grpolab serve` engines and one sglang-router, launched by `Fleet.launch`, ended by `close`.

    Attributes:
        router_url: "http://127.0.0.1:P".
        engines: one `FleetProcess` per engine, in launch order (`url` set once it listens).
        router: the router's `FleetProcess`.
    """

    def __init__(self, router: FleetProcess, engines: list[FleetProcess]) -> None:
        self.router, self.engines = router, engines
        self.router_url = router.url
        self.serve_argv: list[str] = []  # how `launch` started each engine (`relaunch` starts it again)
        self.dtype = "float32"  # the engines' --dtype
        self._closed = False
        atexit.register(self.close)

    @classmethod
    def launch(
        cls,
        *,
        checkpoint: str,
        num_engines: int,
        run_dir: Path,
        device: str = "cpu",
        dtype: str = "float32",
        decode_path: str = "auto",
        num_threads: int | None = None,
        router_port: int | None = None,
        request_timeout_s: float = 600.0,
        true_on_policy: bool = False,
        startup_timeout_s: float = STARTUP_TIMEOUT_S,
    ) -> Fleet:
        """Start the engines and the router, wait until each answers, register the engines.

        Raises:
            ValueError: `num_engines` < 1, or sglang-router is not installed (`check_can_launch`).
            PortInUseError: `router_port` is taken (`--sglang-router-port`).
            FleetError: a process exited or did not answer within `startup_timeout_s` (its log tail
                is quoted), or the router did not list an engine as healthy; everything is torn down.
        """
        if num_engines < 1:
            raise ValueError(f"--rollout-num-engines must be >= 1, got {num_engines}")
        port = router_port if router_port is not None else free_port()
        check_can_launch(port)  # again: preflight checked, but the port may have been taken since
        serve = [sys.executable, "-m", "grpolab", "serve", "--hf-checkpoint", str(checkpoint), "--port", "0"]
        # no --batch-wait-ms: the default 10 ms gather is enough, since the HTTP engine holds a rollout's
        # requests (pause in_place) until all arrived
        serve += ["--device", device, "--dtype", dtype, "--decode-path", decode_path]
        if true_on_policy:
            serve.append("--true-on-policy-mode")
        if num_threads is not None:  # the run's --num-threads: engines and trainer share this machine's cores
            serve += ["--num-threads", str(num_threads)]
        engines = [
            _spawn(f"engine {i}", serve, Path(run_dir) / "engines" / f"{i}.log") for i in range(num_engines)
        ]
        router_argv = [sys.executable, "-m", ROUTER_MODULE, "--host", ROUTER_HOST, "--port", str(port)]
        router_argv += ["--request-timeout-secs", str(max(1, round(request_timeout_s)))]
        # its Prometheus exporter binds 0.0.0.0:29000 by default: a second router on the machine (another
        # run, a test) panicked with "Address already in use"; a free loopback port each
        router_argv += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
        router = _spawn("router", router_argv, Path(run_dir) / "router.log")
        router.url = f"http://{ROUTER_HOST}:{port}"
        fleet = cls(router, engines)
        fleet.serve_argv, fleet.dtype = serve, dtype
        try:
            deadline = time.monotonic() + startup_timeout_s
            for engine in engines:
                engine.url = _wait_listening(engine, deadline, startup_timeout_s)
            _wait_router(router, deadline, startup_timeout_s)
            for engine in engines:
                call_json("POST", router.url + "/workers", {"url": engine.url}, timeout=30)
            _wait_registered(router, [e.url for e in engines], deadline, startup_timeout_s)
        except BaseException:
            fleet.close()
            raise
        return fleet

    def relaunch(self, i: int, *, startup_timeout_s: float = STARTUP_TIMEOUT_S) -> FleetProcess:
        """Start engine `i` again after its process exited: the same `grpolab serve` argv, its log appended
        (`RUN_DIR/engines/<i>.log`), a new port; returns it once it listens (`url` set).

        Raises:
            FleetError: engine `i` is still running, or the new process exited or did not listen within
                `startup_timeout_s` (its log tail quoted; the process stays in the fleet for `close`).
        """
        old = self.engines[i]
        if old.exited() is None:
            raise FleetError(f"{old.name} ({old.url}) is still running: only an exited engine is relaunched")
        new = self.engines[i] = _spawn(old.name, self.serve_argv, old.log_path)
        new.url = _wait_listening(new, time.monotonic() + startup_timeout_s, startup_timeout_s)
        return new

    def kill(self, i: int) -> None:
        """SIGKILL engine `i`'s process group and reap it (the kill_engine_* faults of --ci-ft-test-actions)."""
        proc = self.engines[i].proc
        _signal_group(proc, signal.SIGKILL)
        proc.wait()

    def unregister(self, url: str) -> bool:
        """Take the engine at `url` out of the router (`GET /workers` for its id, `DELETE /workers/{id}`), so
        that no request is routed to it; False when the router does not list it.

        Raises:
            HttpCallError: the router did not answer.
        """
        answer = call_json("GET", self.router_url + "/workers", None, timeout=10) or {}
        ids = [w.get("id") for w in answer.get("workers", []) if w.get("url") == url and w.get("id")]
        for worker_id in ids:
            call_json("DELETE", f"{self.router_url}/workers/{worker_id}", None, timeout=10)
        deadline = time.monotonic() + 30
        while ids and time.monotonic() < deadline:  # removal is an async job too
            answer = call_json("GET", self.router_url + "/workers", None, timeout=10) or {}
            if not any(w.get("url") == url for w in answer.get("workers", [])):
                break
            time.sleep(0.1)
        return bool(ids)

    def register(self, url: str, *, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        """Register the engine at `url` with the router (`POST /workers`) and wait until it is listed healthy.

        Raises:
            HttpCallError: the router did not answer; FleetError: it did not list `url` healthy in time.
        """
        call_json("POST", self.router_url + "/workers", {"url": url}, timeout=30)
        _wait_registered(self.router, [url], time.monotonic() + timeout_s, timeout_s)

    def failure_log(self, i: int, n: int) -> list[str]:
        """About `n` lines explaining engine `i`'s failure: its last log lines ("[engines/i.log] ...", without
        the router's probe noise `ROUTER_PROBE_NOISE`), then the router's last 3 ERROR/WARN lines about its URL
        ("[router.log] ..."), or "[router.log] (the router logged no error about URL)": its INFO lines
        ("status_code=200 ... finished processing request") explain nothing."""
        engine = self.engines[i]
        about = self.router.problems_about(engine.url, 3) if engine.url else []
        router = [f"[router.log] {line}" for line in about] or [
            f"[router.log] (the router logged no error about {engine.url or f'engine {i}'})"
        ]
        tail = log_tail(engine.log_path, max(1, n - len(router)), skip=ROUTER_PROBE_NOISE)
        return [f"[engines/{i}.log] {line}" for line in tail] + router

    def dead(self, skip: Collection[int] = ()) -> list[FleetProcess]:
        """The fleet's processes that have exited (router first), but for the engines numbered in `skip`
        (those being restarted: their process is replaced from another thread)."""
        engines = [p for k, p in enumerate(self.engines) if k not in skip]
        return [p for p in (self.router, *engines) if p.exited() is not None]

    def close(self) -> None:
        """SIGTERM every process group, SIGKILL what is left after `STOP_GRACE_S`; idempotent."""
        if self._closed:
            return
        self._closed = True
        procs = [p.proc for p in (self.router, *self.engines)]
        for proc in procs:
            _signal_group(proc, signal.SIGTERM)
            _signal_group(proc, signal.SIGCONT)  # a stopped (hung) process acts on SIGTERM once resumed
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(proc, signal.SIGKILL)  # anything the process started, and the process if alive
            proc.wait()
        atexit.unregister(self.close)


def _signal_group(proc: subprocess.Popen, sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)  # its own session: the group id is its pid
    except (ProcessLookupError, PermissionError):
        pass


def _startup_failure(p: FleetProcess, why: str) -> FleetError:
    """The error for a process that did not start, quoting the last lines it wrote (a relaunched engine's
    log holds its earlier process's lines first: they are not its)."""
    lines = [_strip_ansi(line) for line in p.new_log_lines()[-15:]]
    tail = "\n".join(f"  {line}" for line in lines) or "  (its log is empty)"
    return FleetError(f"{p.name} {why}; the last lines of {p.log_path}:\n{tail}")


def _wait_listening(p: FleetProcess, deadline: float, timeout: float) -> str:
    """The URL `grpolab serve` announces in its log; FleetError when it exits or the deadline passes."""
    while time.monotonic() < deadline:
        for line in p.new_log_lines():
            if LISTENING in line:
                return line.split(LISTENING, 1)[1].strip()
        if p.exited() is not None:
            raise _startup_failure(p, f"exited with code {p.proc.returncode} while starting")
        time.sleep(0.2)
    raise _startup_failure(p, f"did not start listening within {timeout:g} s")


def _wait_router(p: FleetProcess, deadline: float, timeout: float) -> None:
    """Wait for the router's `/health` (liveness) to answer 200."""
    while time.monotonic() < deadline:
        if p.exited() is not None:
            raise _startup_failure(p, f"exited with code {p.proc.returncode} while starting")
        try:
            call_json("GET", p.url + "/health", None, timeout=5)
            return
        except HttpCallError:
            time.sleep(0.2)
    raise _startup_failure(p, f"at {p.url} did not answer /health within {timeout:g} s")


def _wait_registered(p: FleetProcess, urls: list[str], deadline: float, timeout: float) -> None:
    """Poll `GET /workers` until every url is listed healthy."""
    listed: dict = {}
    while time.monotonic() < deadline:
        answer = call_json("GET", p.url + "/workers", None, timeout=10)
        listed = {w.get("url"): w.get("is_healthy") for w in (answer or {}).get("workers", [])}
        if all(listed.get(u) for u in urls):
            return
        time.sleep(0.2)
    missing = [u for u in urls if not listed.get(u)]
    raise _startup_failure(p, f"did not list {missing} as healthy workers within {timeout:g} s")
