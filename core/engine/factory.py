"""Build the run's rollout engine from the config: one registry of engine kinds, one client around it.

`build_engine(config)` builds the engine kind `--rollout-engine` names ("torch", the in-process
`TorchEngine`; "sglang", the HTTP engine over SGLang-API servers behind a router, which
`--rollout-num-engines N` launches (`fleet.py`) or `--sglang-router-ip/--sglang-router-port` names)
and wraps it in `client.EngineClient`, so every call fails after `--engine-failure-timeout` whatever
the engine is. Adding an engine is one module with a `(Config) -> RolloutEngine` builder plus one
`ENGINES.register(...)` line here; what only some engines can do is an optional capability in
`base.py` that callers test for.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

from grpolab.core.config import Config
from grpolab.core.engine.base import RolloutEngine
from grpolab.core.engine.client import EngineClient
from grpolab.core.registry import Registry

EngineBuilder = Callable[[Config], RolloutEngine]
"""Builds one engine kind from the run's config (raises ValueError naming the flag on bad settings)."""

ENGINES: Registry[EngineBuilder] = Registry("rollout engine kind", flag="--rollout-engine")
"""The engine kinds `build_engine` knows, by name."""


def torch_engine(config: Config) -> RolloutEngine:
    """The in-process `TorchEngine` on `--device` with `--rollout-dtype`, its own copy of `--hf-checkpoint`.

    Raises:
        ValueError: an unknown `--rollout-dtype`, or a checkpoint that is not a model.
        FileNotFoundError: `--hf-checkpoint` does not exist.
    """
    from grpolab.core.dtypes import parse_dtype  # the engine's imports (transformers) only when one is built
    from grpolab.core.engine.torch_engine import TorchEngine

    model = config.model
    engine = TorchEngine(
        model.hf_checkpoint,
        dtype=parse_dtype(model.rollout_dtype, "--rollout-dtype"),
        device=model.device,
        show_progress=config.run.show_progress,
        decode_path=model.rollout_decode_path,  # type: ignore[arg-type]  (validated by ModelConfig)
        true_on_policy=model.true_on_policy_mode,
    )
    log.info(
        f"the engine decodes with {engine.forward_name} (--rollout-decode-path {model.rollout_decode_path})"
    )
    return engine


ENGINES.register("torch")(torch_engine)

log = logging.getLogger("grpolab")
ROUTER_TIMEOUT_S = 10.0
"""Seconds the router at --sglang-router-ip may take to list its workers or an engine its /model_info."""


def sglang_engine(config: Config) -> RolloutEngine:
    """`HttpEngine` over `--rollout-num-engines` launched `grpolab serve` engines + sglang-router, or over
    the running fleet at `--sglang-router-ip:--sglang-router-port` (its engines must serve the model
    of `--hf-checkpoint`: compared by `/model_info`'s `model_fingerprint` where an engine reports one).
    On a multi-rank run only rank 0 builds it and generates for every rank (rollout/central.py).

    Raises:
        ValueError: a taken `--sglang-router-port`, an unreachable router, a router without engines,
            or a fleet serving another model.
        fleet.FleetError: a launched engine or the router did not start (its log tail quoted).
    """
    from grpolab.core.engine.fleet import Fleet
    from grpolab.core.engine.http_engine import HttpEngine

    rollout, model = config.rollout, config.model
    timeout = rollout.sglang_router_request_timeout_secs
    if rollout.rollout_num_engines:
        assert config.run.run_dir is not None  # open_run names it before the engine is built
        fleet = Fleet.launch(
            checkpoint=model.hf_checkpoint,
            num_engines=rollout.rollout_num_engines,
            run_dir=Path(config.run.run_dir),
            device=model.device,
            dtype=model.rollout_dtype,
            decode_path=model.rollout_decode_path,
            num_threads=config.run.num_threads,
            router_port=rollout.sglang_router_port,
            request_timeout_s=timeout,
            true_on_policy=model.true_on_policy_mode,
        )
        log.info(
            f"engine fleet: router {fleet.router_url}, engines {', '.join(e.url for e in fleet.engines)}"
        )
        urls = [e.url for e in fleet.engines]
        return HttpEngine(
            router_url=fleet.router_url,
            engine_urls=urls,
            fleet=fleet,
            request_timeout_s=timeout,
            failure_timeout_s=rollout.engine_failure_timeout,
        )
    assert rollout.sglang_router_ip is not None and rollout.sglang_router_port is not None  # RolloutConfig
    router = router_url(rollout.sglang_router_ip, rollout.sglang_router_port)
    urls = running_fleet_engines(router, model.hf_checkpoint, true_on_policy=model.true_on_policy_mode)
    return HttpEngine(
        router_url=router,
        engine_urls=urls,
        fleet=None,
        request_timeout_s=timeout,
        failure_timeout_s=rollout.engine_failure_timeout,
    )


ROUTER_FLAGS = "--sglang-router-ip/--sglang-router-port"
"""The flags that name a running router, as its error messages name them."""


