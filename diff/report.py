"""What `grpolab diff` found: the report's dataclasses, their JSON form and their text form.

The report goes as deep as the data allows (issue 13): the set-up (flags, environment, data files),
the first step where a metric differs, the first differing sample/token of a rollout both runs
recorded, and the first parameter whose per-step hash differs. Nothing here reads files or compares
values: `grpolab.diff.compare` fills a `RunDiff`, the CLI prints `render()` or `to_dict()`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Verdict = Literal["identical", "differs", "cannot_judge"]

EXIT_CODES: dict[str, int] = {"identical": 0, "differs": 1, "cannot_judge": 2}
"""`grpolab diff`'s exit code per verdict (issue 13: 0 identical, 1 differs, 2 cannot judge)."""


@dataclass(frozen=True)
class SetupDifference:
    """One set-up value that differs between the runs.

    Attributes:
        section: "flags" (resolved config), "env" (environment fingerprint) or "data" (data identity).
        key: the dotted key inside the section, e.g. "rollout.seed" or "torch".
        a / b: the value in run A / run B; None when that run does not record it.
        only: "A" or "B" when only that run records the key (a run directory against a Miles log
            shares few flags: the text report counts these instead of listing them); "" otherwise.
    """

    section: str
    key: str
    a: object
    b: object
    only: str = ""


@dataclass(frozen=True)
class MetricDivergence:
    """The first step where one metric differs beyond the tolerance.

    Attributes:
        key: the metric key, e.g. "train/loss".
        step: the step number (train step for train/* keys, rollout id for the others).
        a / b: the two values at that step (float; NaN when a run logged NaN).
        band: (low, high) of the baseline runs at that step, when `--baseline` gave at least two runs;
            the metric then counts as differing only where B is outside the band. None otherwise.
    """

    key: str
    step: int
    a: float
    b: float
    band: tuple[float, float] | None = None


@dataclass(frozen=True)
class SampleDivergence:
    """The first sample and token where two recordings of the same rollout differ.

    Attributes:
        rollout_id: the recorded rollout both runs have.
        prompt_index / sample_index: the sample's group (prompt) index and index within the group.
        token_index: index in the response tokens of the first differing token (None: the responses
            agree token for token and differ in another field, e.g. the reward).
        token_a / token_b: token ids at that index (None past the end of a response).
        logprob_a / logprob_b: engine log-probs at that index (None when not recorded there).
        text_a / text_b: the response text around the token (decoded when the run's tokenizer is
            on disk, else the ids as text).
        field: what differs first: "tokens", "logprobs", "prompt", "reward" or "count".
    """

    rollout_id: int
    prompt_index: int
    sample_index: int
    token_index: int | None
    token_a: int | None
    token_b: int | None
    logprob_a: float | None
    logprob_b: float | None
    text_a: str
    text_b: str
    field: str = "tokens"


@dataclass(frozen=True)
class LayerDivergence:
    """The first parameter whose per-step hash differs.

    Attributes:
        step: the optimizer step whose hashes were compared (checks/model_hash_step_<step>.json).
        name: the parameter name (as in `model.named_parameters()`).
        hash_a / hash_b: the two hex digests (checkers/model_hash.py `layer_hashes`).
    """

    step: int
    name: str
    hash_a: str
    hash_b: str


