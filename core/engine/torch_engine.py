"""The in-process torch rollout engine: batched KV-cache decoding with per-sample seeded sampling.

`TorchEngine` implements `RolloutEngine` (see `base.py`) on CPU or CUDA. It loads its own copy of
the model (`load_causal_lm`), so weight sync from the trainer is a real copy, as with SGLang.
The forward is grpolab's own decoder for Llama/Qwen2/Qwen3 models or the transformers model's
(`model_runner.py`, `--rollout-decode-path`). Each distinct prompt of a call is prefilled once and
its KV rows are repeated for its samples (a GRPO group shares one prefill, as SGLang's radix cache
shares the prefix).

Sampling, per decode step and sample:
  logits (model dtype) -> float32 -> / temperature -> top-k and top-p keep mask ->
  log_softmax over the kept support -> sample by Gumbel-max with the sample's own noise ->
  record the sampled token's log-prob under exactly that (renormalized) distribution.

The kept-set rule and the sampling distribution's log-probs are pure functions in `sampling.py`.

Seeding: request i has its own `torch.Generator` seeded with `request.seed` on the engine device;
each decode step uses the next V uniforms u of that stream (Gumbel-max: argmax(logp - log(-log u))
over the kept support), drawn C = clamp(2**16 // V, 1, 32) steps at a time (on CPU the stream is
identical to one draw per step). So a sample's tokens depend only on its seed and its logits, never
on batch size or order; CPU and CUDA generators give different streams. Log-probs across batch
compositions agree to float rounding (padding and batch size change matmul rounding).

Finishing: a row finishes on its first stop token (finish "stop", the token is kept, also when it
is the max_new_tokens-th token) or after max_new_tokens tokens ("length"). Finished rows are
dropped from the decode batch (KV cache rows included) once >= 1/4 of the batch is done.

Tensor legend: B samples in a chunk, A rows still in the decode batch, L padded prompt length,
T max new tokens, V vocab size, K kept ids (per row, padded).
"""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path

import torch
from tqdm.auto import tqdm

from grpolab.core.engine.base import (
    DecodePath,
    EngineHealth,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    TensorMismatch,
)
from grpolab.core.engine.decoder import Decoder
from grpolab.core.engine.model_runner import ModelRunner, make_runner
from grpolab.core.engine.sampling import filtered_log_probs, kept_ids
from grpolab.core.modeling import load_causal_lm
from grpolab.core.sequence_forward import Answer, rescored

_TINY = torch.finfo(torch.float32).tiny
_NOISE_BLOCK = 1 << 16  # uniforms drawn per row per generator call: C = clamp(2**16 // V, 1, 32) steps
LOG_LINES = 200
"""How many lines the engine's in-memory log keeps (grpolab's: enough for one error message's tail
and a run's recent weight updates; the oldest lines are dropped)."""


