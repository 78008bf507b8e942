"""The rollout-engine protocol, its optional capabilities, and the data they exchange.

One protocol for every engine (the in-process torch engine, an HTTP engine such as SGLang):
`generate`, `update_weights`, `release_memory` / `resume_memory`, `flush_cache`, `health`, plus a
`name` and `log_tail` for error messages. The trainer calls an engine through `client.EngineClient`,
which retries failed calls while the engine recovers and gives up after `--engine-failure-timeout`;
`factory.build_engine` builds both from the config.

What only some engines can do is an optional capability, a small runtime-checkable protocol that a
caller tests for with `capability(engine, Kind)` (which looks through an `EngineClient`):
`ChecksWeights` (SGLang's `/weights_checker`, for the `--ci-test` weight-update checker),
`ReportsStats` (throughput of the last `generate`, for `perf/rollout_tokens_per_sec`),
`Stoppable` (shut the engine down, for the `stop_engine_at_end` fault) and `Closeable` (end the
processes an engine launched, when the run ends however it ends).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:  # annotations only: `grpolab serve --help` and the CLI parser import this module
    import torch

FinishReason = Literal["stop", "length"]

DecodePath = Literal["auto", "grpolab", "transformers"]
DECODE_PATHS: tuple[DecodePath, ...] = ("auto", "grpolab", "transformers")
"""Which forward the in-process engine decodes with (`--rollout-decode-path`): "grpolab", its own
Llama/Qwen2/Qwen3 decoder (core/engine/decoder.py); "transformers", the model's own forward (any
causal LM; the reference the decoder is tested against); "auto", grpolab's where the model is
supported, else transformers'."""


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """Sampling settings for one generate call (Miles: `--rollout-temperature`, `--rollout-top-p`, ...).

    Attributes:
        temperature: logits are divided by this before softmax; must be > 0.
        top_p: nucleus mass in (0, 1]; 1.0 disables.
        top_k: keep the k most likely tokens; 0 (or < 0) disables.
        max_new_tokens: `--rollout-max-response-len`, in tokens.
        stop_token_ids: generation of a sample ends after it emits one of these (finish "stop").
        top_logprobs_num: also return, per generated token, the k most likely tokens of the
            distribution it was sampled from (SGLang's `top_logprobs_num`; 0: none). Sampling is
            unchanged by it.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()
    top_logprobs_num: int = 0

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"--rollout-temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"--rollout-top-p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"--rollout-max-response-len must be >= 1, got {self.max_new_tokens}")
        if self.top_logprobs_num < 0:
            raise ValueError(f"top_logprobs_num must be >= 0, got {self.top_logprobs_num}")

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
        top_log_probs: with `SamplingParams.top_logprobs_num` k > 0, (float32 [R, k] log-probs,
            int64 [R, k] token ids) of each step's k most likely tokens, descending; an entry
            outside the kept support has log-prob -inf. None otherwise.
    """

    response_ids: list[int]
    log_probs: torch.Tensor
    finish_reason: FinishReason
    kept_token_ids: list[torch.Tensor] | None = None
    weight_version: int = 0
    top_log_probs: tuple[torch.Tensor, torch.Tensor] | None = None

    def cut(self, n: int) -> GenerationResult:
        """This result as if generated with `max_new_tokens = n`: per-sample seeds make the first n
        tokens the same (core/seeding.py); finish "length" when tokens were dropped, and no
        `top_log_probs` then (the rows would no longer match)."""
        if len(self.response_ids) <= n:
            return self
        kept = None if self.kept_token_ids is None else self.kept_token_ids[:n]
        return dataclasses.replace(
            self, response_ids=self.response_ids[:n], log_probs=self.log_probs[:n], finish_reason="length",
            kept_token_ids=kept, top_log_probs=None,
        )  # fmt: skip


def generate_within(
    engine: RolloutEngine, requests: list[GenerationRequest], params: SamplingParams, limits: list[int]
) -> list[GenerationResult]:
    """One engine call for `requests` whose answers may hold at most `limits[i]` tokens each (a response
    budget or context cap left per sample): generated with the largest limit, each cut to its own
    (`GenerationResult.cut`), so the batch stays one call."""
    results = engine.generate(requests, dataclasses.replace(params, max_new_tokens=max(limits)))
    return [res.cut(n) for res, n in zip(results, limits)]


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


# ---------------------------------------------------------------------- optional capabilities
@dataclass(frozen=True, kw_only=True)
class TensorMismatch:
    """One engine tensor that differs from its snapshot (weights checker "compare")."""

    name: str
    shape: tuple[int, ...]
    max_abs_err: float
    mean_abs_err: float


@runtime_checkable
class ChecksWeights(Protocol):
    """An engine with SGLang's `/weights_checker` actions (Miles notes 3.3)."""

    def weights_checker(self, action: str, *, seed: int = 0) -> list[TensorMismatch]:
        """ "snapshot" the engine's persistent tensors, "reset_tensors" to seeded random values, or
        "compare" with the snapshot (one `TensorMismatch` per tensor that is not bitwise equal).

        Raises ValueError for an unknown action or "compare" before "snapshot"."""
        ...


@runtime_checkable
class ReportsStats(Protocol):
    """An engine that reports its last `generate` call."""

    @property
    def last_stats(self) -> dict[str, float]:
        """`tokens` generated, `seconds` of wall time, `tokens_per_s` (0 before any generate)."""
        ...


@runtime_checkable
class Stoppable(Protocol):
    """An engine that can be shut down: later calls fail and `health()` reports not ok."""

    def shutdown(self, reason: str = "shutdown() was called") -> None:
        """Stop the engine; `reason` appears in its log and in later errors."""
        ...


@runtime_checkable
class RestartsEngines(Protocol):
    """An engine over launched engine processes that can restart one that exits (--use-fault-tolerance)."""

    def enable_fault_tolerance(self, source: Any, *, max_restarts: int) -> None:
        """Restart an engine that exits (at most `max_restarts` times in the run), loading it from `source`
        (a `restart.WeightSource`), instead of failing the call."""
        ...

    def take_restarts(self) -> list[Any] | None:
        """The `restart.RestartRecord`s since the last call; None without fault tolerance."""
        ...

    def kill_engine(self, i: int, *, when_queued: bool = False) -> None:
        """SIGKILL engine `i` now, or once the next call's requests reached the engines (faults for tests)."""
        ...


@runtime_checkable
class Closeable(Protocol):
    """An engine that holds processes or files to release when the run ends (the HTTP engine's fleet)."""

    def close(self) -> None:
        """Release them; idempotent, never raises for an engine that already stopped."""
        ...


@runtime_checkable
class WrapsEngine(Protocol):
    """An engine that forwards to another one (`client.EngineClient`)."""

    @property
    def wrapped(self) -> RolloutEngine:
        """The engine every call is forwarded to."""
        ...


C = TypeVar("C")


def capability(engine: object | None, kind: type[C]) -> C | None:
    """`engine`, or the engine it wraps (through any `WrapsEngine` layers), when it implements the
    capability protocol `kind`; None when no layer does (or `engine` is None)."""
    while engine is not None:
        if isinstance(engine, kind):
            return engine
        engine = engine.wrapped if isinstance(engine, WrapsEngine) else None
    return None
