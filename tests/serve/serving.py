"""Helpers for tests/serve: `grpolab serve` in a subprocess, a small HTTP client, SGLang's JSON contract.

The contract is the real `sglang/api/v1/api_types.py` of the SGLang 0.5.23 wheel, unpacked beside
the environment (`pip install --no-deps --target .whl/sglang sglang==0.5.23`, the README's test
command: installed into the environment, sglang's unmet CUDA requirements would make `pip check` and
every later `pip install` there complain). It imports only msgspec and is loaded by file path because
`import sglang` needs the whole server stack.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

STARTUP_TIMEOUT_S = 120


CONTRACT = Path(__file__).resolve().parents[2] / ".whl" / "sglang" / "sglang" / "api" / "v1" / "api_types.py"
"""Where the README's test command unpacks SGLang's contract (an sglang installed into the
environment is used when this is absent)."""


def load_contract() -> ModuleType:
    """`sglang.api.v1.api_types` of the sglang 0.5.23 wheel, without importing `sglang`."""
    path = CONTRACT
    if not path.is_file():
        spec = importlib.util.find_spec("sglang")
        assert spec is not None and spec.submodule_search_locations, (
            "SGLang's contract is missing: pip install --no-deps --target .whl/sglang sglang==0.5.23 "
            "(the README's test command)"
        )
        path = Path(spec.submodule_search_locations[0]) / "api" / "v1" / "api_types.py"
    mod_spec = importlib.util.spec_from_file_location("sglang_api_types", path)
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules["sglang_api_types"] = module  # msgspec resolves the Structs' annotations through it
    mod_spec.loader.exec_module(module)
    return module


@dataclass
class Answer:
    status: int
    body: object
    text: str


@dataclass
class Server:
    """A running `grpolab serve` process."""

    url: str
    proc: subprocess.Popen
    api_key: str | None = None

    def call(
        self,
        path: str,
        body: object = None,
        *,
        method: str | None = None,
        key: str | None = "default",
        timeout: float = 60,
    ) -> Answer:
        """One HTTP call; the JSON body is decoded when the answer is JSON."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path, data=data, method=method or ("GET" if body is None else "POST")
        )
        req.add_header("Content-Type", "application/json")
        token = self.api_key if key == "default" else key
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        text = raw.decode()
        try:
            parsed = json.loads(text) if text else None
        except json.JSONDecodeError:
            parsed = None
        return Answer(status, parsed, text)


def start_server(model: Path, *extra: str) -> Server:
    """Start `grpolab serve --port 0` and wait for its "listening on" line."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "grpolab", "serve", "--hf-checkpoint", str(model), "--port", "0", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    lines = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "listening on " in line:
            key = extra[extra.index("--api-key") + 1] if "--api-key" in extra else None
            return Server(line.split("listening on ", 1)[1].strip(), proc, key)
    proc.kill()
    raise AssertionError("grpolab serve did not start:\n" + "".join(lines))


def stop_server(server: Server) -> int:
    """SIGTERM the server and return its exit code (143 after its graceful shutdown)."""
    server.proc.terminate()
    try:
        return server.proc.wait(timeout=30)
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
