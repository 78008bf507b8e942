"""`grpolab serve`'s app over an engine this process already holds, on 127.0.0.1, for one `with` block.

What a custom generate function or an agent workflow of a run on the in-process engine talks to: the
same routes as `grpolab serve` (`/generate`, `/v1/chat/completions`, `/sessions`), so a Miles generate
function that posts to `http://{args.sglang_router_ip}:{args.sglang_router_port}/generate` and an agent
that speaks OpenAI chat run unchanged against the run's own engine and weights. It binds the loopback
address on a free port (nothing off this machine reaches it) and so needs no key; uvicorn runs on a
daemon thread with its own event loop, the engine is called from the batcher's one engine thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from grpolab.core.engine.base import RolloutEngine

START_TIMEOUT_S = 30.0
"""Seconds the server may take to accept connections before the run fails (uvicorn starts in ~0.1 s)."""


@contextmanager
def serve_engine(
    engine: RolloutEngine, *, model_path: str, tokenizer: Any, eos_ids: tuple[int, ...], vocab_size: int,
    context_len: int, fingerprint: str, weight_version: int,
) -> Iterator[str]:  # fmt: skip
    """Serve `engine` on 127.0.0.1 (a free port) while the block runs; yields its base URL.

    Args:
        engine: any rollout engine (only `generate` is called, from one thread).
        model_path / tokenizer / eos_ids / vocab_size / context_len / fingerprint: the model facts the
            routes report and use (chat templates, stop ids, `/model_info`).

    Raises:
        RuntimeError: the server did not accept connections within `START_TIMEOUT_S` seconds.
    """
    import uvicorn

    from grpolab.serve.app import build_app
    from grpolab.serve.batching import Batcher
    from grpolab.serve.command import bind_socket
    from grpolab.serve.state import ServerState, ServeSettings

    sock = bind_socket("127.0.0.1", 0)
    host, port = sock.getsockname()[:2]
    state = ServerState(
        settings=ServeSettings(model_path=model_path, host=host, port=port, launch_command="grpolab train"),
        engine=engine,  # type: ignore[arg-type]  # the routes a rollout uses call generate only
        batcher=Batcher(engine),
        tokenizer=tokenizer,
        eos_ids=eos_ids,
        fingerprint=fingerprint,
        vocab_size=vocab_size,
        context_len=context_len,
        weight_version=str(weight_version),
    )
    config = uvicorn.Config(build_app(state), log_level="warning", access_log=False, http="httptools")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="grpolab-door", daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError(f"the run's in-process server on {host}:{port} did not start")
        time.sleep(0.005)
    try:
        yield f"http://{host}:{port}"
    finally:
        state.batcher.abort(abort_all=True, message="the rollout is over")
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
