"""The parity ladder: where trainer and engine stop agreeing, one stage at a time (issue 24).

The Miles-101 manual (section 8) names the sources of trainer/engine disagreement; one end-to-end gap
cannot say which stage broke. Each rung compares two ways of computing the log-probs of the same
tokens and reports bitwise-equal positions of the total, the largest |Δ log-prob| and the first
differing sample and token:

1. engine decode vs engine prefill of the same tokens (its KV-cache path against a full forward);
2. a request alone vs in a batch of N (random companions), and vs companions sharing its prompt;
3. the trainer at micro-batch 1 vs N, and packed by prompt vs padded (core/shared_prefix.py);
4. trainer vs engine (and, with `true_on_policy`, both scoring each answer alone: bitwise);
5. transformers' own forward (its default call) vs the engine, and transformers' greedy `generate` vs
   the engine's greedy answers: the first divergent token per sample, the top-5 overlap there, and
   the accuracy of both on the prompts' labels (the AReaL guide's third step, with tokens).

A rung passes when its bar holds: bitwise where grpolab claims bitwise (the engine's prefill is
batch-invariant by construction; trainer vs engine under `--true-on-policy-mode`), |Δ| <= `tol`
elsewhere. Tensor work only; loading and printing are parity_command.py's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from grpolab.core.batch import Sample
from grpolab.core.engine.base import GenerationRequest, GenerationResult, SamplingParams
from grpolab.core.engine.torch_engine import TorchEngine
from grpolab.core.sequence_forward import Answer, rescored


@dataclass
class Rung:
    """One comparison of the ladder.

    Attributes:
        name: what is compared ("engine decode vs engine prefill", ...); bar: "bitwise" or "tol".
        equal / total: bitwise-equal positions of all compared; max_abs: the largest |Δ| (nats).
        first: (sample, answer token) of the first position beyond the bar, or None.
        passed: the bar holds; cause: what a failure most likely means; note: extra facts.
        skipped: the rung could not run here (it passes; `note` says why).
    """

    name: str
    bar: str
    equal: int
    total: int
    max_abs: float
    first: tuple[int, int] | None
    passed: bool
    cause: str
    note: str = ""
    skipped: bool = False

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def compare(name: str, a: list[torch.Tensor], b: list[torch.Tensor], *, bitwise: bool, tol: float, cause: str,
            note: str = "") -> Rung:  # fmt: skip
    """The rung of two per-sample lists of [T] float32 log-probs (a shorter one is compared up to its end)."""
    equal = total = 0
    max_abs = 0.0
    first = None
    for i, (x, y) in enumerate(zip(a, b)):
        n = min(len(x), len(y))
        x, y = x[:n].double(), y[:n].double()
        diff = (x - y).abs()
        total += n
        equal += int((x == y).sum())
        if n:
            max_abs = max(max_abs, float(diff.max()))
        beyond = (x != y) if bitwise else diff > tol
        if first is None and bool(beyond.any()):
            first = (i, int(beyond.nonzero()[0, 0]))
    return Rung(
        name, "bitwise" if bitwise else "tol", equal, total, max_abs, first, first is None, cause, note
    )


def same_token_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens two answers share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class LocalEngine:
    """The in-process engine as the ladder's engine side (`ServerEngine` in parity_server.py is the other).

    `prefill` scores answers by the engine's own prefill of each alone over the decode's kept support;
    `top_ids` is the engine's k most likely next tokens after `ids`; `rescores_by_prefill` says whether
    the log-probs `generate` returns are already that prefill's (`--true-on-policy-mode`).
    """

    def __init__(self, engine: TorchEngine) -> None:
        self.engine = engine
        self.name = "the in-process engine"
        self.rescores_by_prefill = engine.true_on_policy
        self.vocab_size = int(engine.model.config.vocab_size)

    def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        return self.engine.generate(requests, params)

    def prefill(self, answers: list[Answer], temperature: float) -> list[torch.Tensor] | None:
        with torch.inference_mode():
            return rescored(self.engine.model, answers, temperature=temperature, vocab_size=self.vocab_size,
                            device=self.engine.device)  # fmt: skip

    def top_ids(self, ids: list[int], k: int) -> set[int]:
        with torch.inference_mode():
            return set(self.engine.model(torch.tensor([ids])).logits[0, -1].topk(k).indices.tolist())


def engine_rungs(side: Any, prompts: list[list[int]], seeds: list[int], sampling: SamplingParams, *,
                 tol: float) -> tuple[list[Rung], list[GenerationResult], list[torch.Tensor] | None]:  # fmt: skip
    """Rungs 1-2 (see the module docstring; decode vs prefill on each request alone, so a batch fault
    shows first on the batch rung) on `side` (`LocalEngine` or parity_server.ServerEngine), the batch's
    answers (decode log-probs) and their prefill log-probs (each answer alone: the engine's side under
    `--true-on-policy-mode`; None when `side` cannot prefill over the kept support)."""
    requests = [GenerationRequest(prompt_ids=p, seed=s) for p, s in zip(prompts, seeds)]
    alone = [side.generate([r], sampling)[0] for r in requests]
    batch = side.generate(requests, sampling)

    def prefill(results: list[GenerationResult]) -> list[torch.Tensor] | None:
        answers = [
            Answer(r.prompt_ids, res.response_ids, res.kept_token_ids) for r, res in zip(requests, results)
        ]
        return side.prefill(answers, sampling.temperature)

    alone_prefill = prefill(alone)
    cause = ("the engine's KV-cache decode computes other numbers than its full forward (a decoder kernel, the "
             "cache's dtype or layout)")  # fmt: skip
    if alone_prefill is None:
        rungs = [skipped("engine decode vs engine prefill", f"skipped: {side.name} cannot prefill over the "
                         "kept top-p/top-k support (run with --rollout-top-p 1 --rollout-top-k 0)")]  # fmt: skip
    else:
        rungs = [compare("engine decode vs engine prefill", [r.log_probs for r in alone], alone_prefill,
                         bitwise=False, tol=tol, cause=cause)]  # fmt: skip
    rungs.append(_answers_rung("a request alone vs in a batch (random companions)", alone, batch, tol,
                               "the engine's numbers depend on the request's batch companions (padding, "
                               "batch-size-dependent kernels): not batch-invariant"))  # fmt: skip
    shared = [GenerationRequest(prompt_ids=prompts[0], seed=seeds[0] + k) for k in range(len(prompts))]
    together = side.generate(shared, sampling)
    apart = [side.generate([r], sampling)[0] for r in shared]
    rungs.append(_answers_rung("a request alone vs in a batch (companions sharing its prompt)", apart,
                               together, tol, "a prompt shared across the batch (one prefill, shared KV rows) "
                               "gives other numbers than the prompt alone"))  # fmt: skip
    return rungs, batch, (None if alone_prefill is None else prefill(batch))


def skipped(name: str, note: str, bar: str = "tol") -> Rung:
    """A rung that could not run (it passes: nothing was compared; `note` says why; `bar` the one it has)."""
    return Rung(name, bar, 0, 0, 0.0, None, True, "", note=note, skipped=True)


def _answers_rung(
    name: str, a: list[GenerationResult], b: list[GenerationResult], tol: float, cause: str
) -> Rung:
    """A rung over two runs of the same requests: log-probs compared where the answers still agree."""
    cut = [same_token_prefix(x.response_ids, y.response_ids) for x, y in zip(a, b)]
    diverged = sum(c < max(len(x.response_ids), len(y.response_ids)) for c, x, y in zip(cut, a, b))
    rung = compare(name, [x.log_probs[:c] for x, c in zip(a, cut)], [y.log_probs[:c] for y, c in zip(b, cut)],
                   bitwise=False, tol=tol, cause=cause)  # fmt: skip
    if diverged:
        rung.note = f"{diverged} of {len(a)} answers took another token (compared up to it)"
    return rung


def trainer_log_probs(actor: Any, samples: list[Sample]) -> list[torch.Tensor]:
    """`Actor.compute_log_probs` of `samples` (the policy), as float32 CPU tensors."""
    return [t.float() for t in actor.compute_log_probs(samples).log_probs]


def hf_forward_log_probs(model: torch.nn.Module, answers: list[Answer], temperature: float,
                         vocab_size: int) -> list[torch.Tensor]:  # fmt: skip
    """Each answer's log-probs from transformers' own default call (`model(input_ids)`: no mask, no
    positions, every position's logits), over the same kept support."""
    from grpolab.core import algorithms
    from grpolab.core.batch import collate

    out = []
    with torch.inference_mode():
        for a in answers:
            mb = collate([a], pad_id=0, vocab_size=vocab_size)
            logits = model(mb.input_ids_BL).logits
            lp = algorithms.token_log_probs(logits, mb.input_ids_BL, temperature=temperature,
                                            keep_mask_BLV=mb.keep_mask_BLV)  # fmt: skip
            out.append(mb.gather(lp)[0].float())
    return out


@dataclass
class GreedyRow:
    """One prompt's greedy answers: transformers' `generate` and the engine's (top-k 1)."""

    sample: int
    diverges_at: int | None
    top5_overlap: int | None
    hf_correct: bool
    engine_correct: bool


def greedy_rows(model: torch.nn.Module, side: Any, prompts: list[list[int]], labels: list[str],
                max_new_tokens: int, stop_ids: tuple[int, ...], decode: Any, reward: Any) -> list[GreedyRow]:  # fmt: skip
    """Per prompt: the first token where transformers' greedy answer and the engine's (`side`) differ, the
    overlap of both models' top-5 next tokens there (after the shared prefix), and each answer's reward."""
    params = SamplingParams(temperature=1.0, top_k=1, max_new_tokens=max_new_tokens, stop_token_ids=stop_ids)
    ours = side.generate([GenerationRequest(prompt_ids=p, seed=0) for p in prompts], params)
    rows = []
    with torch.inference_mode():
        for i, (p, res, label) in enumerate(zip(prompts, ours, labels)):
            ids = torch.tensor([p])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
                                 eos_token_id=list(stop_ids) or None, pad_token_id=0)  # fmt: skip
            theirs = _until_stop(out[0, len(p) :].tolist(), stop_ids)
            cut = same_token_prefix(theirs, res.response_ids)
            diverges = None if theirs == res.response_ids else cut
            overlap = None
            if diverges is not None:
                prefix = p + theirs[:cut]
                hf_top = set(model(torch.tensor([prefix])).logits[0, -1].topk(5).indices.tolist())
                overlap = len(hf_top & side.top_ids(prefix, 5))
            rows.append(GreedyRow(i, diverges, overlap, reward(decode(theirs), label) > 0,
                                  reward(decode(res.response_ids), label) > 0))  # fmt: skip
    return rows


def _until_stop(ids: list[int], stop_ids: tuple[int, ...]) -> list[int]:
    """`ids` up to and including the first stop token (the engine's answers end there too)."""
    for k, t in enumerate(ids):
        if t in stop_ids:
            return ids[: k + 1]
    return ids
