"""The HTTP engine's bodies and parsing against SGLang's real contract; its flags and fast failures."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch

from grpolab.core.config import Config, DebugConfig, RolloutConfig
from grpolab.core.engine.base import GenerationRequest, SamplingParams
from grpolab.core.engine.factory import running_fleet_engines
from grpolab.core.engine.fleet import Fleet, PortInUseError, log_tail
from grpolab.core.engine.sglang_api import generate_body, parse_generate_answer, parse_mismatches
from grpolab.serve.protocol import GenerateItem
from grpolab.serve.responses import finish_reason_json, generate_response

PLAIN = SamplingParams(temperature=0.7, max_new_tokens=5, stop_token_ids=(2, 7))
FILTERED = SamplingParams(temperature=1.0, top_p=0.9, top_k=3, max_new_tokens=5)


@pytest.mark.parametrize("params", [PLAIN, FILTERED])
def test_generate_body_is_a_valid_sglang_request(contract, params: SamplingParams) -> None:
    body = generate_body(GenerationRequest(prompt_ids=[5, 6, 7], seed=2**62 + 3), params)
    contract.GenerateRequest.from_json_value(body)  # raises JsonContractError on what SGLang refuses
    sp = body["sampling_params"]
    assert sp["sampling_seed"] == 2**62 + 3 and body["return_logprob"] is True
    assert sp["top_k"] == (3 if params is FILTERED else -1)  # 0 would be SGLang's 400; -1 is "off"
    assert sp["stop_token_ids"] == list(params.stop_token_ids)
    assert sp.get("ignore_eos", False) is (not params.stop_token_ids)  # no stop ids: the server adds no EOS
    assert body.get("return_sampling_mask", False) is params.filters_support


def test_a_body_the_contract_refuses_fails_the_check(contract) -> None:
    body = generate_body(GenerationRequest(prompt_ids=[5], seed=1), PLAIN)
    body["sampling_params"]["seed"] = 1  # not SGLang's field name
    with pytest.raises(Exception, match="unknown field `seed`"):
        contract.GenerateRequest.from_json_value(body)


def _answer(params: SamplingParams, ids: list[int], logps: list[float], kept=None, version="3") -> dict:
    from grpolab.core.engine.base import GenerationResult

    result = GenerationResult(
        response_ids=ids,
        log_probs=torch.tensor(logps, dtype=torch.float32),
        finish_reason="stop" if ids[-1] in params.stop_token_ids else "length",
        kept_token_ids=kept,
    )
    item = GenerateItem(
        rid="r", prompt_ids=[1], params=params, seed=0, return_logprob=True,
        return_sampling_mask=params.filters_support,
    )  # fmt: skip
    return generate_response(item, result, weight_version=version, text="", vocab_size=10, seconds=0.1)


def test_parse_answer_gives_exact_float32_log_probs_finish_and_version(contract) -> None:
    logps = torch.tensor([-0.1234567, -2.5, -1e-7], dtype=torch.float32)
    answer = _answer(PLAIN, [4, 9, 7], logps.tolist())
    contract.GenerateResponse.from_json_value(answer)
    result = parse_generate_answer(answer, PLAIN, version=0)
    assert result.response_ids == [4, 9, 7] and result.finish_reason == "stop"
    assert torch.equal(result.log_probs, logps)  # bitwise through JSON
    assert result.weight_version == 3 and result.kept_token_ids is None
    assert finish_reason_json(result, PLAIN) == {"type": "stop", "matched": 7}


def test_parse_answer_reads_kept_sets_and_refuses_missing_ones() -> None:
    kept = [torch.tensor([1, 4, 8]), torch.tensor([4])]
    answer = _answer(FILTERED, [4, 4], [-0.5, 0.0], kept=kept, version="default")
    result = parse_generate_answer(answer, FILTERED, version=5)
    assert [k.tolist() for k in result.kept_token_ids] == [[1, 4, 8], [4]]
    assert result.weight_version == 5 and result.finish_reason == "length"  # "default" is no number
    del answer["meta_info"]["output_token_sampling_mask"]  # what sglang-router 0.3.2 drops
    with pytest.raises(RuntimeError, match="output_token_sampling_mask"):
        parse_generate_answer(answer, FILTERED, version=5)


def test_an_aborted_answer_is_a_failure() -> None:
    answer = _answer(PLAIN, [4], [-0.5])
    answer["meta_info"]["finish_reason"] = {"type": "abort", "message": "Aborted by pause_generation."}
    with pytest.raises(RuntimeError, match="abort"):
        parse_generate_answer(answer, PLAIN, version=0)


def test_parse_mismatches_reads_the_servers_compare_message() -> None:
    msg = (
        "compare: 12 tensors differ from the snapshot: model.a.weight [4, 8] max_abs_err=0.5; "
        "lm_head.weight [10, 8] max_abs_err=1.25 (and 10 more)"
    )
    found = parse_mismatches(msg, engine=1)
    assert len(found) == 12
    assert (found[0].name, found[0].shape, found[0].max_abs_err) == ("engine1/model.a.weight", (4, 8), 0.5)
    assert found[1].max_abs_err == 1.25 and [m.name for m in found[2:]] == ["<unnamed>"] * 10


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rollout_engine": "sglang"}, "--rollout-engine sglang needs --rollout-num-engines"),
        ({"sglang_router_ip": "127.0.0.1"}, "--sglang-router-ip needs --sglang-router-port"),
        ({"sglang_router_port": 30000}, "--sglang-router-port needs --rollout-num-engines"),
        ({"rollout_num_engines": -1}, "--rollout-num-engines must be >= 0"),
        ({"rollout_num_engines": 1, "sglang_router_ip": "h", "sglang_router_port": 1}, "pass one"),
        ({"rollout_num_engines": 1, "sglang_router_port": 70000}, "1..65535"),
        # was "http://http://host:port": a bare host, as Miles takes it
        ({"sglang_router_ip": "http://h", "sglang_router_port": 1}, "--sglang-router-ip takes a bare host"),
        ({"sglang_router_ip": "http://[::1]", "sglang_router_port": 1}, "not a URL or host:port"),
        ({"sglang_router_ip": "h:30000", "sglang_router_port": 1}, "got 'h:30000'"),
    ],
)
def test_server_flags_that_disagree_are_flag_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RolloutConfig(**kwargs)


def test_a_bare_router_host_or_address_is_accepted() -> None:
    for host in ("10.0.0.5", "router.local", "::1"):
        assert RolloutConfig(sglang_router_ip=host, sglang_router_port=30000).sglang_router_ip == host


def test_server_flags_imply_the_sglang_engine_and_refuse_train_only(tmp_path) -> None:
    assert RolloutConfig(rollout_num_engines=2).rollout_engine == "sglang"
    assert RolloutConfig().rollout_engine == "torch" and not RolloutConfig().uses_servers
    rec = tmp_path / "r_{rollout_id}.rec"
    with pytest.raises(ValueError, match="--debug-train-only"):
        Config(
            rollout=RolloutConfig(rollout_num_engines=1), debug=DebugConfig(load_debug_rollout_data=str(rec))
        )
    # without a recording too: the engines conflict is named, not only the missing recording
    with pytest.raises(ValueError, match="--rollout-num-engines / --sglang-router-ip need a rollout engine"):
        Config(rollout=RolloutConfig(rollout_num_engines=2), debug=DebugConfig(debug_train_only=True))


def test_a_taken_router_port_fails_before_anything_starts(tmp_path, tiny_model_dir) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(PortInUseError, match=f"--sglang-router-port {port}: 127.0.0.1:{port} is in use"):
            Fleet.launch(checkpoint=str(tiny_model_dir), num_engines=1, run_dir=tmp_path, router_port=port)
    assert not (tmp_path / "engines").exists() and not (tmp_path / "router.log").exists()


def test_an_unreachable_router_is_a_flag_error(tiny_model_dir) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens on it after the with block
    with pytest.raises(
        ValueError,
        match=f"--sglang-router-ip/--sglang-router-port: no router answers at http://127.0.0.1:{port}",
    ):
        running_fleet_engines(f"http://127.0.0.1:{port}", str(tiny_model_dir))


def test_log_tail_strips_the_routers_colours(tmp_path) -> None:
    log = tmp_path / "router.log"
    log.write_text("a\n\x1b[2m2026\x1b[0m \x1b[32m INFO\x1b[0m ready\n")
    assert log_tail(log, 1) == ["2026  INFO ready"]
    assert log_tail(tmp_path / "missing.log", 3) == []


def test_an_engine_that_is_gone_fails_at_once_without_waiting_out_the_timeout() -> None:
    from grpolab.core.engine.client import EngineClient, EngineDeadError, EngineGoneError

    class Gone:
        name = "gone engine"

        def flush_cache(self) -> None:
            raise EngineGoneError("engine 0 (http://127.0.0.1:1) exited (killed by SIGKILL)")

        def log_tail(self, n: int = 20) -> list[str]:
            return ["[engines/0.log] last line"]

    slept: list[float] = []
    client = EngineClient(Gone(), failure_timeout=60, sleep=slept.append)  # type: ignore[arg-type]
    with pytest.raises(EngineDeadError, match=r"killed by SIGKILL") as info:
        client.flush_cache()
    assert (
        slept == [] and info.value.failed_for < 0.1 and info.value.log_tail == ["[engines/0.log] last line"]
    )
    # not "failed for 0.0 s": what went, in the words the log doctor's engine_gone verdict reads
    assert str(info.value).startswith(
        "rollout engine 'gone engine' is gone: engine 0 (http://127.0.0.1:1) exited (killed by SIGKILL)"
    )
    assert str(info.value).endswith("last engine log lines:\n  [engines/0.log] last line")


def test_log_tail_quotes_the_routers_lines_about_the_failing_engine_first(tmp_path) -> None:
    """A real router.log of a kill -9'd engine (tests/diagnose/router_logs/): the ERROR lines naming the
    engine's URL explain the failure and are quoted; its last lines (INFO, the graceful shutdown's) were
    quoted too and explained nothing; the router's gRPC probe noise in the engine's log is left out."""
    from grpolab.core.engine.fleet import FleetProcess

    logs = Path(__file__).resolve().parents[1] / "diagnose" / "router_logs"
    url = "http://127.0.0.1:36331"  # the killed engine in that log
    noise = "WARNING:  Invalid HTTP request received."
    (tmp_path / "0.log").write_text(f"engine line\n{noise}\n{noise}\n")
    fleet = Fleet.__new__(Fleet)  # the log files of a fleet, without processes (nothing to end at exit)
    fleet.engines = [FleetProcess("engine 0", None, tmp_path / "0.log", url=url)]  # type: ignore[arg-type]
    fleet.router = FleetProcess("router", None, logs / "killed_engine_router.log")  # type: ignore[arg-type]
    lines = fleet.failure_log(0, 10)
    assert lines[0] == "[engines/0.log] engine line" and len(lines) == 4, lines
    assert all("ERROR" in line and f"worker_url={url} " in line for line in lines[1:]), lines
    assert fleet.router.problems_about("http://127.0.0.1:3633", 3) == []  # a prefix of the URL is not it
    (tmp_path / "router.log").write_text(
        f"2026-12-01 INFO http_request{{status_code=200}}: finished processing request {url}/generate\n"
    )
    fleet.router = FleetProcess("router", None, tmp_path / "router.log")  # type: ignore[arg-type]
    assert fleet.failure_log(0, 10) == [
        "[engines/0.log] engine line",
        f"[router.log] (the router logged no error about {url})",
    ]


def test_a_web_server_that_is_not_a_router_is_named_so_in_one_line(tmp_path, tiny_model_dir) -> None:
    """A plain web server at the router address 404s GET /workers with an HTML page: the error quoted the
    whole page; it now quotes its title and says the address is not an sglang-router."""
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    (tmp_path / "index.html").write_text("<html><head><title>My site</title></head><body>hi</body></html>\n")
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(ValueError) as info:
            running_fleet_engines(url, str(tiny_model_dir))
        (tmp_path / "workers").write_text("<html><head><title>Workers page</title></head></html>\n")
        with pytest.raises(ValueError) as served:  # a 200 with a page is no router either
            running_fleet_engines(url, str(tiny_model_dir))
    finally:
        server.shutdown()
        server.server_close()
    message = str(info.value)
    assert message == (
        f"--sglang-router-ip/--sglang-router-port: the server at {url} is not an sglang-router: "
        f"GET {url}/workers: HTTP 404: "
        "an HTML page titled 'Error response' (not an sglang-router: GET /workers did not answer JSON)"
    )
    assert str(served.value).endswith(
        "HTTP 200: an HTML page titled 'Workers page' (not an sglang-router: GET /workers did not answer JSON)"
    )