def router_url(host: str, port: int) -> str:
    """The base URL of the router at `--sglang-router-ip host` and `--sglang-router-port port`
    ("http://10.0.0.5:30000"; an IPv6 address in brackets: "http://[::1]:30000")."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def router_engine_urls(router: str) -> list[str]:
    """The engine URLs the sglang-router at `router` lists (`GET /workers`, `ROUTER_TIMEOUT_S` at most).

    Called by `grpolab train`'s preflight (train/preflight.py: before any run directory or torch
    import) and again when the engine is built (`running_fleet_engines`), since a fleet can go
    between the two; each message below is built here only. Imports no torch.

    Raises:
        ValueError: naming the flags and `router`: nothing answers there; the server there is no
            sglang-router (an error status, or an answer that is not `{"workers": [...]}`, quoted);
            or the router lists no engine.
    """
    from grpolab.core.engine.http_calls import HttpCallError, call_json

    try:
        answer = call_json("GET", router + "/workers", None, timeout=ROUTER_TIMEOUT_S)
    except HttpCallError as e:
        if e.status is None:  # refused, reset, timed out
            raise ValueError(f"{ROUTER_FLAGS}: no router answers at {router}: {e}") from None
        raise ValueError(f"{ROUTER_FLAGS}: the server at {router} is not an sglang-router: {e}") from None
    except ValueError as e:  # it answered, but not JSON
        raise ValueError(f"{ROUTER_FLAGS}: the server at {router} is not an sglang-router: {e}") from None
    workers = answer.get("workers") if isinstance(answer, dict) else None
    if not isinstance(workers, list):
        raise ValueError(
            f"{ROUTER_FLAGS}: the server at {router} is not an sglang-router: GET /workers answered "
            f'{_quoted(answer)}; a router answers {{"workers": [...]}}'
        )
    urls = [w["url"] for w in workers if isinstance(w, dict) and isinstance(w.get("url"), str)]
    if not urls:
        raise ValueError(
            f"{ROUTER_FLAGS}: the router at {router} has no engines registered (GET /workers is empty)"
        )
    return urls


def _quoted(answer: object) -> str:
    """A decoded JSON answer as one line of at most `http_calls.ONE_LINE` characters, for messages."""
    from grpolab.core.engine.http_calls import ONE_LINE

    if answer is None:
        return "nothing"
    text = json.dumps(answer)
    return text if len(text) <= ONE_LINE else text[:ONE_LINE] + "..."


def running_fleet_engines(router: str, checkpoint: str, *, true_on_policy: bool = False) -> list[str]:
    """The engine URLs the router at `router` lists (`router_engine_urls`), each checked to serve
    `checkpoint`'s model and, with `true_on_policy` (`--true-on-policy-mode`), to re-score its answers
    by prefill (`/server_info`'s `true_on_policy_mode`, which `grpolab serve --true-on-policy-mode` reports).

    Raises:
        ValueError: from `router_engine_urls`; an engine does not answer `/model_info`, or its
            `model_fingerprint` differs from `checkpoint`'s (both named); with `true_on_policy`, an
            engine that does not report the mode.
    """
    from grpolab.core.engine.http_calls import HttpCallError, call_json
    from grpolab.core.modeling import model_fingerprint

    urls = router_engine_urls(router)
    ours = model_fingerprint(checkpoint)
    for url in urls:
        try:
            info = call_json("GET", url + "/model_info", None, timeout=ROUTER_TIMEOUT_S)
        except (HttpCallError, ValueError) as e:
            raise ValueError(
                f"{ROUTER_FLAGS}: engine {url} (listed by the router) does not answer: {e}"
            ) from None
        info = info if isinstance(info, dict) else {}
        theirs = info.get("model_fingerprint")
        if theirs is None:
            log.warning(
                f"warning: engine {url} reports no model_fingerprint (a real SGLang): the model it "
                f"serves ({info.get('model_path')!r}) is not checked against --hf-checkpoint {checkpoint}"
            )
        elif theirs != ours:
            raise ValueError(
                f"--hf-checkpoint {checkpoint} (fingerprint {ours}) is not the model engine {url} serves "
                f"({info.get('model_path')!r}, fingerprint {theirs}); weight sync would load into the wrong model"
            )
        if true_on_policy:
            _check_true_on_policy(url)
    return urls


def _check_true_on_policy(url: str) -> None:
    """Refuse an engine whose `/server_info` does not report `true_on_policy_mode: true`.

    Raises:
        ValueError: naming the engine and how to start one that does.
    """
    from grpolab.core.engine.http_calls import HttpCallError, call_json

    try:
        info = call_json("GET", url + "/server_info", None, timeout=ROUTER_TIMEOUT_S)
    except (HttpCallError, ValueError) as e:
        raise ValueError(f"--true-on-policy-mode: engine {url} does not answer /server_info: {e}") from None
    if not (isinstance(info, dict) and info.get("true_on_policy_mode") is True):
        raise ValueError(
            f"--true-on-policy-mode: engine {url} does not report true_on_policy_mode in /server_info, so its "
            "log-probs are the decode's, not a batch-invariant prefill's; start it with "
            "`grpolab serve --true-on-policy-mode` (a real SGLang server is not supported in this mode)"
        )


ENGINES.register("sglang")(sglang_engine)


def build_engine(config: Config) -> RolloutEngine:
    """The `--rollout-engine` kind, behind an `EngineClient` that gives up after `--engine-failure-timeout` s.

    Raises:
        ValueError: an unknown `--rollout-engine` (listing the registered kinds), a non-positive
            `--engine-failure-timeout`, or whatever the kind's builder rejects.
    """
    engine = ENGINES.get(config.rollout.rollout_engine)(config)
    return EngineClient(engine, failure_timeout=config.rollout.engine_failure_timeout)