@dataclass
class RunDiff:
    """`grpolab diff`'s result for runs A and B.

    Attributes:
        run_a / run_b: the compared paths (as given).
        verdict: "identical" (nothing differs within the tolerance and everything could be judged),
            "differs" (something differs) or "cannot_judge" (nothing differs but something could not
            be compared: fail closed, never "identical").
        tol: the tolerance used (0 = bitwise).
        setup: set-up differences (flags, env, data), in section order then key order.
        metrics: per metric, its first divergent step; sorted by step then key.
        first_step: the first step where any metric differs (None: none differs).
        common_steps: how many step numbers both runs logged for at least one common metric.
        sample: the first differing sample/token of the first rollout both runs recorded that differs.
        layer: the first parameter whose hash differs after the first divergent step.
        notes: what could not be judged and why, in plain words.
        runs: how a run that is not complete ended ("run B: failed, 3/3 rollouts: it failed:
            RuntimeError: boom"; `rundir.completion`, the rule of `grpolab gate`'s status row): said, but not part of the verdict.
    """

    run_a: str
    run_b: str
    verdict: Verdict
    tol: float = 0.0
    setup: list[SetupDifference] = field(default_factory=list)
    metrics: list[MetricDivergence] = field(default_factory=list)
    first_step: int | None = None
    common_steps: int = 0
    sample: SampleDivergence | None = None
    layer: LayerDivergence | None = None
    notes: list[str] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """0 identical, 1 differs, 2 cannot judge."""
        return EXIT_CODES[self.verdict]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with the same content as `render()` (NaN/inf floats become strings)."""
        out = _json_safe(asdict(self))
        out["exit_code"] = self.exit_code
        return out

    def render(self) -> str:
        """The CLI's text report, top to bottom: verdict, set-up, metrics, sample/token, layer, notes."""
        lines = [f"grpolab diff: {self.run_a}  vs  {self.run_b}"]
        tol = "bitwise" if self.tol == 0 else f"tolerance {self.tol:g}; hashes compare exactly"
        steps = f"{self.common_steps} common step{'' if self.common_steps == 1 else 's'}"
        lines.append(f"verdict: {self.verdict.replace('_', ' ')} ({tol}; {steps})")
        lines += [f"status: {r}" for r in self.runs]
        lines += _render_setup(self.setup)
        lines += _render_metrics(self.metrics, self.first_step, self.common_steps)
        if self.sample is not None:
            lines += _render_sample(self.sample)
        if self.layer is not None:
            lay = self.layer
            lines.append(f"layer: after step {lay.step}, first differing parameter {lay.name}")
            lines.append(f"  A {lay.hash_a}\n  B {lay.hash_b}")
        if self.notes:
            lines.append("notes:")
            lines += [f"  - {n}" for n in self.notes]
        return "\n".join(lines)


def _render_setup(setup: list[SetupDifference]) -> list[str]:
    """The set-up section's lines."""
    both = [d for d in setup if not d.only]
    one_sided = {side: sum(1 for d in setup if d.only == side) for side in ("A", "B")}
    alone = ", ".join(f"{n} key{'' if n == 1 else 's'} only in run {x}" for x, n in one_sided.items() if n)
    if not both:
        if alone:
            return [f"setup: the keys both runs record agree ({alone}: not listed, see --json)"]
        return ["setup: same flags, environment and data"]
    lines = ["setup:"]
    for d in both:
        lines.append(f"  {d.section}.{d.key}: {_show(d.a)}  ->  {_show(d.b)}")
    if alone:
        lines.append(f"  ({alone}: not listed, see --json)")
    return lines


def _render_metrics(metrics: list[MetricDivergence], first_step: int | None, common: int) -> list[str]:
    """The metrics section's lines."""
    if not metrics:
        return [
            "metrics: no metric differs on the common steps"
            if common
            else "metrics: no common step to compare"
        ]
    lines = [f"metrics: first divergent step {first_step}"]
    for m in metrics:
        band = "" if m.band is None else f"  (baseline band [{m.band[0]:.6g}, {m.band[1]:.6g}])"
        lines.append(f"  step {m.step} {m.key}: {m.a!r} -> {m.b!r}{band}")
    return lines


def _render_sample(s: SampleDivergence) -> list[str]:
    """The sample/token section's lines."""
    where = f"rollout {s.rollout_id}, prompt {s.prompt_index}, sample {s.sample_index}"
    if s.token_index is None:
        return [f"sample: {where}: {s.field} differs", f"  A {s.text_a}", f"  B {s.text_b}"]
    return [
        f"sample: {where}, token {s.token_index} ({s.field}): "
        f"id {s.token_a} vs {s.token_b}, logprob {s.logprob_a} vs {s.logprob_b}",
        f"  A …{s.text_a}…",
        f"  B …{s.text_b}…",
    ]


def _show(value: object) -> str:
    """A set-up value for the text report ("(absent)" for None)."""
    return "(absent)" if value is None else repr(value)


def _json_safe(value: Any) -> Any:
    """Recursively replace non-finite floats by their names (JSON has no NaN) and tuples by lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)
