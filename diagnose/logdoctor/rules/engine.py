"""Log-doctor rules for a run, or its rollout engine, that cannot start or runs out of memory (Miles 101
manual §7.1): a reward module that does not import, the FlashAttention 3 SM check, Ray's node-memory
kill, a rejected attention implementation, CUDA out of memory at engine start (or a tiny KV cache), and
CUDA out of memory later.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from grpolab.diagnose.logdoctor.model import (
    MANUAL_TROUBLE,
    MAX_EVIDENCE,
    Evidence,
    Finding,
    Line,
    Rule,
    SignatureRule,
    clean_line,
    register,
)

if TYPE_CHECKING:
    from grpolab.diagnose.logdoctor.ruleset import LogRules

_MODULE = re.compile(r"No module named '([^']+)'")
_KV_TOKENS = re.compile(r"#tokens: (\d+)")
_RAY_MEMORY = re.compile(
    r"Memory on the node \(IP: (?P<ip>[^,)]+)(?:, ID: (?P<id>\w+))?\).*? was (?P<used>[\d.]+) ?GB"
    r" / (?P<total>[\d.]+) ?GB \((?P<fraction>[\d.]+)\)"
)
_ATTN_NAME = re.compile(r'attn_implementation="?([^"`\s]+?)"?`? is not')
_ATTN_KEY = re.compile(r"`([^`]+)` is not a valid attention implementation")
_ATTN_ACCEPTED = re.compile(r'"(?:attn_implementation=)?([\w|]+)"')


@register
class RewardModuleMissing(Rule):
    """ModuleNotFoundError (usually the --custom-rm-path module) with no rollout line after it: the
    run hangs instead of failing."""

    id = "reward_module_missing"
    severity = "error"
    needles = (b"ModuleNotFoundError",)
    launch_flag = "custom-rm-path"
    source = f"{MANUAL_TROUBLE} (The run hangs after a reward import error)"

    def __init__(self, log: LogRules) -> None:
        super().__init__(log)
        self.modules: list[tuple[Line, str]] = []
        self.custom_rm_path: str | None = None

    def observe(self, line: Line) -> None:
        m = _MODULE.search(line.text)
        if m:
            self.modules.append((line, m.group(1)))

    def wants_launch_line(self) -> bool:
        return bool(self.modules) and self.custom_rm_path is None

    def on_launch_line(self, text: str) -> None:
        if self.custom_rm_path is None:
            from grpolab.rundir.foreign_logs import parse_flags

            self.custom_rm_path = parse_flags(clean_line(text)).get("custom-rm-path")

    def findings(self, earlier: Sequence[Finding]) -> list[Finding]:
        log = self.log
        for line, module in self.modules:
            if log.rollout_after(line.line):
                continue
            same = [(ln, m) for ln, m in self.modules if m == module]
            rm_note = ""
            if self.custom_rm_path:
                rm_module = self.custom_rm_path.rpartition(".")[0]
                if rm_module == module or rm_module.startswith(module + "."):
                    rm_note = f" It is the module of --custom-rm-path {self.custom_rm_path}."
                else:
                    rm_note = f" (--custom-rm-path is {self.custom_rm_path}.)"
            before = (
                ""
                if log.first_rollout is None or log.first_rollout > line.line
                else " (rollouts ran before it)"
            )
            return [
                self.finding(
                    f"ModuleNotFoundError for {module!r} and no rollout line after it{before}",
                    (self.ev(ln) for ln, _ in same[:MAX_EVIDENCE]),
                    {"module": module, "lines": len(same), "custom_rm_path": self.custom_rm_path},
                    cause=(
                        f"The run cannot import {module!r}, usually the module that --custom-rm-path names, "
                        "because PYTHONPATH does not reach its folder." + rm_note + " No `rollout N` line "
                        "follows the error: a Miles run does not stop by itself here (the manual's test "
                        "stayed up two hours), and the watchdog does not stop it either, because the "
                        "engine writes only a few 503 errors."
                    ),
                    fix=(
                        "Stop the run, make the module importable (PYTHONPATH=<folder holding it>, passed "
                        "on to the Ray workers; check with `python -c 'import "
                        f"{module}'` in the same environment), then start the run again."
                    ),
                )
            ]
        return []


@register
class Fa3Sm(SignatureRule):
    """FlashAttention 3's SM 8.0-9.0 assertion: the rollout engine stops at start."""

    id = "fa3_sm"
    severity = "error"
    needles = (b"requires SM>=80 and SM<=90",)
    cause = (
        "The run asked for FlashAttention 3 (usually through true on-policy mode) on a GPU "
        "outside its range (compute capability 8.0 to 9.0, Ampere/Hopper). The engine dies "
        "during startup and the trainer keeps sending it requests (503 errors)."
    )
    fix = (
        "On a non-Hopper GPU drop true on-policy mode and use the default attention backend. "
        "The error suggests `--attention-backend flashinfer`: that gives a normal run, not a "
        "bit-exact one."
    )
    source = f"{MANUAL_TROUBLE} (The engine stops at start with a FlashAttention 3 error)"

    title = "the rollout engine stopped at start: FlashAttention 3 needs an SM 8.0-9.0 GPU"


