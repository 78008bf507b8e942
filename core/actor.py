"""The trainer side: policy model, frozen reference, AdamW, log-probs and the GRPO train step.

What it computes: for each optimizer window of `--global-batch-size` samples, the PPO clipped
surrogate on GRPO advantages (+ `--kl-loss-coef`·KL to the reference with `--use-kl-loss`,
− `--entropy-coef`·entropy, × TIS weights with `--use-tis`), aggregated as a sample mean
(Miles default) or token mean (`--calculate-per-token-loss`) whose denominator is counted over
the whole window, so micro-batch size never changes the objective. Log-probs are float32 with
logits divided by the rollout temperature; the logit at t−1 scores the token at t.

Legend: `B` samples, `L` padded length, `V` vocabulary, `R` one sample's response length.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from grpolab.core import algorithms, sequence_forward, shared_prefix
from grpolab.core.batch import MicroBatch, Sample, collate, split
from grpolab.core.config import AlgorithmConfig, OptimizerConfig
from grpolab.core.dist import DistContext, all_reduce_sum, full_tensor, shard_model
from grpolab.core.loss_terms import token_terms
from grpolab.core.lr_schedule import LRSchedule
from grpolab.core.model_files import padding_id
from grpolab.core.modeling import load_causal_lm


class NonFiniteError(RuntimeError):
    """The loss or gradient norm of an optimizer step is NaN or infinite."""


@dataclass(kw_only=True)
class LogProbs:
    """Per-sample float32 [R] log-probs (and entropies when asked) of response tokens."""

    log_probs: list[torch.Tensor]
    entropy: list[torch.Tensor] | None = None


class Actor:
    """Policy (+ frozen reference) model and optimizer, colocated with the engine.

    Args:
        checkpoint: `--hf-checkpoint`.
        dtype / device: `--train-dtype` / `--device`.
        optimizer: batching and AdamW settings; algorithm: loss settings.
        temperature: `--rollout-temperature`, applied to trainer logits the same way the engine did.
        build_optimizer: False for `--debug-disable-optimizer` style runs (forward/backward only).
        with_reference: False builds no reference copy (saves one model of memory) for runs that
            never read reference log-probs (train/train_phase.reference_needed).
        padding_side: how micro-batches are padded (results do not depend on it).
        train_forward: `--train-forward`: "auto", "shared-prefix" or "padded" (core/shared_prefix.py).
        true_on_policy: `--true-on-policy-mode`: every sample is scored alone
            (core/sequence_forward.py), the forward the engine re-scores its answers with.
        dist_ctx: multi-rank runs: the policy is FSDP2-sharded, each rank trains on its share of
            every optimizer window, denominators are global counts and metrics are summed over ranks.
    """

    def __init__(
        self,
        checkpoint: str,
        *,
        dtype: torch.dtype,
        device: str,
        optimizer: OptimizerConfig,
        algorithm: AlgorithmConfig,
        temperature: float,
        build_optimizer: bool = True,
        padding_side: str = "right",
        dist_ctx: DistContext | None = None,
        with_reference: bool = True,
        train_forward: str = "auto",
        true_on_policy: bool = False,
        schedule: LRSchedule | None = None,
    ) -> None:
        self.device = torch.device(device)
        self.dist = dist_ctx or DistContext()
        self.model = load_causal_lm(checkpoint, dtype=dtype, device=self.device)
        self.alone = true_on_policy
        """`--true-on-policy-mode`: each sample scored alone (`_forward_alone`), never packed."""
        self._packing = (
            None if true_on_policy else shared_prefix.planned_cost(self.model, train_forward, checkpoint)
        )
        self.shared_prefix = self._packing is not None
        """Whether micro-batches whose samples share a prompt run packed (`shared_prefix`), where it pays."""
        self.forwards = {"padded": 0, "packed": 0}  # micro-batch forwards run so far, by layout
        self.ref_model = copy.deepcopy(self.model).requires_grad_(False) if with_reference else None
        if self.dist.distributed:
            shard_model(
                self.model, self.dist, device
            )  # the reference stays a full local copy (frozen, small)
        gbs = optimizer.global_batch_size
        assert gbs is not None
        if gbs % self.dist.world_size:
            raise ValueError(
                f"--global-batch-size {gbs} must be divisible by the world size {self.dist.world_size}"
            )
        self.local_batch_size = gbs // self.dist.world_size
        """Samples of one optimizer window on this rank."""
        self.opt_cfg = optimizer
        self.algo = algorithm
        self.temperature = temperature
        self.padding_side = padding_side
        config = self.model.config
        self.vocab_size = int(config.vocab_size)
        self.pad_id = padding_id(config.to_dict())
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        if build_optimizer:
            self.optimizer = torch.optim.AdamW(
                self.model.parameters(),
                lr=optimizer.lr,
                betas=(optimizer.adam_beta1, optimizer.adam_beta2),
                eps=optimizer.adam_eps,
                weight_decay=optimizer.weight_decay,
            )
            plan = schedule or LRSchedule(style="constant", lr=optimizer.lr)  # Miles' default: constant
            peak = optimizer.lr
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(
                self.optimizer, lambda step: plan.lr_at(step) / peak if peak > 0 else 0.0
            )
        self.offloaded = False

    # ------------------------------------------------------------------ log-probs
    def _collate(self, samples: list[Sample]) -> MicroBatch:
        return collate(
            samples,
            pad_id=self.pad_id,
            padding_side=self.padding_side,
            vocab_size=self.vocab_size,
            device=self.device,
        )

    def _forward(
        self, model: torch.nn.Module, mb: MicroBatch, with_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Response-position log-probs [B, L] (float32) and entropies [B, L] of one micro-batch.

        Only the last K positions get logits (`logits_to_keep`, as TRL does), K = L − (earliest
        response start) + 1, so the vocabulary-sized work skips the prompts; other positions hold 0.
        With `self.shared_prefix`, samples sharing a prompt run packed, one row per prompt, logits put back
        in this layout (`shared_prefix`; rows nothing reads are 0). Entropy needs no graph unless
        `--entropy-coef` trains on it.
        """
        if self.alone:
            return self._forward_alone(model, mb, with_entropy)
        B, L = mb.input_ids_BL.shape
        K = sequence_forward.logits_window(mb)
        packed = None
        if self.shared_prefix:
            packed = shared_prefix.pack_shared_prefix(mb, K, self.pad_id, cost=self._packing)
        self.forwards["padded" if packed is None else "packed"] += 1
        if packed is None:
            log_probs_BL, logits_BKV, _ = sequence_forward.padded_log_probs(
                model, mb, temperature=self.temperature
            )
        else:
            ids, mask, positions, keep = packed.inputs()
            logits = model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                use_cache=False,
                logits_to_keep=keep,
            ).logits
            logits_BKV = packed.unpack(logits, B, K)
            log_probs_BL = sequence_forward.window_log_probs(logits_BKV, mb, K, temperature=self.temperature)
        entropy_BL = None
        if with_entropy:
            entropy_BL = logits_BKV.new_zeros((B, L), dtype=torch.float32)
            entropy_BL[:, L - K :] = self._entropy(logits_BKV)
        return log_probs_BL, entropy_BL

    def _forward_alone(
        self, model: torch.nn.Module, mb: MicroBatch, with_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`_forward` under `--true-on-policy-mode`: every sample scored as a micro-batch of its own
        (`sequence_forward.alone_rows`, the forward the engine re-scores its answers with). The
        micro-batch still sets what one backward covers."""
        self.forwards["padded"] += sum(1 for s in mb.samples if s.response_ids)
        return sequence_forward.alone_rows(model, mb, temperature=self.temperature, vocab_size=self.vocab_size,
                                           device=self.device, entropy=self._entropy if with_entropy else None)  # fmt: skip

    def _entropy(self, logits_BKV: torch.Tensor) -> torch.Tensor:
        """`sequence_forward.window_entropy`, with a graph only when `--entropy-coef` trains on it."""
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.algo.entropy_coef != 0):
            return sequence_forward.window_entropy(logits_BKV, self.temperature)

    @torch.no_grad()
    def compute_log_probs(
        self, samples: list[Sample], *, reference: bool = False, with_entropy: bool = False
    ) -> LogProbs:
        """Log-probs of every sample's response under the policy (or the frozen reference).

        Micro-batches follow `--micro-batch-size` in sample order, the same split `train` uses, so
        before the first optimizer step the policy's values here equal the training forward's bitwise.

        Raises:
            RuntimeError: `reference` on an actor built with `with_reference=False`.
        """
        model = self.ref_model if reference else self.model
        if model is None:
            raise RuntimeError("reference log-probs asked of an Actor built without a reference model")
        out_lp: list[torch.Tensor] = []
        out_ent: list[torch.Tensor] = []
        for chunk in self._micro_batches(samples):
            mb = self._collate(chunk)
            lp_BL, ent_BL = self._forward(model, mb, with_entropy)
            out_lp += [t.cpu() for t in mb.gather(lp_BL)]
            if ent_BL is not None:
                out_ent += [t.cpu() for t in mb.gather(ent_BL)]
        return LogProbs(log_probs=out_lp, entropy=out_ent if with_entropy else None)

    def _micro_batches(self, samples: list[Sample]) -> Iterator[list[Sample]]:
        """Samples split into optimizer windows, then micro-batches: the exact split training uses."""
        for window in split(samples, self.local_batch_size):
            yield from split(window, self.opt_cfg.micro_batch_size)

    # ------------------------------------------------------------------ training
    def train(
        self,
        samples: list[Sample],
        old: list[torch.Tensor] | None,
        ref: list[torch.Tensor] | None,
        *,
        step_offset: int,
        apply_update: bool = True,
        after_step: Callable[[int], None] | None = None,
        forward: LogProbs | None = None,
    ) -> list[dict[str, float]]:
        """Run the optimizer steps of one rollout; return one `train/*` metrics dict per step.

        Args:
            samples: the rollout's samples, in order; consecutive windows of `--global-batch-size`.
            old: per-sample float32 [R] log-probs before training (the PPO "old" policy), or None:
                the training forward's own, detached (needs `forward`). They are the values
                `compute_log_probs` gives only before the first update, so None needs one optimizer window.
            ref: per-sample reference log-probs (needed with `--use-kl-loss`), else None.
            step_offset: `train/step` of the first window (rollout_id × steps_per_rollout).
            apply_update: False skips the optimizer step (forward/backward still run).
            after_step: called with `train/step` after each optimizer step (--save-model-hash-every-step).
            forward: when given, its lists receive the training forward's per-sample float32 [R]
                log-probs and entropies on CPU, in sample order (what `compute_log_probs(samples,
                with_entropy=True)` returns before the update).

        Raises:
            ValueError: `old` is None without `forward`, or the samples span several optimizer windows.
            NonFiniteError: see `_optimizer_step`.
        """
        local = self.local_batch_size
        if old is None and (forward is None or len(samples) > local):
            raise ValueError(
                "old log-probs from the training forward need `forward` and one optimizer window "
                f"({len(samples)} samples, {local} per window on this rank)"
            )
        metrics = []
        self.model.train()
        for step_id, start in enumerate(range(0, len(samples), local)):
            window = list(range(start, min(start + local, len(samples))))
            step = step_offset + step_id
            metrics.append(self._train_window(samples, window, old, ref, step, apply_update, forward))
            if after_step is not None:
                after_step(step_offset + step_id)
        self.model.eval()
        return metrics

    def _train_window(
        self,
        samples: list[Sample],
        window: list[int],
        old: list[torch.Tensor] | None,
        ref: list[torch.Tensor] | None,
        step: int,
        apply_update: bool,
        forward: LogProbs | None,
    ) -> dict[str, float]:
        """Forward/backward every micro-batch of one optimizer window, then one optimizer step."""
        algo = self.algo
        mode = "token_mean" if algo.calculate_per_token_loss else "sample_mean"
        local_count = (
            sum(int(samples[i].loss_mask.sum()) for i in window) if mode == "token_mean" else len(window)
        )
        # the whole window's count over every rank: world size never changes the objective
        denominator = max(all_reduce_sum({"n": float(local_count)}, self.dist)["n"], 1.0)
        sums: dict[str, float] = {}
        self.model.zero_grad(set_to_none=True)
        for chunk in split(window, self.opt_cfg.micro_batch_size):
            chunk_samples = [samples[i] for i in chunk]
            mb = self._collate(chunk_samples)
            mask_BL = mb.scatter([s.loss_mask for s in chunk_samples]) > 0
            log_probs_BL, entropy_BL = self._forward(self.model, mb, with_entropy=True)
            assert entropy_BL is not None
            if forward is not None:  # gathered as compute_log_probs does, so equal values compare equal
                forward.log_probs += [t.cpu() for t in mb.gather(log_probs_BL.detach())]
                assert forward.entropy is not None
                forward.entropy += [t.cpu() for t in mb.gather(entropy_BL.detach())]
            chunk_old = forward.log_probs[-len(chunk) :] if old is None else [old[i] for i in chunk]
            chunk_ref = None if ref is None else [ref[i] for i in chunk]
            per_token = token_terms(
                self.algo, mb, chunk_samples, (log_probs_BL, entropy_BL), chunk_old, chunk_ref
            )
            reduced = {
                k: algorithms.aggregate_loss(v, mask_BL, mode=mode, denominator=denominator)
                for k, v in per_token.items()
            }
            loss = reduced["train/pg_loss"] - algo.entropy_coef * reduced["train/entropy_loss"]
            if algo.use_kl_loss:
                loss = loss + algo.kl_loss_coef * reduced["train/kl_loss"]
            loss.backward()
            reduced["train/loss"] = loss
            for name, value in reduced.items():
                sums[name] = sums.get(name, 0.0) + float(value.detach())
        return self._optimizer_step(all_reduce_sum(sums, self.dist), step, apply_update)

    def _optimizer_step(self, sums: dict[str, float], step: int, apply_update: bool) -> dict[str, float]:
        """Clip the gradient, step AdamW and the scheduler; return `sums` with grad_norm, lr and step.

        Raises:
            NonFiniteError: the summed loss or the gradient norm is NaN/inf (no step is taken).
        """
        max_norm = self.opt_cfg.clip_grad if self.opt_cfg.clip_grad > 0 else math.inf
        grad_norm = full_tensor(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        if not (math.isfinite(float(grad_norm)) and math.isfinite(sums["train/loss"])):
            self.model.zero_grad(set_to_none=True)
            raise NonFiniteError(
                f"step {step}: train/loss = {sums['train/loss']}, train/grad_norm = {float(grad_norm)}; stopped before "
                "the optimizer step so the weights stay finite (lower --lr, check rewards and --train-dtype)"
            )
        if apply_update and self.optimizer is not None:
            self.optimizer.step()
            assert self.scheduler is not None
            lr = self.scheduler.get_last_lr()[0]
            self.scheduler.step()
        else:
            lr = 0.0
        self.model.zero_grad(set_to_none=True)
        sums["train/grad_norm"] = float(grad_norm)
        sums["train/lr-pg_0"] = float(lr)
        sums["train/step"] = float(step)
        return sums

    # ------------------------------------------------------------------ colocation
    def offload(self) -> None:
        """Move weights, reference (if built) and optimizer state to CPU (a no-op move on CPU runs)."""
        self._move(torch.device("cpu"))
        self.offloaded = True

    def onload(self) -> None:
        """Move everything back to the training device."""
        self._move(self.device)
        self.offloaded = False

    def _move(self, device: torch.device) -> None:
        self.model.to(device)
        if self.ref_model is not None:
            self.ref_model.to(device)
        if self.optimizer is not None:
            for state in self.optimizer.state.values():
                for k, v in state.items():
                    if isinstance(v, torch.Tensor) and k != "step":
                        state[k] = v.to(device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def local_named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, this rank's shard) for every distinct weight; equal to `named_weights` on one rank (no collective)."""
        seen: set[int] = set()
        for name, tensor in self.model.state_dict().items():
            local = getattr(tensor, "_local_tensor", tensor)
            if local.data_ptr() in seen:
                continue
            seen.add(local.data_ptr())
            yield name, local.detach()

    def optimizer_state(self) -> dict | None:
        """The optimizer state to checkpoint; multi-rank: gathered in full on rank 0 (a collective)."""
        if self.optimizer is None:
            return None
        if not self.dist.distributed:
            return self.optimizer.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_optimizer_state_dict(self.model, self.optimizer, options=options)

    def load_state(self, weights: dict[str, torch.Tensor], optimizer_state: dict | None) -> None:
        """Load full weights (HF names) and, when given, the full optimizer state saved by `optimizer_state`."""
        if not self.dist.distributed:
            with torch.no_grad():
                for name, tensor in self.local_named_weights():
                    tensor.copy_(weights[name])
            if optimizer_state is not None and self.optimizer is not None:
                self.optimizer.load_state_dict(optimizer_state)
            return
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, strict=False)  # tied weights are saved once
        set_model_state_dict(self.model, weights, options=options)
        if optimizer_state is not None and self.optimizer is not None:
            set_optimizer_state_dict(
                self.model, self.optimizer, optim_state_dict=optimizer_state, options=options
            )

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, full tensor) for every distinct weight, tied weights once (what the engine sync sends).

        Multi-rank: gathers each FSDP2 shard (a collective: every rank must iterate it fully).
        """
        seen: set[int] = set()
        for name, tensor in self.model.state_dict().items():
            local = getattr(tensor, "_local_tensor", tensor)  # an FSDP2 DTensor's shard
            key = local.data_ptr()
            if key in seen:
                continue
            seen.add(key)
            yield name, full_tensor(tensor.detach())
