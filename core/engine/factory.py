"""Build the run's rollout engine from the config: one registry of engine kinds, one client around it.

`build_engine(config)` builds the engine kind `--rollout-engine` names (today only "torch", the
in-process `TorchEngine`) and wraps it in `client.EngineClient`, so every call fails after
`--engine-failure-timeout` whatever the engine is. Adding an engine (an HTTP client for
`grpolab serve`, SGLang) is one module with a `(Config) -> RolloutEngine` builder plus one
`ENGINES.register(...)` line here; what only some engines can do is an optional capability in
`base.py` that callers test for.
"""

from __future__ import annotations

from collections.abc import Callable

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
    return TorchEngine(
        model.hf_checkpoint,
        dtype=parse_dtype(model.rollout_dtype, "--rollout-dtype"),
        device=model.device,
        show_progress=config.run.show_progress,
    )


ENGINES.register("torch")(torch_engine)


def build_engine(config: Config) -> RolloutEngine:
    """The `--rollout-engine` kind, behind an `EngineClient` that gives up after `--engine-failure-timeout` s.

    Raises:
        ValueError: an unknown `--rollout-engine` (listing the registered kinds), a non-positive
            `--engine-failure-timeout`, or whatever the kind's builder rejects.
    """
    engine = ENGINES.get(config.rollout.rollout_engine)(config)
    return EngineClient(engine, failure_timeout=config.rollout.engine_failure_timeout)