@register
class RayOom(Rule):
    """Ray killed a worker for node memory (OutOfMemoryError), with the node's memory figures."""

    id = "ray_oom"
    severity = "error"
    # Ray's memory kill: "Memory on the node (IP: …) was U GB / T GB (f)" in the worker's error, and a
    # hint naming `RAY_memory_usage_threshold` (also in the raylet's summary); the OutOfMemoryError
    # line is on the same line or just above
    needles = (b"Memory on the node (IP: ", b"`RAY_memory_usage_threshold")
    fix = (
        "Use a smaller model or less work per step (rollout batch, answers per prompt, "
        "response length, micro-batch), and leave Ray's threshold at its default. A lower "
        "engine memory fraction did not help the manual's 4B run."
    )
    source = f"{MANUAL_TROUBLE} (The job stops with a Ray OutOfMemoryError), Miles 101 manual §2.3"

    def __init__(self, log: LogRules) -> None:
        super().__init__(log)
        self.memory: list[tuple[Line, dict[str, str]]] = []
        self.oom_lines: dict[int, Line] = {}

    @property
    def seen(self) -> bool:
        """Whether the log shows a Ray memory kill."""
        return bool(self.memory or self.oom_lines)

    def observe(self, line: Line) -> None:
        self.on_context(line.line, line.text)
        if "OutOfMemoryError" not in line.text:
            self.log.ask_context(self.id, line)

    def on_context(self, line_no: int, text: str) -> None:
        if "OutOfMemoryError" in text:
            self.oom_lines.setdefault(line_no, Line(line_no, clean_line(text)))
        if "Memory on the node" in text and not any(ln.line == line_no for ln, _ in self.memory):
            m = _RAY_MEMORY.search(text)
            if m:
                self.memory.append((Line(line_no, clean_line(text)), m.groupdict()))
                self.memory.sort(key=lambda item: item[0].line)

    def findings(self, earlier: Sequence[Finding]) -> list[Finding]:
        if not self.seen:
            return []
        evidence: dict[int, Evidence] = {
            ln.line: self.ev(ln, focus="OutOfMemoryError") for ln in self.oom_lines.values()
        }
        for ln, _ in self.memory:
            evidence.setdefault(ln.line, self.ev(ln, focus="Memory on the node"))
        figures = self.memory[0][1] if self.memory else None
        if figures:
            used, total = float(figures["used"]), float(figures["total"])
            quote = (
                f"node {figures['ip']} at {figures['used']} GB of {figures['total']} GB "
                f"({float(figures['fraction']) * 100:.1f} %)"
            )
            title = f"Ray killed a worker: {quote}"
        else:
            used = total = None
            quote = "the node's memory figures are not in the log"
            title = "Ray killed a worker for node memory (OutOfMemoryError)"
        cuda_lines = self.log.rule(CudaOom).lines
        cuda = (
            f" A CUDA out-of-memory error is in the log too (line {cuda_lines[0][0].line})."
            if cuda_lines
            else (" There is no CUDA out-of-memory error: this is host (or unified) memory, not a GPU's.")
        )
        return [
            self.finding(
                title,
                sorted(evidence.values(), key=lambda e: e.line)[:MAX_EVIDENCE],
                {
                    "node_ip": figures["ip"] if figures else None,
                    "used_gb": used,
                    "total_gb": total,
                    "fraction": float(figures["fraction"]) if figures else None,
                    "lines": len(evidence),
                },
                cause=(
                    "Ray reads one memory figure for the whole node and kills a worker when the node is "
                    f"above its threshold (0.95 by default): {quote}. On unified memory (GB10, GH200) the "
                    "GPU's allocations count as node memory." + cuda
                ),
            )
        ]


@register
class AttnImplementation(Rule):
    """transformers rejects the requested attention implementation (and lists the accepted ones)."""

    id = "attn_implementation"
    severity = "error"
    needles = (b"Specified `attn_implementation", b"`AttentionInterface`")
    fix = (
        "Pick one from that list (sdpa, or eager for the plainest path) for the trainer's "
        "attention setting; leave it at its default unless you need another kernel."
    )
    source = (
        f"{MANUAL_TROUBLE} (The trainer rejects the attention implementation), transformers "
        "modeling_utils get_correct_attn_implementation"
    )

    def __init__(self, log: LogRules) -> None:
        super().__init__(log)
        self.rejected: list[tuple[Line, str, list[str]]] = []

    def observe(self, line: Line) -> None:
        text = line.text
        if "is not supported" not in text and "not a valid attention implementation" not in text:
            return
        m = _ATTN_NAME.search(text) or _ATTN_KEY.search(text)
        name = m.group(1) if m else ""
        tail = text.split("The only possible arguments are", 1)
        accepted = list(dict.fromkeys(_ATTN_ACCEPTED.findall(tail[1]))) if len(tail) == 2 else []
        self.rejected.append((line, name, accepted))

    def findings(self, earlier: Sequence[Finding]) -> list[Finding]:
        if not self.rejected:
            return []
        _, name, accepted = self.rejected[0]
        accepted_text = ", ".join(accepted) if accepted else "the names in the error"
        return [
            self.finding(
                f"transformers rejects the attention implementation {name or '(unnamed)'!r}",
                (self.ev(ln, focus="attn_implementation") for ln, _, _ in self.rejected[:MAX_EVIDENCE]),
                {"requested": name, "accepted": accepted},
                cause=(
                    f"The trainer asked transformers for attention {name!r}, which the installed version "
                    f"does not accept for this model. It accepts: {accepted_text}."
                ),
            )
        ]


