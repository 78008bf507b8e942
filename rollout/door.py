"""Where a custom generate function or an agent reaches the run's engine over HTTP, for one rollout.

On a fleet (`--rollout-num-engines` / `--sglang-router-ip`) it is the router, as in Miles; on the
in-process engine it is the run's own engine served on 127.0.0.1 for the rollout (serve/embedded.py:
the same routes as `grpolab serve`, the run's current weights). An agent's sessions go to the launched
fleet's engines directly (`session_bases`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

from grpolab.core.config import Config
from grpolab.core.engine.base import RolloutEngine, SamplingParams
from grpolab.serve.embedded import serve_engine


def router_url(engine: RolloutEngine) -> str | None:
    """The fleet router's URL of an HTTP engine (behind the fail-fast client), None for another engine."""
    inner = getattr(engine, "engine", engine)
    url = getattr(inner, "router_url", None)
    return url if isinstance(url, str) else None


def session_bases(engine: RolloutEngine, door: str) -> list[str]:
    """Where an agent's sessions live: each engine of a fleet grpolab launched, directly (a session's
    token record is one engine's state, so its turns must not be balanced across engines by the router;
    episode i's session goes to engine i mod N, as `HttpEngine` sends direct requests), else `door`."""
    inner = getattr(engine, "engine", engine)
    urls = getattr(inner, "engine_urls", None)
    if getattr(inner, "fleet", None) is not None and isinstance(urls, list) and urls:
        return list(urls)
    return [door]


@contextmanager
def engine_door(config: Config, engine: RolloutEngine, tokenizer: object, sampling: SamplingParams,
                fingerprint: str, weight_version: int) -> Iterator[tuple[str, int]]:  # fmt: skip
    """(host, port) of the HTTP door to `engine` while the block runs (see the module docstring);
    `weight_version` is the engine's current one (the in-process door reports it).

    Raises:
        RuntimeError: the in-process server did not start (serve/embedded.py).
    """
    url = router_url(engine)
    if url is not None:
        parts = urlsplit(url)
        yield str(parts.hostname), int(parts.port or 80)
        return
    with serve_engine(
        engine, model_path=config.model.hf_checkpoint, tokenizer=tokenizer, eos_ids=sampling.stop_token_ids,
        vocab_size=len(tokenizer), context_len=0, fingerprint=fingerprint,  # type: ignore[arg-type]
        weight_version=weight_version,
    ) as base:  # fmt: skip
        parts = urlsplit(base)
        yield str(parts.hostname), int(parts.port or 80)
