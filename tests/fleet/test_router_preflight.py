"""The rollout servers are checked in `grpolab train`'s preflight: an unreachable `--sglang-router-ip`, an
address that answers but is no sglang-router, a router without engines and a taken `--sglang-router-port`
exit 2 before any run directory exists and before torch or transformers is imported (they answered after
~6.7 s, with a run directory of status failed, before). No real router is needed: a fake one is a
stdlib HTTP server in this process.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from runs import cli_in_fresh_process

from grpolab.cli import build_parser
from grpolab.core.config.flags import config_from_args
from grpolab.core.engine.factory import router_url, running_fleet_engines
from grpolab.core.engine.fleet import Fleet, PortInUseError
from grpolab.train.preflight import check_inputs, check_rollout_servers

TRAIN_USAGE = "usage: grpolab train [--FLAG VALUE ...]"


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _server(status: int, body: str, content_type: str = "application/json") -> Iterator[str]:
    """An HTTP server on loopback answering every GET with `status` and `body`; yields its URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _train(tmp_path: Path, *flags: str) -> tuple[int, list[str], str]:
    """(exit code, heavy modules imported, stderr) of `grpolab train --run-dir tmp/run --save tmp/ckpt FLAGS`
    in a fresh interpreter; the run directory must not exist afterwards, and the existing --save folder
    must hold only what it held."""
    save = tmp_path / "ckpt"
    save.mkdir()
    (save / "note.txt").write_text("mine")
    rec = tmp_path / "rec" / "r_{rollout_id}.grz"
    argv = ["train", "--run-dir", str(tmp_path / "run"), "--save", str(save)]
    argv += ["--save-debug-rollout-data", str(rec), *flags]
    code, heavy, proc = cli_in_fresh_process(argv, tmp_path)
    assert not (tmp_path / "run").exists(), "a run directory was made for a bad router flag"
    assert [p.name for p in save.iterdir()] == ["note.txt"] and (save / "note.txt").read_text() == "mine"
    assert not (tmp_path / "rec").exists()
    assert not (tmp_path / "runs").exists()
    return code, heavy, proc.stderr


def _router_flags(url: str) -> list[str]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return ["--sglang-router-ip", host, "--sglang-router-port", port]


def test_an_unreachable_router_answers_before_the_run_directory_and_torch(tmp_path: Path) -> None:
    port = _closed_port()
    code, heavy, err = _train(tmp_path, "--sglang-router-ip", "127.0.0.1", "--sglang-router-port", str(port))
    assert (code, heavy) == (2, []), err
    url = f"http://127.0.0.1:{port}"
    lines = err.strip().splitlines()
    assert lines[0].startswith(TRAIN_USAGE) and len(lines) == 2, err
    assert lines[1].startswith(
        f"grpolab train: error: --sglang-router-ip/--sglang-router-port: no router answers at {url}: "
        f"GET {url}/workers: no answer: "
    ), err
    assert "importing torch" not in err


def test_a_taken_router_port_answers_before_the_run_directory_and_torch(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        code, heavy, err = _train(tmp_path, "--rollout-num-engines", "1", "--sglang-router-port", str(port))
    assert (code, heavy) == (2, []), err
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith(f"grpolab train: error: --sglang-router-port {port}: 127.0.0.1:{port} is in use (")
    ), err
    assert not (tmp_path / "engines").exists() and not (tmp_path / "router.log").exists()