@register
class EngineOomStart(Rule):
    """CUDA out of memory before the first rollout (the engine's memory fraction does not fit), or,
    as a warning, a KV cache below `RuleOptions.min_kv_tokens` (the fraction is too low)."""

    id = "engine_oom_start"
    severity = "error"
    needles = (b"KV Cache is allocated",)  # and the CUDA out-of-memory lines `CudaOom` keeps
    source = f"{MANUAL_TROUBLE} (The engine runs out of memory at start)"

    def __init__(self, log: LogRules) -> None:
        super().__init__(log)
        self.kv: list[tuple[Line, int]] = []
        """SGLang's `KV Cache is allocated` lines and their token counts."""

    def observe(self, line: Line) -> None:
        m = _KV_TOKENS.search(line.text)
        if m:
            self.kv.append((line, int(m.group(1))))

    def findings(self, earlier: Sequence[Finding]) -> list[Finding]:
        out = []
        early = [ln for ln, before_rollout in self.log.rule(CudaOom).lines if before_rollout]
        if early:
            ray = (
                " Ray's OutOfMemoryError is in the log too: read that finding first."
                if self.log.rule(RayOom).seen
                else ""
            )
            out.append(
                self.finding(
                    "CUDA out of memory before the first rollout: the engine's memory fraction does not fit",
                    (self.ev(ln, focus="out of memory") for ln in early[:MAX_EVIDENCE]),
                    {"lines": len(early)},
                    cause=(
                        "--sglang-mem-fraction-static does not fit the GPU. With --colocate the trainer "
                        "already holds GPU memory when the engine starts; a fraction that is too high "
                        "leaves no room for activations and CUDA graphs." + ray
                    ),
                    fix=(
                        "Lower --sglang-mem-fraction-static by 0.05-0.1 at a time (Miles asks for 0.8 or "
                        "lower with --colocate; the manual's runs used 0.4)."
                    ),
                )
            )
        floor = self.log.options.min_kv_tokens
        small = [(ln, n) for ln, n in self.kv if n < floor]
        if small:
            tokens = min(n for _, n in small)
            out.append(
                self.finding(
                    f"tiny KV cache: {tokens:,} tokens (grpolab's floor {floor:,})",
                    (self.ev(ln, focus="KV Cache") for ln, _ in small[:MAX_EVIDENCE]),
                    {"kv_tokens": tokens, "min_kv_tokens": floor},
                    severity="warning",
                    cause=(
                        "A --sglang-mem-fraction-static that is too low leaves the engine almost no KV "
                        f"cache: it holds {tokens:,} tokens, so requests queue and rollouts crawl. The "
                        "manual's engine at 0.02 held 3,082 tokens and its first rollout took 386 s "
                        "against 61 s at 0.25 (345,645 tokens)."
                    ),
                    fix=(
                        "Raise --sglang-mem-fraction-static by 0.05-0.1 at a time until #tokens covers a "
                        "rollout (answers in flight × their length); keep it at 0.8 or lower with --colocate."
                    ),
                )
            )
        return out


@register
class CudaOom(Rule):
    """CUDA out of memory after the first rollout (training, or the engine after a reload). It keeps
    every CUDA out-of-memory line; the earlier ones are `EngineOomStart`'s."""

    id = "cuda_oom"
    severity = "error"
    needles = (b"CUDA out of memory", b"CUDA error: out of memory")
    cause = (
        "A GPU ran out of memory after the first rollout: in training (micro-batch or sequence "
        "too long) or in the engine after the trainer's offload/reload cycle under --colocate."
    )
    fix = (
        "Read the lines above for the process (trainer or engine). Trainer: lower the "
        "micro-batch or max tokens per GPU. Engine under --colocate: lower "
        "--sglang-mem-fraction-static to 0.7 or 0.6."
    )
    source = "Miles debugging: Does step 2 OOM under colocate?"

    def __init__(self, log: LogRules) -> None:
        super().__init__(log)
        self.lines: list[tuple[Line, bool]] = []
        """Every CUDA out-of-memory line, and whether it came before the first rollout line."""

    def observe(self, line: Line) -> None:
        if not self.lines or self.lines[-1][0].line != line.line:
            self.lines.append((line, self.log.first_rollout is None))

    def findings(self, earlier: Sequence[Finding]) -> list[Finding]:
        late = [ln for ln, before_rollout in self.lines if not before_rollout]
        if not late:
            return []
        return [
            self.finding(
                "CUDA out of memory after the run started",
                (self.ev(ln, focus="out of memory") for ln in late[:MAX_EVIDENCE]),
                {"lines": len(late)},
            )
        ]
