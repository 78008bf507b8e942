"""Log-doctor rules for crashes in kernels and in the weight update (Miles' "Common kernel pitfalls",
Miles 101 manual §7.1): CUDA illegal memory access, a corrupt inductor cache, a failed weight update
(NCCL `Message truncated`, or a segfault next to a weight-update call) and a segfault elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from grpolab.diagnose.logdoctor.model import (
    KERNEL_PITFALLS,
    MANUAL_TROUBLE,
    MAX_EVIDENCE,
    NEARBY_LINES,
    Finding,
    Line,
    Mention,
    Rule,
    SignatureRule,
    clean_line,
    keep_line,
    register,
)

if TYPE_CHECKING:
    from grpolab.diagnose.logdoctor.ruleset import LogRules

INDUCTOR = Mention("torch inductor frame", ("_inductor", "torchinductor", "TORCHINDUCTOR"))
"""A torch inductor frame (a JSONDecodeError from its cache)."""

WEIGHT_UPDATE = Mention(
    "weight-update call",
    ("update_weight", "UpdateWeight", "sync_weights", "weight_sync", "WeightSync"),
    skip_metric_lines=True,
)
"""A weight-update call: Miles `update_weights*`, SGLang `UpdateWeights*`, grpolab `sync_weights`/`weight_sync`."""


@register
class IllegalMemoryAccess(SignatureRule):
    """CUDA illegal memory access (in SGLang, usually out of memory in disguise)."""

    id = "illegal_memory_access"
    severity = "error"
    needles = (
        b"CUDA error: an illegal memory access",
        b"[CUDA]: an illegal memory access",
        b"CUDA_ERROR_ILLEGAL_ADDRESS",
    )
    cause = "In SGLang this is usually an out-of-memory condition in disguise."
    fix = (
        "Lower --sglang-mem-fraction-static. To find the kernel, rerun with "
        "CUDA_LAUNCH_BLOCKING=1 (slow) and try without CUDA graphs or speculative decoding."
    )
    source = KERNEL_PITFALLS

    title = "CUDA illegal memory access"
    evidence_focus = "illegal memory access"


@register
class InductorCache(Rule):
    """A JSONDecodeError with a torch inductor frame nearby: a corrupt compile cache."""

    id = "inductor_cache"
    severity = "error"
    needles = (b"JSONDecodeError",)
    mentions = (INDUCTOR,)
    fix = "Set TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 (or delete the inductor cache directory) and rerun."
    source = KERNEL_PITFALLS

    def __init__(self, log: LogRules) -> None:
        super().__init__(log)
        self.lines: list[Line] = []

    def observe(self, line: Line) -> None:
        # the exception, not a frame that raises it
        if "JSONDecodeError:" in line.text and keep_line(self.lines, line):
            self.log.ask_context(self.id, line)

    def findings(self, earlier: Sequence[Finding]) -> list[Finding]:
        lines = [ln for ln in self.lines if self.log.near(INDUCTOR, ln.line)]
        if not lines:
            return []
        mention = self.log.near(INDUCTOR, lines[0].line)
        evidence = [self.ev(ln, focus="JSONDecodeError") for ln in lines[:MAX_EVIDENCE]]
        evidence += self.log.mention_evidence(mention, "inductor frame")
        return [
            self.finding(
                "JSONDecodeError from torch inductor: corrupt compile cache",
                sorted(evidence, key=lambda e: e.line),
                {"lines": len(lines), "inductor_line": mention},
                cause=(
                    f"torch inductor failed to read a cache entry (inductor frame at line {mention}); the "
                    "compile cache is corrupt, e.g. after a run was killed while writing it."
                ),
            )
        ]


@register
class NcclWeightUpdate(Rule):
    """The weight update failed: NCCL `Message truncated`, or a segfault with a weight-update call
    within NEARBY_LINES (the segfault lines are `Segfault`'s)."""

    id = "nccl_weight_update"
    severity = "error"
    needles = (b"NCCL WARN", b"NCCL error")
    mentions = (WEIGHT_UPDATE,)
    source = f"{MANUAL_TROUBLE} (The weight update fails on many GPUs)"

    def __init__(self, log: LogRules) -> None:
        super().__init__(log)
        self.truncated: list[Line] = []

    def observe(self, line: Line) -> None:
        if "Message truncated" in line.text:
            if keep_line(self.truncated, line):
                self.log.ask_context(f"{self.id}/truncated", line)
        else:
            self.log.ask_context(self.id, line)  # torch prints NCCL's "Last error:" lines below it

    def on_context(self, line_no: int, text: str) -> None:
        if "Message truncated" in text:
            keep_line(self.truncated, Line(line_no, clean_line(text)))

    def findings(self, earlier: Sequence[Finding]) -> list[Finding]:
        near = self.log.near
        crashes = [(ln, "message_truncated", near(WEIGHT_UPDATE, ln.line)) for ln in self.truncated]
        crashes += [(ln, "segfault", near(WEIGHT_UPDATE, ln.line)) for ln in self.log.rule(Segfault).lines]
        crashes.sort(key=lambda item: item[0].line)
        crashes = [(ln, key, at) for ln, key, at in crashes if key == "message_truncated" or at]
        if not crashes:
            return []
        truncated = any(key == "message_truncated" for _, key, _ in crashes)
        segfault = any(key == "segfault" for _, key, _ in crashes)
        call = next((at for _, _, at in crashes if at), None)
        what = " and ".join(
            w for w, on in (("Message truncated", truncated), ("a segmentation fault", segfault)) if on
        )
        causes, fixes = [], []
        if segfault:
            causes.append(
                "A report in the Miles tracker: a colocated update with pipeline stages crashed with a "
                "segmentation fault in NCCL 2.29 and 2.30 with a tuner plugin."
            )
            fixes.append("Segfault: update NCCL to 2.31 or later.")
        if truncated:
            causes.append(
                "A report in the Miles tracker: deterministic serving on two GPUs set a different number of NCCL "
                "channels than the trainer, and the transfer failed with a size mismatch (Message truncated)."
            )
            fixes.append(
                "Message truncated: turn off deterministic serving on multi-GPU engines until a fix is released "
                "(NCCL_DEBUG=INFO shows the channel counts of both sides)."
            )
        evidence = [self.ev(ln) for ln, _, _ in crashes[:MAX_EVIDENCE]]
        evidence += self.log.mention_evidence(call, "weight update")
        return [
            self.finding(
                f"the weight update failed: {what}",
                sorted(evidence, key=lambda e: e.line),
                {
                    "lines": len(crashes),
                    "weight_update_line": call,
                    "segfault": segfault,
                    "truncated": truncated,
                },
                cause=" ".join(causes) + (f" The weight-update call is at line {call}." if call else ""),
                fix=" ".join(fixes),
            )
        ]


@register
class Segfault(Rule):
    """A segmentation fault with no weight-update call within NEARBY_LINES (next to one, it is
    `NcclWeightUpdate`'s)."""

    id = "segfault"
    severity = "error"
    needles = (b"Segmentation fault", b"SIGSEGV")
    mentions = (WEIGHT_UPDATE,)
    cause = (
        f"A native crash outside a weight update (no weight-update call within {NEARBY_LINES} "
        "lines): a kernel, a communication library or an extension module."
    )
    fix = (
        "Read the stack printed after the fault (Python's faulthandler lists the frames); rerun "
        "with CUDA_LAUNCH_BLOCKING=1 and NCCL_DEBUG=INFO to find the call."
    )
    source = KERNEL_PITFALLS

    def __init__(self, log: LogRules) -> None:
        super().__init__(log)
        self.lines: list[Line] = []

    def observe(self, line: Line) -> None:
        if "root causes" in line.text or "SIGSEGV or other" in line.text:
            return  # Ray's worker-died message lists SIGSEGV among possible causes
        if keep_line(self.lines, line):
            self.log.ask_context(self.id, line)

    def findings(self, earlier: Sequence[Finding]) -> list[Finding]:
        lines = [ln for ln in self.lines if not self.log.near(WEIGHT_UPDATE, ln.line)]
        if not lines:
            return []
        return [
            self.finding(
                "a process crashed with a segmentation fault",
                (self.ev(ln) for ln in lines[:MAX_EVIDENCE]),
                {"lines": len(lines)},
            )
        ]
