"""Stopping `grpolab serve` while it holds requests (a trainer's paused rollout)."""

from __future__ import annotations

import signal
import threading
import time

from serving import start_server, stop_server


def test_sigterm_with_a_held_request_stops_the_server_and_answers_it_with_an_abort(tiny_model_dir):
    """uvicorn waits for every open request before it stops; a request held by /pause_generation never
    finished, so SIGTERM left the process running (it stopped listening, nothing could resume it)."""
    s = start_server(tiny_model_dir)
    answers = []
    try:
        assert s.call("/pause_generation", {"mode": "in_place"}).status == 200
        body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}}
        client = threading.Thread(target=lambda: answers.append(s.call("/generate", body)))
        client.start()
        deadline = time.monotonic() + 30
        while s.call("/server_info").body["internal_states"][0]["waiting_requests"] < 1:
            assert time.monotonic() < deadline, "the request never reached the server"
            time.sleep(0.05)
        start = time.monotonic()
        code = stop_server(s)  # SIGTERM, waits up to 30 s
        assert code == 143 and time.monotonic() - start < 10
        client.join(timeout=10)
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
    assert len(answers) == 1 and answers[0].status == 200
    reason = answers[0].body["meta_info"]["finish_reason"]
    assert reason["type"] == "abort" and "shutting down" in reason["message"]


def test_ctrl_c_and_sigterm_exit_130_and_143_with_one_line(tiny_model_dir):
    """Ctrl+C died by the re-raised SIGINT with a KeyboardInterrupt traceback (and SIGTERM by the
    signal): now 128 + the signal's number, as `grpolab train`, and one line saying which."""
    for sig, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        s = start_server(tiny_model_dir)
        s.proc.send_signal(sig)
        rest, _ = s.proc.communicate(timeout=30)
        assert s.proc.returncode == code, rest
        assert rest.strip().splitlines()[-1] == f"grpolab serve: stopped by {sig.name}"
        assert "Traceback" not in rest