@pytest.mark.parametrize(
    ("status", "body", "content_type", "expected"),
    [
        (
            404,
            "<html><head><title>Nope</title></head></html>",
            "text/html",
            "the server at {url} is not an sglang-router: GET {url}/workers: HTTP 404: an HTML page titled 'Nope' "
            "(not an sglang-router: GET /workers did not answer JSON)",
        ),
        (
            200,
            '{"detail": "an API, not a router"}',
            "application/json",
            'the server at {url} is not an sglang-router: GET /workers answered {{"detail": "an API, not a '
            'router"}}; a router answers {{"workers": [...]}}',
        ),
        (
            200,
            "[1, 2]",
            "application/json",
            "the server at {url} is not an sglang-router: GET /workers answered [1, 2]; a router answers "
            '{{"workers": [...]}}',
        ),
        (
            200,
            '{"workers": [], "total": 0}',
            "application/json",
            "the router at {url} has no engines registered (GET /workers is empty)",
        ),
    ],
    ids=["html_404", "json_object", "json_list", "no_engines"],
)
def test_an_address_that_is_no_router_with_engines_answers_before_the_run_directory(
    tmp_path: Path, status: int, body: str, content_type: str, expected: str
) -> None:
    with _server(status, body, content_type) as url:
        code, heavy, err = _train(tmp_path, *_router_flags(url))
    assert (code, heavy) == (2, []), err
    message = err.strip().splitlines()[-1]
    assert message == "grpolab train: error: --sglang-router-ip/--sglang-router-port: " + expected.format(
        url=url
    ), err


def test_the_launcher_of_a_multi_rank_run_checks_before_torchrun(tmp_path: Path) -> None:
    """--nproc-per-node 2: the process that would start torchrun answers, so no rank ever starts."""
    port = _closed_port()
    flags = ["--nproc-per-node", "2", "--sglang-router-ip", "127.0.0.1", "--sglang-router-port", str(port)]
    code, heavy, err = _train(tmp_path, *flags)
    assert (code, heavy) == (2, []), err
    assert f"no router answers at http://127.0.0.1:{port}" in err and "torchrun" not in err


def _config(*flags: str):
    return config_from_args(build_parser().parse_args(["train", *flags]))


def test_only_rank_0_checks_the_servers(tmp_path: Path) -> None:
    """Ranks > 0 build no engine on a server run; a port check on two ranks at once could see each other's
    bind. Rank 1 passes with an unreachable router; rank 0 does not."""
    config = _config("--sglang-router-ip", "127.0.0.1", "--sglang-router-port", str(_closed_port()))
    check_inputs(config, world_size=2, rank=1)
    with pytest.raises(ValueError, match="no router answers at"):
        check_inputs(config, world_size=2, rank=0)


def test_a_router_with_an_engine_passes_and_the_later_check_words_failures_the_same(tmp_path: Path) -> None:
    """The check at engine build time (`running_fleet_engines`) calls the preflight's function: a router
    that went away between the two gives the same message."""
    answer = json.dumps({"workers": [{"url": "http://127.0.0.1:1", "is_healthy": True}]})
    with _server(200, answer) as url:
        check_rollout_servers(_config(*_router_flags(url)))  # no error: an sglang-router listing an engine
    # the server is gone now: build time says what preflight would
    with pytest.raises(ValueError) as preflight:
        check_rollout_servers(_config(*_router_flags(url)))
    with pytest.raises(ValueError) as later:
        running_fleet_engines(url, "unused: the router is asked first")
    assert str(preflight.value) == str(later.value) and f"no router answers at {url}" in str(later.value)


def test_the_port_check_of_launch_is_the_preflights(tmp_path: Path, tiny_model_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        config = _config("--rollout-num-engines", "1", "--sglang-router-port", str(port))
        with pytest.raises(PortInUseError) as preflight:
            check_rollout_servers(config)
        with pytest.raises(PortInUseError) as later:
            Fleet.launch(checkpoint=str(tiny_model_dir), num_engines=1, run_dir=tmp_path, router_port=port)
    assert str(preflight.value) == str(later.value)
    assert str(later.value).startswith(f"--sglang-router-port {port}: 127.0.0.1:{port} is in use")


def test_router_url_brackets_an_ipv6_address() -> None:
    assert router_url("10.0.0.5", 30000) == "http://10.0.0.5:30000"
    assert router_url("router.local", 8) == "http://router.local:8"
    assert router_url("::1", 30000) == "http://[::1]:30000"
