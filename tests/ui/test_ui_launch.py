"""`grpolab ui`: argument parsing and the streamlit command line (no server started here)."""

from __future__ import annotations

import sys
from pathlib import Path

from grpolab.cli import build_parser, main
from grpolab.ui.launch import APP, streamlit_command


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
