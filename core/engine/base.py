"""The rollout-engine protocol and the data it exchanges.

One protocol for every engine (the in-process torch engine, an HTTP engine such as SGLang):
`generate`, `update_weights`, `release_memory` / `resume_memory`, `flush_cache`, `health`, plus a
`name` and `log_tail` for error messages. The trainer calls an engine through `client.EngineClient`,
which retries failed calls while the engine recovers and gives up after `--engine-failure-timeout`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """Sampling settings for one generate call (Miles: `--rollout-temperature`, `--rollout-top-p`, ...).

    Attributes:
        temperature: logits are divided by this before softmax; must be > 0.
        top_p: nucleus mass in (0, 1]; 1.0 disables.
        top_k: keep the k most likely tokens; 0 (or < 0) disables.
        max_new_tokens: `--rollout-max-response-len`, in tokens.
        stop_token_ids: generation of a sample ends after it emits one of these (finish "stop").
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"--rollout-temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"--rollout-top-p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"--rollout-max-response-len must be >= 1, got {self.max_new_tokens}")

    @property
    def filters_support(self) -> bool:
        """True when top-p or top-k shrink the sampling support (kept-token sets are returned)."""
        return self.top_p < 1.0 or self.top_k > 0


@dataclass(frozen=True, kw_only=True)
class GenerationRequest:
    """One sample to generate: prompt token ids and the sample's own sampling seed."""

    prompt_ids: list[int]
    seed: int


@dataclass(kw_only=True)
class GenerationResult:
    """What the engine produced for one request.

    Attributes:
        response_ids: generated token ids, length R (includes the stop token when finish is "stop").
        log_probs: float32 tensor [R], log-prob of each generated token under exactly the
            distribution it was sampled from (temperature applied, renormalized over the kept set).
        finish_reason: "stop" (a stop token was emitted) or "length" (hit max_new_tokens).
        kept_token_ids: when top-p/top-k filtered the support, one sorted int64 tensor per
            generated token holding the kept vocabulary ids; None otherwise.
        weight_version: the engine's weight version when this sample was generated.
    """

    response_ids: list[int]
    log_probs: torch.Tensor
    finish_reason: FinishReason
    kept_token_ids: list[torch.Tensor] | None = None
    weight_version: int = 0


@dataclass(frozen=True, kw_only=True)
class EngineHealth:
    """Result of `health()`: whether the engine answers, its weight version and memory state."""

    ok: bool
    weight_version: int
    memory_released: bool
    detail: str = ""
    extra: dict = field(default_factory=dict)


class RolloutEngine(Protocol):
    """What the trainer needs from a rollout engine."""

    @property
    def name(self) -> str:
        """A short human name for messages, e.g. "torch engine (tiny-qwen3, cpu)"."""
        ...

    def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        """Generate one response per request, in request order."""
        ...

    def update_weights(self, named_tensors: list[tuple[str, torch.Tensor]], *, weight_version: int) -> int:
        """Copy one bucket of weights (HF parameter names) into the engine; return the engine's version."""
        ...

    def release_memory(self) -> None:
        """Free KV cache and move weights off the accelerator (colocated: the trainer runs next)."""
        ...

    def resume_memory(self) -> None:
        """Undo `release_memory`."""
        ...

    def flush_cache(self) -> None:
        """Drop any cached KV / prefix state (called before a weight update)."""
        ...

    def health(self) -> EngineHealth:
        """Report liveness and the current weight version."""
        ...

    def log_tail(self, n: int = 20) -> list[str]:
        """The engine's last `n` log lines, oldest first (what it did: start, weight updates, memory
        release/resume, shutdown), for error messages when the engine stops answering."""
        ...
