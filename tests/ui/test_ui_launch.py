"""`grpolab ui`: argument parsing, the streamlit command line, and what is said before serving (no server
started here)."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

from grpolab.cli import build_parser, main
from grpolab.ui import launch
from grpolab.ui.launch import APP, missing_roots, port_problem, streamlit_command


def test_parser_defaults_and_roots(tmp_path: Path) -> None:
    args = build_parser().parse_args(["ui"])
    assert (args.command, args.roots, args.host, args.port) == ("ui", ["runs"], "127.0.0.1", 8501)
    args = build_parser().parse_args(
        ["ui", str(tmp_path), "logs/x.log", "--port", "9000", "--host", "0.0.0.0"]
    )
    assert args.roots == [str(tmp_path), "logs/x.log"] and args.port == 9000 and args.host == "0.0.0.0"


def test_streamlit_command_binds_loopback_and_passes_roots(tmp_path: Path) -> None:
    cmd = streamlit_command([str(tmp_path)], "127.0.0.1", 8599)
    assert cmd[:5] == [sys.executable, "-m", "streamlit", "run", str(APP)]
    flags = dict(zip(cmd[5:15:2], cmd[6:15:2]))
    assert flags == {
        "--server.address": "127.0.0.1",
        "--server.port": "8599",
        "--server.headless": "true",
        "--browser.gatherUsageStats": "false",
        "--client.toolbarMode": "minimal",
    }
    assert cmd[15:] == ["--", str(tmp_path.resolve())]
    assert APP.is_file() and APP.name == "app.py"


def test_bad_port_is_refused(capsys) -> None:
    assert main(["ui", "--port", "70000"]) == 2
    assert "--port must be 1..65535" in capsys.readouterr().err


def test_port_in_use_is_an_error_before_serving(capsys, tmp_path: Path) -> None:
    """It printed "serving ... at http://..." and then Streamlit failed on the taken port: the error
    now comes first, exit 2, and no server is started."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["ui", str(tmp_path), "--port", str(port)]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""  # nothing says "serving"
        assert captured.err == (
            f"grpolab ui: error: --port {port}: already in use on 127.0.0.1 (another grpolab ui?); "
            "pick another --port\n"
        )
        assert port_problem("127.0.0.1", port) is not None
    assert port_problem("127.0.0.1", port) is None  # free again once the listener closed
    assert "cannot resolve it" in (port_problem("no-such-host.invalid", port) or "")


def test_missing_root_is_warned_on_the_terminal(capsys, tmp_path: Path, monkeypatch) -> None:
    """A RUNS_ROOT that does not exist printed nothing on the terminal: it is warned on stderr, before
    "serving"; the server still starts (the app looks again on every page load)."""
    started: list[list[str]] = []

    class FakeServer:  # stands in for the Streamlit process: records its command, exits at once
        def __init__(self, cmd: list[str]) -> None:
            started.append(cmd)

        def wait(self) -> int:
            return 0

    monkeypatch.setattr(launch.subprocess, "Popen", FakeServer)
    monkeypatch.setattr(launch, "port_problem", lambda host, port: None)
    gone = tmp_path / "gone"
    assert main(["ui", str(gone), str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert captured.err == (
        f"grpolab ui: warning: RUNS_ROOT {gone} does not exist; nothing to show from it until it does\n"
    )
    assert captured.out.startswith(f"grpolab ui: serving {gone}, {tmp_path} at http://127.0.0.1:8501")
    assert len(started) == 1 and started[0][-2:] == [str(gone), str(tmp_path.resolve())]
    assert missing_roots([str(gone), str(tmp_path)]) == [str(gone)]
