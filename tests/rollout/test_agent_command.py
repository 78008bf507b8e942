"""`grpolab agent run` against a live server of the tool-calling fixture (serve/embedded.py in this
process: the same app as `grpolab serve`), and its bad input."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from grpolab.cli import main
from grpolab.core.engine.torch_engine import TorchEngine
from grpolab.core.modeling import load_tokenizer, model_fingerprint, stop_token_ids
from grpolab.core.turns.episode import KEY
from grpolab.replay.recording import load_rollout
from grpolab.serve.embedded import serve_engine

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "fixtures" / "tiny-qwen3-tools"
PROMPTS = REPO / "fixtures" / "data" / "arithmetic_test.jsonl"
AGENT = "grpolab.examples.calculator.agent.run"


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    tok = load_tokenizer(MODEL)
    engine = TorchEngine(str(MODEL), show_progress=False)
    facts = {"eos_ids": stop_token_ids(MODEL, tok), "vocab_size": len(tok), "context_len": 512}
    with serve_engine(engine, model_path=str(MODEL), tokenizer=tok, fingerprint=model_fingerprint(MODEL),
                      weight_version=0, **facts) as url:  # fmt: skip
        yield url


def test_agent_run_prints_every_turn_and_records_the_rollout(
    server: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "episodes.grz"
    argv = ["agent", "run", "--agent", AGENT, "--server", server, "--prompt-data", str(PROMPTS),
            "--num-prompts", "3", "--n-samples-per-prompt", "2", "--save-debug-rollout-data", str(out)]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "turn 1 model" in text and "turn 1 tool" in text and "6 episodes, mean reward" in text
    samples = load_rollout(out).samples
    assert [(s.group_index, s.sample_index) for s in samples] == [(g, k) for g in range(3) for k in range(2)]
    assert all(s.metadata[KEY]["finish_reasons"] for s in samples)
    assert main(["check", "turns", str(out), "--hf-checkpoint", str(MODEL)]) == 0
    assert main(argv) == 2  # the recording exists: nothing is overwritten without --force
    assert "exists; pass --force" in capsys.readouterr().err
    assert main([*argv, "--force"]) == 0
    folder = tmp_path / "a-folder"
    (folder / "kept.txt").parent.mkdir()
    (folder / "kept.txt").write_text("mine")
    assert main([*argv[:-1], str(folder), "--force"]) == 2  # --force replaces a recording, not a folder
    assert "is a directory; give the recording file" in capsys.readouterr().err
    assert (folder / "kept.txt").read_text() == "mine"
    template = ["--save-debug-rollout-data", str(tmp_path / "ep_{rollout_id}.grz")]  # a training template
    assert main([*argv[:-2], *template]) == 0 and load_rollout(tmp_path / "ep_0.grz").samples


def test_agent_run_bad_input(server: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    base = ["agent", "run", "--prompt-data", str(PROMPTS), "--num-prompts", "1"]
    cases = [
        (["--agent", AGENT, "--server", "http://127.0.0.1:9"], 2, "no answer from /model_info"),
        (["--agent", "no_such_agent.run", "--server", server], 2, "cannot import module 'no_such_agent'"),
        (["--agent", AGENT, "--server", server, "--num-prompts", "0"], 2, "must be >= 1"),
        (["--agent", "agent_tools.agent_silent", "--server", server], 1, "the agent sent no chat request"),
    ]
    for extra, code, message in cases:
        assert main([*base, *extra]) == code, extra
        assert message in capsys.readouterr().err


def test_a_server_without_sessions_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A server that answers /model_info but has no /sessions route (a plain HTTP server)."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body, code = (
                (json.dumps({"model_path": str(MODEL)}).encode(), 200)
                if self.path == "/model_info"
                else (b"Not Found", 404)
            )
            self.send_response(code)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        assert main(["agent", "run", "--agent", AGENT, "--server", url, "--prompt-data", str(PROMPTS)]) == 2
        assert "serves no /sessions" in capsys.readouterr().err
    finally:
        httpd.shutdown()


def test_agent_run_interrupted_ends_in_one_line(server: str, tmp_path: Path) -> None:
    """Ctrl+C mid-episode (or while importing, on a slow machine): 130 and one line, never a traceback
    (before: one per episode, as their sessions' calls failed after the loop shut down)."""
    import signal
    import subprocess
    import sys
    import time

    argv = [sys.executable, "-m", "grpolab", "agent", "run", "--agent", "agent_tools.agent_sleeps", "--server", server,
            "--prompt-data", str(PROMPTS), "--num-prompts", "8", "--n-samples-per-prompt", "2"]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    time.sleep(6)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err and "interrupted" in err, err