class UnknownTensorError(KeyError):
    """A weight update names a tensor the engine does not have. A KeyError whose text is its message
    (a plain KeyError's `str` wraps the message in quotes, which every caller then printed)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class TorchEngine:
    """In-process rollout engine over a Hugging Face causal LM (CPU or CUDA).

    Attributes:
        name: "torch engine (<checkpoint dir name>, <device>)", for messages.
        model: the engine's own model (eval mode, no grads).
        device: where generation runs (weights live on CPU while memory is released).
        weight_version: last version passed to `update_weights` (0 before any update).
        memory_released: True between `release_memory()` and `resume_memory()`.
        last_stats: after each `generate`: `tokens` (generated tokens), `seconds` (wall time of
            prefill + decode), `tokens_per_s`.
        stopped: True after `shutdown()`; `stop_reason` says why.
    """

    def __init__(
        self,
        checkpoint: str | Path,
        *,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        max_batch_size: int = 256,
        show_progress: bool = True,
        decode_path: DecodePath = "auto",
        true_on_policy: bool = False,
    ) -> None:
        """Load an independent copy of the model at `checkpoint` onto `device`.

        `decode_path` chooses the forward (`base.DecodePath`): grpolab's own decoder where
        the model is supported ("auto"), always ("grpolab"), or transformers' ("transformers").
        `true_on_policy` (`--true-on-policy-mode`): after sampling, every answer's log-probs are
        recomputed by a prefill of prompt + answer alone with transformers' forward
        (core/sequence_forward.alone_log_probs, the trainer's forward in that mode): one more forward
        per answer, and log-probs that depend on the weights and tokens only, not on the batch.

        Raises:
            ValueError: max_batch_size < 1, the checkpoint is not a model (from `load_causal_lm`), or
                decode_path "grpolab" for a model the decoder does not implement.
            FileNotFoundError: the checkpoint path does not exist.
        """
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.device = torch.device(device)
        self.dtype = dtype
        self.name = f"torch engine ({Path(checkpoint).name}, {self.device})"
        self._log: deque[str] = deque(maxlen=LOG_LINES)
        self.max_batch_size = max_batch_size
        self.show_progress = show_progress
        self.model = load_causal_lm(checkpoint, dtype=dtype, device=self.device)
        self.model.requires_grad_(False)
        pad = getattr(self.model.config, "pad_token_id", None)
        self.pad_token_id: int = int(pad) if isinstance(pad, int) else 0
        self.decode_path: DecodePath = decode_path
        self.true_on_policy = true_on_policy
        _, decoder = make_runner(self.model, decode_path, None)  # refuses an unsupported "grpolab"
        self._decoder: Decoder | None = decoder  # grpolab's decoder (None: transformers'), kept between calls
        self.forward_name = "grpolab's own forward" if self._decoder is not None else "transformers' forward"
        """Which forward decodes ("grpolab's own forward" or "transformers' forward"), for messages."""
        self._runner: ModelRunner | None = None  # the batch being decoded (KV cache), during generate
        self.weight_version = 0
        self.memory_released = False
        self.stopped = False
        self.stop_reason = ""
        self.last_stats: dict[str, float] = {"tokens": 0, "seconds": 0.0, "tokens_per_s": 0.0}
        n_params = sum(p.numel() for p in self.model.parameters())
        self._note(
            f"started with model {checkpoint} ({n_params:,} parameters), dtype {dtype}, device {self.device}"
        )
        self._note(f"decoding with {self.forward_name}")

    def _note(self, line: str) -> None:
        """Append one line, stamped with UTC wall time, to the bounded in-memory log."""
        self._log.append(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {line}")

    def log_tail(self, n: int = 20) -> list[str]:
        """The last `n` lines (at most `LOG_LINES`) of what this engine did, oldest first."""
        return list(self._log)[-n:] if n > 0 else []

    # ------------------------------------------------------------------ generation
    def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        """Sample one response per request, in request order, `max_batch_size` requests at a time.

        Returns:
            One `GenerationResult` per request: response ids (stop token included), float32 CPU
            log-probs [R], finish reason, kept-id sets (sorted int64, when filtering), version.

        Raises:
            RuntimeError: memory is released (`resume_memory()` was not called).
            ValueError: a request has an empty prompt.
        """
        if self.memory_released:
            raise RuntimeError("TorchEngine.generate: memory is released; call resume_memory() first")
        if self.stopped:
            raise RuntimeError(f"TorchEngine.generate: the engine was shut down ({self.stop_reason})")
        for i, req in enumerate(requests):
            if not req.prompt_ids:
                raise ValueError(f"TorchEngine.generate: request {i} has an empty prompt")
        start = time.perf_counter()
        results: list[GenerationResult] = []
        with torch.inference_mode():
            for lo in range(0, len(requests), self.max_batch_size):
                results.extend(self._generate_chunk(requests[lo : lo + self.max_batch_size], params))
            if self.true_on_policy:
                self._rescore_by_prefill(requests, results, params)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - start
        tokens = sum(len(r.response_ids) for r in results)
        self.last_stats = {
            "tokens": tokens,
            "seconds": seconds,
            "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
        }
        self._note(f"generated {len(requests)} samples, {tokens} tokens in {seconds:.2f} s")
        return results

    def _generate_chunk(
        self, reqs: list[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        """Generate for at most `max_batch_size` requests (runs under inference_mode)."""
        dev, B, T = self.device, len(reqs), params.max_new_tokens
        pad = self.pad_token_id
        gens = [torch.Generator(device=dev).manual_seed(r.seed & 0xFFFF_FFFF_FFFF_FFFF) for r in reqs]
        stop_S = torch.tensor(sorted(set(params.stop_token_ids)), dtype=torch.long, device=dev)

        # Each distinct prompt is prefilled once; its samples share the prompt's KV rows (SGLang shares
        # them through its radix cache).
        first_row: dict[tuple[int, ...], int] = {}
        prompt_of = [first_row.setdefault(tuple(r.prompt_ids), len(first_row)) for r in reqs]
        distinct = [list(p) for p in first_row]
        ids_UL, mask_UL = self._left_padded(distinct)
        runner, self._decoder = make_runner(self.model, self.decode_path, self._decoder)
        self._runner = runner
        logits_AV = runner.prefill(ids_UL, mask_UL, ids_UL.shape[1] + T)
        if len(distinct) < B:
            prompt_A = torch.tensor(prompt_of, dtype=torch.long, device=dev)
            runner.select_rows(prompt_A)
            logits_AV = logits_AV[prompt_A]
        V = logits_AV.shape[-1]
        C = max(1, min(32, _NOISE_BLOCK // V))

        tok_BT = torch.full((B, T), pad, dtype=torch.long, device=dev)
        logp_BT = torch.zeros((B, T), dtype=torch.float32, device=dev)
        length = [T] * B
        reason: list[FinishReason] = ["length"] * B
        rows = list(range(B))  # original row index of each position in the decode batch
        rows_A = torch.arange(B, device=dev)
        alive = [True] * B  # indexed by decode-batch position
        kept_steps: list[tuple[list[int], torch.Tensor, torch.Tensor]] = []
        K = min(params.top_logprobs_num, V)
        top_v_BTK = torch.full((B, T, K), float("-inf"), dtype=torch.float32, device=dev) if K else None
        top_i_BTK = torch.zeros((B, T, K), dtype=torch.long, device=dev) if K else None

        bar = tqdm(total=T, desc="rollout", disable=None if self.show_progress else True, leave=False)
        try:
            for t in range(T):
                logp_AV, n_A, order_AV = filtered_log_probs(logits_AV, params)
                if t % C == 0:  # each row's next C x V uniforms, one generator call per row
                    u_ACV = torch.stack([torch.rand(C * V, generator=g, device=dev) for g in gens])
                    gumbel_ACV = u_ACV.view(len(gens), C, V).clamp_(min=_TINY).log_().neg_().log_().neg_()
                tok_A = (logp_AV + gumbel_ACV[:, t % C]).argmax(dim=-1)
                tok_BT[rows_A, t] = tok_A
                logp_BT[rows_A, t] = logp_AV.gather(1, tok_A[:, None]).squeeze(1)
                if top_v_BTK is not None and top_i_BTK is not None:
                    top = logp_AV.topk(K, dim=-1)
                    top_v_BTK[rows_A, t], top_i_BTK[rows_A, t] = top.values, top.indices
                if n_A is not None and order_AV is not None:
                    kept_steps.append((rows, *kept_ids(n_A, order_AV, V)))
                bar.update(1)
                if stop_S.numel():
                    for a in torch.isin(tok_A, stop_S).nonzero().flatten().tolist():
                        if alive[a]:
                            alive[a] = False
                            length[rows[a]], reason[rows[a]] = t + 1, "stop"
                n_alive = sum(alive)
                if n_alive == 0 or t == T - 1:
                    break
                if 4 * (len(alive) - n_alive) >= len(alive):  # compact once >= 1/4 of rows are done
                    keep = [a for a, ok in enumerate(alive) if ok]
                    keep_A = torch.tensor(keep, dtype=torch.long, device=dev)
                    runner.select_rows(keep_A)
                    tok_A, rows_A, gumbel_ACV = tok_A[keep_A], rows_A[keep_A], gumbel_ACV[keep_A]
                    rows, gens, alive = [rows[a] for a in keep], [gens[a] for a in keep], [True] * len(keep)
                logits_AV = runner.step(tok_A)
        finally:
            bar.close()
            self._runner = None

        results = self._results(
            tok_BT, logp_BT, length, reason, kept_steps if params.filters_support else None
        )
        if top_v_BTK is not None and top_i_BTK is not None:
            top_v, top_i = top_v_BTK.cpu(), top_i_BTK.cpu()
            for b, r in enumerate(results):
                r.top_log_probs = (top_v[b, : length[b]].clone(), top_i[b, : length[b]].clone())
        return results

    def _rescore_by_prefill(
        self, requests: list[GenerationRequest], results: list[GenerationResult], params: SamplingParams
    ) -> None:
        """Replace each result's decode log-probs by those of a prefill of its prompt + answer alone
        (`true_on_policy`; the same support: the decode's kept-id sets)."""
        answers = [
            Answer(list(q.prompt_ids), list(r.response_ids), r.kept_token_ids)
            for q, r in zip(requests, results)
        ]
        scores = rescored(self.model, answers, temperature=params.temperature,
                          vocab_size=int(self.model.config.vocab_size), device=self.device)  # fmt: skip
        for res, lp in zip(results, scores):
            res.log_probs = lp

    def prompt_log_probs(self, ids: list[int], start: int, temperature: float) -> torch.Tensor:
        """Log-probs float32 [len(ids) - start - 1] of `ids[start + 1:]`, each given the ids before it,
        from one prefill of `ids` alone over the whole vocabulary at `temperature` (SGLang's
        `input_token_logprobs` from `logprob_start_len` = start, whose first entry has none).

        Raises:
            RuntimeError: memory released or the engine shut down. ValueError: start outside the ids.
        """
        if self.memory_released or self.stopped:
            raise RuntimeError("TorchEngine.prompt_log_probs: memory is released or the engine stopped")
        if not 0 <= start < len(ids):
            raise ValueError(f"TorchEngine.prompt_log_probs: start {start} outside the {len(ids)} ids")
        answer = Answer(list(ids[: start + 1]), list(ids[start + 1 :]), None)
        with torch.inference_mode():
            (lp,) = rescored(self.model, [answer], temperature=temperature,
                             vocab_size=int(self.model.config.vocab_size), device=self.device)  # fmt: skip
        return lp

    def _left_padded(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompts left-padded to the longest: ids [B, L] int64 and attention mask [B, L] (1 = prompt)."""
        L, pad = max(len(p) for p in prompts), self.pad_token_id
        ids_rows = [[pad] * (L - len(p)) + p for p in prompts]
        mask_rows = [[0] * (L - len(p)) + [1] * len(p) for p in prompts]
        return (
            torch.tensor(ids_rows, dtype=torch.long, device=self.device),
            torch.tensor(mask_rows, dtype=torch.long, device=self.device),
        )

    def _results(
        self,
        tok_BT: torch.Tensor,
        logp_BT: torch.Tensor,
        length: list[int],
        reason: list[FinishReason],
        kept_steps: list[tuple[list[int], torch.Tensor, torch.Tensor]] | None,
    ) -> list[GenerationResult]:
        """One result per row b: its first `length[b]` tokens and log-probs (CPU), and with `kept_steps`
        (per decode step: the original rows of the batch, kept counts, kept ids) its kept-id sets."""
        B = len(length)
        tok_rows = tok_BT.cpu().tolist()
        logp_cpu = logp_BT.cpu()
        kept: list[list[torch.Tensor]] | None = [[] for _ in range(B)] if kept_steps is not None else None
        if kept is not None and kept_steps is not None:
            for t, (step_rows, n_cpu, ids_cpu) in enumerate(kept_steps):
                for a, b in enumerate(step_rows):
                    if t < length[b]:
                        kept[b].append(ids_cpu[a, : n_cpu[a]].clone())
        return [
            GenerationResult(
                response_ids=tok_rows[b][: length[b]],
                log_probs=logp_cpu[b, : length[b]].clone(),
                finish_reason=reason[b],
                kept_token_ids=kept[b] if kept is not None else None,
                weight_version=self.weight_version,
            )
            for b in range(B)
        ]

    # ------------------------------------------------------------------ weights and memory
    def update_weights(self, named_tensors: list[tuple[str, torch.Tensor]], *, weight_version: int) -> int:
        """Copy (HF name, tensor) pairs into the engine's own parameters; return `weight_version`.

        Tensors may be on any device and of any float dtype (cast on copy). Tied weights share one
        storage, so either name (`lm_head.weight` / `model.embed_tokens.weight`) updates both. The
        whole bucket is validated before anything is copied.

        Raises:
            UnknownTensorError (a KeyError): naming a tensor the engine does not have.
            ValueError: naming a tensor whose shape differs from the engine's.
        """
        targets = dict(self.model.named_parameters(remove_duplicate=False))
        targets.update(self.model.named_buffers(remove_duplicate=False))
        for name, tensor in named_tensors:
            if name not in targets:
                raise UnknownTensorError(f"update_weights: the engine has no tensor named {name!r}")
            if tuple(tensor.shape) != tuple(targets[name].shape):
                raise ValueError(
                    f"update_weights: shape mismatch for {name!r}: got {tuple(tensor.shape)}, "
                    f"engine has {tuple(targets[name].shape)}"
                )
        with torch.no_grad():
            for name, tensor in named_tensors:
                targets[name].copy_(tensor.detach())
        if weight_version != self.weight_version:  # one line per version, not per bucket
            self._note(f"weight update to version {weight_version}")
        self.weight_version = weight_version
        return self.weight_version

    def weights_checker(self, action: str, *, seed: int = 0) -> list[TensorMismatch]:
        """SGLang's `/weights_checker` actions on the engine's own persistent tensors.

        Actions (Miles notes 3.3): "snapshot" copies every persistent parameter/buffer to CPU;
        "reset_tensors" overwrites them with seeded random values (non-persistent buffers such as
        rotary `inv_freq` are not in the state dict and stay); "compare" returns one
        `TensorMismatch` per tensor that is not bitwise equal to the snapshot.

        Raises:
            ValueError: unknown action, or "compare" before "snapshot".
        """
        state = self.model.state_dict()
        if action == "snapshot":
            self._weights_snapshot = {n: t.detach().to("cpu", copy=True) for n, t in state.items()}
            return []
        if action == "reset_tensors":
            gen = torch.Generator(device="cpu").manual_seed(seed)
            seen: set[int] = set()
            with torch.no_grad():
                for tensor in state.values():
                    if tensor.data_ptr() in seen or not tensor.is_floating_point():
                        continue
                    seen.add(tensor.data_ptr())
                    tensor.copy_(torch.randn(tensor.shape, generator=gen, dtype=torch.float32))
            return []
        if action == "compare":
            snapshot = getattr(self, "_weights_snapshot", None)
            if snapshot is None:
                raise ValueError("weights_checker('compare') needs a 'snapshot' first")
            out = []
            for name, tensor in state.items():
                expected = snapshot[name]
                actual = tensor.detach().cpu()
                if not torch.equal(actual, expected):
                    err = (actual.double() - expected.double()).abs()
                    out.append(
                        TensorMismatch(
                            name=name,
                            shape=tuple(actual.shape),
                            max_abs_err=float(err.max()),
                            mean_abs_err=float(err.mean()),
                        )
                    )
            return out
        raise ValueError(
            f"weights_checker: unknown action {action!r}; expected snapshot, reset_tensors or compare"
        )

    def shutdown(self, reason: str = "shutdown() was called") -> None:
        """Stop the engine: later `generate` calls raise and `health()` reports not ok.

        `reason` ends up in the log ("shut down by <reason>"), in `health().detail` and in the
        error of later `generate` calls.
        """
        self.flush_cache()
        self.stopped = True
        self.stop_reason = reason
        self._note(f"shut down by {reason}")

    def flush_cache(self) -> None:
        """Drop cached KV state (the engine keeps none between `generate` calls)."""
        self._runner = None

    def release_memory(self) -> None:
        """Drop the KV cache and the decoder's fused weight copies, and move the weights to CPU (on
        a CPU engine they stay where they are)."""
        self.flush_cache()
        self._decoder = None
        if self.device.type != "cpu":
            self.model.to("cpu")
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        self.memory_released = True
        self._note("memory released" + ("" if self.device.type == "cpu" else ", weights moved to CPU"))

    def resume_memory(self) -> None:
        """Move the weights back to the engine device and allow `generate` again."""
        if self.device.type != "cpu":
            self.model.to(self.device)
        self.memory_released = False
        self._note("memory resumed")

    def health(self) -> EngineHealth:
        """Ok until `shutdown()`; reports weight version and memory state (and the shutdown reason)."""
        detail = f"torch engine on {self.device}, {self.dtype}"
        if self.stopped:
            detail += f"; shut down by {self.stop_reason}"
        return EngineHealth(
            ok=not self.stopped,
            weight_version=self.weight_version,
            memory_released=self.memory_released,
            detail=detail,
        )
