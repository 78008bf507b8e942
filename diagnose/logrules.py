"""The log doctor's rules: known failure signatures of GRPO runs, pure text → findings (no I/O).

Each rule names one failure from the Miles 101 manual's troubleshooting list (section 7.1), its
dead-engine watchdog (section 1.2), the Miles debugging page's "Common kernel pitfalls" table or the
AReaL debugging guide's hang patterns, and says what the log shows, why, and what to do.

How the scanner (logdoctor.py) and the rules meet:
- `SIGNATURES` lists fixed byte strings ("needles"). The scanner finds every line holding one and
  calls `LogRules.on_line(keys, line_no, text)` with the keys of the needles on that line. Lines
  without a needle are never decoded.
- A rule that needs nearby lines (a wandb frame around a TypeError, a weight-update call around a
  segfault) asks for them: after the pass the scanner reads ±`NEARBY_LINES` around each line of
  `wants_context()` and hands them to `add_context()`; `wants_launch_line()` asks for the launch
  command line (its --custom-rm-path) from the head of the log.
- The 503 lines of the dead-engine rule are too many for per-line work (200,533 in the manual's
  147 MB log). The scanner counts them per time bucket (`EngineErrors.bucket`) and hands over only
  the first line (with the lines above it) and the text of the last one.
- `LogRules.finish()` turns what was seen into `Finding`s, in the order of their first evidence line.

Rule ids: dead_engine, engine_503_bursts, reward_module_missing, fa3_sm, ray_oom, attn_implementation,
engine_oom_start, cuda_oom, illegal_memory_access, inductor_cache, nccl_weight_update, segfault,
nccl_watchdog_timeout, step0_gap, kl_nonzero_step0, grad_norm_nan, reward_nonfinite, wandb_group.
"""

from __future__ import annotations

import bisect
import calendar
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from grpolab.diagnose.dead_engine import (
    DEFAULT_PATTERN,
    WatchdogRule,
    count_in_window,
    replay_rule,
)

Severity = Literal["error", "warning", "info"]
SEVERITIES: tuple[Severity, ...] = ("error", "warning", "info")

MANUAL_WATCHDOG = "Miles 101 manual §1.2"
MANUAL_TROUBLE = "Miles 101 manual §7.1"
KERNEL_PITFALLS = "Miles debugging: Common kernel pitfalls"
AREAL_HANGS = "AReaL debugging guide (hangs, patterns B and C)"

DEFAULT_MAX_STEP0_GAP = 0.05
"""grpolab's limit for `train/train_rollout_logprob_abs_diff` at step 0: about 3× the top of the
manual's healthy range (0.0148-0.0157 for Qwen3-0.6B, §7.1), so ordinary variation across models and
seeds passes and a run whose engine and trainer read different weights (gaps of 0.1 and more) does not."""
DEFAULT_MIN_KV_TOKENS = 32_768
"""grpolab's floor for SGLang's `KV Cache is allocated ... #tokens: N`: the manual's healthy engine
held 345,645 tokens and one at 3,082 made the first rollout 6× slower (386 s against 61 s, §7.1).
32,768 tokens is a tenth of the healthy figure and ten times the slow one: room for 32 answers of
1,024 tokens at once."""
NEARBY_LINES = 40
"""grpolab's reach for context: a mention (a wandb frame, an inductor path, a weight-update call)
within this many lines before or after an error line belongs to it (a Python traceback rarely has
more frames than that)."""
MENTIONS: dict[str, tuple[str, ...]] = {
    "wandb": ("wandb",),
    "inductor": ("_inductor", "torchinductor", "TORCHINDUCTOR"),
    "weight_update": ("update_weight", "UpdateWeight", "sync_weights", "weight_sync", "WeightSync"),
}
"""Words that tie an error to its context: a wandb frame (the --wandb-group TypeError), a torch inductor
frame (a JSONDecodeError from its cache), a weight-update call (Miles `update_weights*`, SGLang
`UpdateWeights*`, grpolab `sync_weights`/`weight_sync`); metric lines do not count as weight updates."""
CONTEXT_FOR = {"json_decode_error", "none_plus_str", "message_truncated", "segfault"}
"""Rules whose error lines need their surroundings (the scanner reads ±NEARBY_LINES around them)."""
MAX_CONTEXT_LINES = 16
"""Error lines per rule whose surroundings are read (the first ones; a crash repeats its lines)."""
EVIDENCE_WIDTH = 240
"""Characters kept of an evidence line (a metric line is cut around the metric it is about)."""
MAX_EVIDENCE = 6
"""Evidence lines shown per finding (the count of all matching lines is in `details`)."""

DEAD_ENGINE_NEEDLE = DEFAULT_PATTERN.encode()


@dataclass(frozen=True)
class Signature:
    """A fixed byte string the scanner looks for, and the rule key it feeds."""

    key: str
    needle: bytes


SIGNATURES: tuple[Signature, ...] = (
    Signature("module_not_found", b"ModuleNotFoundError"),
    Signature("fa3_sm", b"requires SM>=80 and SM<=90"),
    Signature("ray_oom", b"Memory on the node (IP: "),
    Signature("ray_oom", b"`RAY_memory_usage_threshold"),
    Signature("cuda_oom", b"CUDA out of memory"),
    Signature("cuda_oom", b"CUDA error: out of memory"),
    Signature("attn_implementation", b"Specified `attn_implementation"),
    Signature("attn_implementation", b"`AttentionInterface`"),
    Signature("kv_cache", b"KV Cache is allocated"),
    Signature("illegal_memory_access", b"CUDA error: an illegal memory access"),
    Signature("illegal_memory_access", b"[CUDA]: an illegal memory access"),
    Signature("illegal_memory_access", b"CUDA_ERROR_ILLEGAL_ADDRESS"),
    Signature("json_decode_error", b"JSONDecodeError"),
    Signature("nccl_error", b"NCCL WARN"),
    Signature("nccl_error", b"NCCL error"),
    Signature("segfault", b"Segmentation fault"),
    Signature("segfault", b"SIGSEGV"),
    Signature("nccl_watchdog", b"collective operation timeout: WorkNCCL("),
    Signature("none_plus_str", b"'NoneType' and 'str'"),
    Signature("metric_line", b": {'"),
)
"""Needles → rule keys. Every needle is plain ASCII without a newline (the scanner relies on both)."""

_STAMP = re.compile(rb"(\d{4}-\d\d-\d\d)[T ](\d\d):(\d\d):(\d\d)")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_MODULE = re.compile(r"No module named '([^']+)'")
_KV_TOKENS = re.compile(r"#tokens: (\d+)")
_RAY_MEMORY = re.compile(
    r"Memory on the node \(IP: (?P<ip>[^,)]+)(?:, ID: (?P<id>\w+))?\).*? was (?P<used>[\d.]+) ?GB"
    r" / (?P<total>[\d.]+) ?GB \((?P<fraction>[\d.]+)\)"
)
_ATTN_NAME = re.compile(r'attn_implementation="?([^"`\s]+?)"?`? is not')
_ATTN_KEY = re.compile(r"`([^`]+)` is not a valid attention implementation")
_ATTN_ACCEPTED = re.compile(r'"(?:attn_implementation=)?([\w|]+)"')
_WATCHDOG = re.compile(
    r"(?:\[(?:PG (?:ID )?(?P<pg>\d+)[^\]]*?)?Rank (?P<rank>\d+)\]\s*)?"
    r"Watchdog caught collective operation timeout: WorkNCCL\((?:SeqNum=(?P<seq>\d+), )?OpType=(?P<op>\w+)"
    r"(?P<rest>[^)]*(?:\)[^)]*)?)\) ran for (?P<ran>\d+) milliseconds"
)
_TIMEOUT_MS = re.compile(r"Timeout\(ms\)=(\d+)")
_LAUNCHER_RANK = re.compile(r"^\[(?:rank|default)(\d+)\]:")
_STEP_INDEX = re.compile(r"(?:^|[\s\]\)])step (\d+): \{")
_ROLLOUT_INDEX = re.compile(r"(?:^|[\s\]\)])rollout (\d+): \{")
_NUMBER = re.compile(
    r"^(?:[\w.]+\()?\s*([-+]?(?:nan|inf|infinity|\d[\d.]*(?:e[-+]?\d+)?|\.\d+(?:e[-+]?\d+)?))\s*\)?$"
)


def clean_line(text: str) -> str:
    """A log line without ANSI colour codes (Ray colours its prefixes) and trailing whitespace."""
    return (_ANSI.sub("", text) if "\x1b" in text else text).rstrip()


def trim_line(text: str, focus: str | None = None, width: int = EVIDENCE_WIDTH) -> str:
    """`text` cut to about `width` characters; with `focus`, the part around it is kept.

    A long metric line becomes `<head> … <the metric> …`, so the evidence shows the value it is about.
    """
    if len(text) <= width:
        return text
    at = text.find(focus) if focus else -1
    if at < 0 or at + len(focus or "") + 40 <= width:
        return text[: width - 1] + "…"
    head = text[: min(at, width // 3)]
    room = width - len(head) - 4
    piece = text[at : at + room]
    return f"{head} … {piece}" + ("…" if at + room < len(text) else "")


def _value_after(text: str, key: str) -> str:
    """The printed value after `key` in a dict repr (up to the next comma or closing brace), or ""."""
    at = text.find(key)
    if at < 0:
        return ""
    start = at + len(key)
    ends = [i for i in (text.find(",", start), text.find("}", start)) if i >= 0]
    return text[start : min(ends) if ends else len(text)]


def metric_value(token: str) -> float | None:
    """A metric value as printed in a dict repr (`0.25`, `nan`, `-inf`, `np.float64(nan)`,
    `tensor(0.3)`), or None when it is not a number."""
    m = _NUMBER.match(token.strip().lower())
    if m is None:
        return None
    try:
        return float(m.group(1))
    except ValueError:
        return None


@dataclass(frozen=True)
class Evidence:
    """One log line backing a finding.

    Attributes:
        file: the log file as named on the command line.
        line: 1-based line number.
        text: the line, without colour codes, cut to `EVIDENCE_WIDTH` characters.
        note: what the line is to the finding ("first 503", "above the first 503"), or "".
    """

    file: str
    line: int
    text: str
    note: str = ""


@dataclass(frozen=True)
class Finding:
    """One diagnosed problem.

    Attributes:
        rule: rule id (see the module docstring).
        severity: "error" (the run failed or trains on wrong numbers), "warning" (degraded or
            suspicious), "info" (seen and judged harmless).
        title: one line naming the problem with its key figures.
        evidence: the lines it rests on, in file order unless a note says otherwise.
        cause: why this happens.
        fix: what to do.
        source: where the signature, cause and fix come from.
        details: the figures behind the title (counts, times, memory, ranks), JSON-ready.
    """

    rule: str
    severity: Severity
    title: str
    evidence: tuple[Evidence, ...]
    cause: str
    fix: str
    source: str
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def first_line(self) -> int:
        """Where the finding starts: its first evidence line that is not context ("above …"), 0 if none."""
        lines = [e.line for e in self.evidence if not e.note.startswith("above")]
        return min(lines or [e.line for e in self.evidence], default=0)

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict: rule, severity, title, evidence [{file, line, text, note}], cause, fix,
        source, details."""
        out = asdict(self)
        out["evidence"] = [asdict(e) for e in self.evidence]
        return out


@dataclass(frozen=True, kw_only=True)
class RuleOptions:
    """Limits of the rules that have one (defaults and their sources: the module constants).

    Raises:
        ValueError: a negative or non-finite `max_step0_gap`, a negative `min_kv_tokens`, or a
            watchdog interval/window that is not a whole number of seconds.
    """

    watchdog: WatchdogRule = field(default_factory=WatchdogRule)
    max_step0_gap: float = DEFAULT_MAX_STEP0_GAP
    min_kv_tokens: int = DEFAULT_MIN_KV_TOKENS

    def __post_init__(self) -> None:
        if not (math.isfinite(self.max_step0_gap) and self.max_step0_gap >= 0):
            raise ValueError(f"--max-step0-gap must be a finite number >= 0, got {self.max_step0_gap!r}")
        if self.min_kv_tokens < 0:
            raise ValueError(f"--min-kv-tokens must be >= 0, got {self.min_kv_tokens!r}")
        for name, value in (("interval", self.watchdog.interval), ("window", self.watchdog.window)):
            if value != int(value):
                raise ValueError(
                    f"--{name} must be a whole number of seconds for the log doctor, got {value!r}"
                )


@dataclass(frozen=True)
class _Line:
    line: int
    text: str


def _hhmmss(t: float) -> str:
    s = int(t) % 86400
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


def _seq(seq: int) -> str:
    return f"SeqNum={seq}" if seq >= 0 else "(no SeqNum in this torch's message)"


def _ranks(ranks: Iterable[int]) -> str:
    items = sorted(set(ranks))
    return ("rank " if len(items) == 1 else "ranks ") + ", ".join(str(r) for r in items)


# ---------------------------------------------------------------------- the dead-engine rule
class EngineErrors:
    """The "503 Service Unavailable" lines of one log, counted per time bucket (Miles 101 manual §1.2).

    Times are whole seconds read from each line's first date-time (`time_in`). The
    watchdog is replayed from the first error: checks at start + k·interval count the errors of
    (t − window, t]. Buckets are gcd(interval, window) seconds wide and end on those check times,
    so counting per bucket gives every check's count exactly. The scanner finds bucket boundaries by
    bisecting the 503 lines of a chunk, which assumes they are in time order (one client writes them);
    a line out of order by less than a bucket can be counted in its neighbour, and a 503 line without
    a time (in a log whose first 503 has one) counts in the bucket of the lines around it.
    """

    def __init__(self, rule: WatchdogRule) -> None:
        self.rule = rule
        self.width = math.gcd(int(rule.interval), int(rule.window))
        self.start: int | None = None
        self.timed: bool | None = None
        self.counts: dict[int, int] = {}
        self.untimed = 0
        self.first: _Line | None = None
        self.last: str | None = None
        self.above: list[_Line] = []
        self.last_time: int | None = None
        self._days: dict[bytes, int] = {}

    @property
    def total(self) -> int:
        """Error lines counted (timed and untimed)."""
        return sum(self.counts.values()) + self.untimed

    def begin(self, data: bytes | bytearray, start: int = 0, end: int | None = None) -> bool:
        """Start from the first error line (data[start:end], its text before the needle); returns
        whether it has a time. Without one the rule counts only (the time rule cannot be applied)."""
        t = self.time_in(data, start, end)
        self.timed = t is not None
        self.start = t
        return self.timed

    def time_in(self, data: bytes | bytearray, start: int = 0, end: int | None = None) -> int | None:
        """Whole seconds (Unix, the time read as UTC) of the first date-time in data[start:end], or None.

        Reads `YYYY-MM-DD HH:MM:SS` or `YYYY-MM-DDTHH:MM:SS` (Miles, SGLang, ISO 8601), as
        `dead_engine.parse_time` does; a zone suffix is ignored, as only differences within one log
        count. Days are cached: a probe costs one regex search.
        """
        m = _STAMP.search(data, start, len(data) if end is None else end)
        if m is None:
            return None
        day = m.group(1)
        base = self._days.get(day)
        if base is None:
            base = self._days[day] = calendar.timegm(
                (int(day[:4]), int(day[5:7]), int(day[8:10]), 0, 0, 0, 0, 0, 0)
            )
        return base + int(m.group(2)) * 3600 + int(m.group(3)) * 60 + int(m.group(4))

    def bucket(self, t: int) -> int:
        """Index j of the bucket (start + (j−1)·width, start + j·width] holding time `t` (seconds)."""
        assert self.start is not None
        return -((self.start - t) // self.width)

    def bucket_end(self, j: int) -> int:
        """The last second of bucket j (a check time when it is a multiple of the interval)."""
        assert self.start is not None
        return self.start + j * self.width

    def add(self, j: int | None, count: int) -> None:
        """Add `count` errors to bucket j, or to the untimed count when j is None."""
        if count <= 0:
            return
        if j is None:
            self.untimed += count
        else:
            self.counts[j] = self.counts.get(j, 0) + count

    def note_first(self, line: int, text: str, above: Sequence[tuple[int, str]]) -> None:
        """Record the first error line and the lines just above it (line number, text)."""
        self.first = _Line(line, clean_line(text))
        self.above = [_Line(n, clean_line(t)) for n, t in above if t.strip()]

    def note_last(self, text: str) -> None:
        """Record the latest error line seen so far (its text and time)."""
        self.last = clean_line(text)
        t = self.time_in(text.encode("utf-8", "replace"))
        if t is not None:
            self.last_time = t

    def times(self) -> list[float]:
        """One time per timed error, ascending: each at its bucket's end (exact for the checks)."""
        out: list[float] = []
        for j in sorted(self.counts):
            out += [float(self.bucket_end(j))] * self.counts[j]
        return out

    def check_counts(self, times: Sequence[float]) -> list[tuple[float, int]]:
        """(check time, errors in its window) for every check from the first error to the last + window."""
        assert self.start is not None
        rule = self.rule
        end = (times[-1] if times else self.start) + rule.window
        out = []
        t = self.start + rule.interval
        while t <= end:
            out.append((t, count_in_window(times, t, rule.window)))
            t += rule.interval
        return out


# ---------------------------------------------------------------------- the rules
class LogRules:
    """Everything the rules saw in one log, and the findings it adds up to.

    Args:
        file: the log's name as given on the command line (it goes into every evidence line).
        options: rule limits.
    """

    def __init__(self, file: str, options: RuleOptions | None = None) -> None:
        self.file = file
        self.options = options or RuleOptions()
        self.engine = EngineErrors(self.options.watchdog)
        self._lines: dict[str, list[_Line]] = {}
        self._mentions: dict[str, list[int]] = {}
        self._mention_text: dict[int, str] = {}
        self._modules: list[tuple[_Line, str]] = []
        self._first_rollout: int | None = None
        self._last_rollout: int | None = None
        self._rewards_nonfinite: list[tuple[_Line, float]] = []
        self._grad_nonfinite: dict[int, tuple[_Line, float]] = {}
        self._step0: tuple[_Line, dict[str, float]] | None = None
        self._kv: list[tuple[_Line, int]] = []
        self._cuda_oom: list[tuple[_Line, bool]] = []
        self._ray_memory: list[tuple[_Line, dict[str, str]]] = []
        self._ray_oom_lines: dict[int, _Line] = {}
        self._attn: list[tuple[_Line, str, list[str]]] = []
        self._watchdog: list[tuple[_Line, dict[str, Any]]] = []
        self._custom_rm_path: str | None = None
        self._context_wanted: list[int] = []
        self._asked: dict[str, int] = {}
        self._handlers = {s.key: getattr(self, f"_on_{s.key}") for s in SIGNATURES}

    # -------------------------------------------------------------- feeding
    def on_line(self, keys: Sequence[str], line_no: int, text: str) -> bool:
        """One line holding at least one needle: `keys` are their `Signature.key`s (1-based line_no).

        Returns:
            True when the rules want this line's surroundings (it is now in `wants_context()`).
        """
        line = _Line(line_no, clean_line(text))
        asked = len(self._context_wanted)
        handlers = self._handlers
        for key in keys if len(keys) == 1 else dict.fromkeys(keys):
            handlers[key](line)
        return len(self._context_wanted) > asked

    def _keep(self, key: str, line: _Line, *, ask: bool = True) -> None:
        lines = self._lines.setdefault(key, [])
        if any(seen.line == line.line for seen in lines[-MAX_EVIDENCE:]):
            return
        lines.append(line)
        if lines[-2:-1] and lines[-2].line > line.line:
            lines.sort(key=lambda ln: ln.line)
        if ask and key in CONTEXT_FOR:
            self._ask_context(key, line)

    def _ask_context(self, key: str, line: _Line) -> None:
        if self._asked.get(key, 0) < MAX_CONTEXT_LINES:
            self._asked[key] = self._asked.get(key, 0) + 1
            self._context_wanted.append(line.line)

    def wants_context(self) -> list[int]:
        """Line numbers of error lines whose surroundings (±NEARBY_LINES) the rules need (ascending)."""
        return sorted(set(self._context_wanted))

    def add_context(self, lines: Iterable[tuple[int, str]]) -> None:
        """Lines (number, text) around a line of `wants_context()`: mentions of wandb, torch inductor
        and weight updates among them are recorded with their line numbers."""
        for line_no, text in lines:
            self._ray_line(line_no, text)
            if "Message truncated" in text:
                self._keep("message_truncated", _Line(line_no, clean_line(text)), ask=False)
            for kind, words in MENTIONS.items():
                if any(w in text for w in words) and not (kind == "weight_update" and ": {" in text):
                    mentions = self._mentions.setdefault(kind, [])
                    self._mention_text.setdefault(line_no, clean_line(text))
                    if line_no not in mentions:
                        bisect.insort(mentions, line_no)

    def wants_launch_line(self) -> bool:
        """Whether the launch command line (its --custom-rm-path) would name a missing module."""
        return bool(self._modules) and self._custom_rm_path is None

    def on_launch_line(self, text: str) -> None:
        """A line holding `--custom-rm-path` (from the head of the log)."""
        if self._custom_rm_path is None:
            from grpolab.core.foreign_logs import parse_flags

            self._custom_rm_path = parse_flags(clean_line(text)).get("custom-rm-path")

    def _on_module_not_found(self, line: _Line) -> None:
        m = _MODULE.search(line.text)
        if m:
            self._modules.append((line, m.group(1)))

    def _on_fa3_sm(self, line: _Line) -> None:
        self._keep("fa3_sm", line)

    def _on_ray_oom(self, line: _Line) -> None:
        # Ray's memory kill: "Memory on the node (IP: …) was U GB / T GB (f)" in the worker's error, and a
        # hint naming `RAY_memory_usage_threshold` (also in the raylet's summary); the OutOfMemoryError
        # line is on the same line or just above
        self._ray_line(line.line, line.text)
        if "OutOfMemoryError" not in line.text:
            self._ask_context("ray_oom", line)

    def _ray_line(self, line_no: int, text: str) -> None:
        if "OutOfMemoryError" in text:
            self._ray_oom_lines.setdefault(line_no, _Line(line_no, clean_line(text)))
        if "Memory on the node" in text and not any(ln.line == line_no for ln, _ in self._ray_memory):
            m = _RAY_MEMORY.search(text)
            if m:
                self._ray_memory.append((_Line(line_no, clean_line(text)), m.groupdict()))
                self._ray_memory.sort(key=lambda item: item[0].line)

    def _on_cuda_oom(self, line: _Line) -> None:
        if not self._cuda_oom or self._cuda_oom[-1][0].line != line.line:
            self._cuda_oom.append((line, self._first_rollout is None))

    def _on_attn_implementation(self, line: _Line) -> None:
        text = line.text
        if "is not supported" not in text and "not a valid attention implementation" not in text:
            return
        m = _ATTN_NAME.search(text) or _ATTN_KEY.search(text)
        name = m.group(1) if m else ""
        tail = text.split("The only possible arguments are", 1)
        accepted = list(dict.fromkeys(_ATTN_ACCEPTED.findall(tail[1]))) if len(tail) == 2 else []
        self._attn.append((line, name, accepted))

    def _on_kv_cache(self, line: _Line) -> None:
        m = _KV_TOKENS.search(line.text)
        if m:
            self._kv.append((line, int(m.group(1))))

    def _on_illegal_memory_access(self, line: _Line) -> None:
        self._keep("illegal_memory_access", line)

    def _on_json_decode_error(self, line: _Line) -> None:
        if "JSONDecodeError:" in line.text:  # the exception, not a frame that raises it
            self._keep("json_decode_error", line)

    def _on_nccl_error(self, line: _Line) -> None:
        if "Message truncated" in line.text:
            self._keep("message_truncated", line)
        else:
            self._ask_context("nccl_error", line)  # torch prints NCCL's "Last error:" lines below it

    def _on_segfault(self, line: _Line) -> None:
        if "root causes" in line.text or "SIGSEGV or other" in line.text:
            return  # Ray's worker-died message lists SIGSEGV among possible causes
        self._keep("segfault", line)

    def _on_nccl_watchdog(self, line: _Line) -> None:
        m = _WATCHDOG.search(line.text)
        if m is None:
            return
        rank = m.group("rank")
        if rank is None:
            prefix = _LAUNCHER_RANK.match(line.text)
            rank = prefix.group(1) if prefix else None
        timeout = _TIMEOUT_MS.search(m.group("rest"))
        self._watchdog.append(
            (
                line,
                {
                    "rank": None if rank is None else int(rank),
                    "pg": None if m.group("pg") is None else int(m.group("pg")),
                    "seq": int(m.group("seq")) if m.group("seq") else -1,
                    "op": m.group("op"),
                    "timeout_ms": int(timeout.group(1)) if timeout else None,
                    "ran_ms": int(m.group("ran")),
                },
            )
        )
        if len(self._watchdog) == 1:
            self._ask_context("nccl_watchdog", line)

    def _on_none_plus_str(self, line: _Line) -> None:
        if "unsupported operand" in line.text:
            self._keep("none_plus_str", line)

    def _on_metric_line(self, line: _Line) -> None:
        text = line.text
        if "'rollout/raw_reward'" in text:
            self._rollout_line(line)
        if "'train/grad_norm'" in text:
            self._grad_norm(line)
        if self._step0 is None and "step 0: {" in text:
            from grpolab.core.foreign_logs import parse_line  # imported on use: `ast` costs start-up time

            record = parse_line(text, line.line)  # Miles prints each step line twice; the first counts
            if record is not None and record.kind == "step" and record.step == 0:
                self._step0 = (line, record.metrics)

    def _grad_norm(self, line: _Line) -> None:
        token = _value_after(line.text, "'train/grad_norm': ")
        if "n" not in token.lower():  # finite numbers have no n; nan and inf do (fast path)
            return
        step = _STEP_INDEX.search(line.text)
        number = metric_value(token)
        if step is None or number is None or math.isfinite(number):
            return
        self._grad_nonfinite.setdefault(int(step.group(1)), (line, number))

    def _rollout_line(self, line: _Line) -> None:
        if _ROLLOUT_INDEX.search(line.text) is None:
            return
        if self._first_rollout is None:
            self._first_rollout = line.line
        self._last_rollout = line.line
        token = _value_after(line.text, "'rollout/raw_reward': ")
        number = metric_value(token) if "n" in token.lower() else None
        if number is not None and not math.isfinite(number):
            self._rewards_nonfinite.append((line, number))

    # -------------------------------------------------------------- helpers
    def _ev(self, line: _Line, note: str = "", focus: str | None = None) -> Evidence:
        return Evidence(self.file, line.line, trim_line(line.text, focus), note)

    def _near(self, key: str, line_no: int) -> int | None:
        """The mention of `key` closest to `line_no` within NEARBY_LINES, or None."""
        mentions = self._mentions.get(key, [])
        i = bisect.bisect_left(mentions, line_no)
        best = None
        for j in (i - 1, i):
            if 0 <= j < len(mentions) and abs(mentions[j] - line_no) <= NEARBY_LINES:
                if best is None or abs(mentions[j] - line_no) < abs(best - line_no):
                    best = mentions[j]
        return best

    def _mention_evidence(self, key: str, line_no: int | None, note: str) -> list[Evidence]:
        """The mention line `line_no` (from the surroundings read for `key`) as evidence, if known."""
        if line_no is None or line_no not in self._mention_text:
            return []
        return [Evidence(self.file, line_no, trim_line(self._mention_text[line_no]), note)]

    def _rollout_after(self, line_no: int) -> bool:
        return self._last_rollout is not None and self._last_rollout > line_no

    # -------------------------------------------------------------- findings
    def finish(self) -> list[Finding]:
        """All findings, ordered by their first evidence line (the dead-engine finding names the
        findings above its first 503)."""
        findings: list[Finding] = []
        for make in (
            self._reward_module_missing,
            self._fa3_sm,
            self._ray_oom,
            self._attn_implementation,
            self._engine_oom_start,
            self._cuda_oom_later,
            self._illegal_memory_access,
            self._inductor_cache,
            self._nccl_weight_update,
            self._segfault,
            self._nccl_watchdog_timeout,
            self._step0_rules,
            self._grad_norm_nan,
            self._reward_nonfinite,
            self._wandb_group,
        ):
            findings += make()
        findings += self._dead_engine(findings)
        findings.sort(key=lambda f: (f.first_line, SEVERITIES.index(f.severity), f.rule))
        return findings

    def _reward_module_missing(self) -> list[Finding]:
        for line, module in self._modules:
            if self._rollout_after(line.line):
                continue
            same = [(ln, m) for ln, m in self._modules if m == module]
            rm_note = ""
            if self._custom_rm_path:
                rm_module = self._custom_rm_path.rpartition(".")[0]
                if rm_module == module or rm_module.startswith(module + "."):
                    rm_note = f" It is the module of --custom-rm-path {self._custom_rm_path}."
                else:
                    rm_note = f" (--custom-rm-path is {self._custom_rm_path}.)"
            before = (
                ""
                if self._first_rollout is None or self._first_rollout > line.line
                else " (rollouts ran before it)"
            )
            return [
                Finding(
                    rule="reward_module_missing",
                    severity="error",
                    title=f"ModuleNotFoundError for {module!r} and no rollout line after it{before}",
                    evidence=tuple(self._ev(ln) for ln, _ in same[:MAX_EVIDENCE]),
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
                    source=f"{MANUAL_TROUBLE} (The run hangs after a reward import error)",
                    details={"module": module, "lines": len(same), "custom_rm_path": self._custom_rm_path},
                )
            ]
        return []

    def _fa3_sm(self) -> list[Finding]:
        lines = self._lines.get("fa3_sm", [])
        if not lines:
            return []
        return [
            Finding(
                rule="fa3_sm",
                severity="error",
                title="the rollout engine stopped at start: FlashAttention 3 needs an SM 8.0-9.0 GPU",
                evidence=tuple(self._ev(ln) for ln in lines[:MAX_EVIDENCE]),
                cause=(
                    "The run asked for FlashAttention 3 (usually through true on-policy mode) on a GPU "
                    "outside its range (compute capability 8.0 to 9.0, Ampere/Hopper). The engine dies "
                    "during startup and the trainer keeps sending it requests (503 errors)."
                ),
                fix=(
                    "On a non-Hopper GPU drop true on-policy mode and use the default attention backend. "
                    "The error suggests `--attention-backend flashinfer`: that gives a normal run, not a "
                    "bit-exact one."
                ),
                source=f"{MANUAL_TROUBLE} (The engine stops at start with a FlashAttention 3 error)",
                details={"lines": len(lines)},
            )
        ]

    def _ray_oom(self) -> list[Finding]:
        if not self._ray_memory and not self._ray_oom_lines:
            return []
        evidence: dict[int, Evidence] = {
            ln.line: self._ev(ln, focus="OutOfMemoryError") for ln in self._ray_oom_lines.values()
        }
        for ln, _ in self._ray_memory:
            evidence.setdefault(ln.line, self._ev(ln, focus="Memory on the node"))
        figures = self._ray_memory[0][1] if self._ray_memory else None
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
        cuda = (
            f" A CUDA out-of-memory error is in the log too (line {self._cuda_oom[0][0].line})."
            if self._cuda_oom
            else (" There is no CUDA out-of-memory error: this is host (or unified) memory, not a GPU's.")
        )
        return [
            Finding(
                rule="ray_oom",
                severity="error",
                title=title,
                evidence=tuple(sorted(evidence.values(), key=lambda e: e.line))[:MAX_EVIDENCE],
                cause=(
                    "Ray reads one memory figure for the whole node and kills a worker when the node is "
                    f"above its threshold (0.95 by default): {quote}. On unified memory (GB10, GH200) the "
                    "GPU's allocations count as node memory." + cuda
                ),
                fix=(
                    "Use a smaller model or less work per step (rollout batch, answers per prompt, "
                    "response length, micro-batch), and leave Ray's threshold at its default. A lower "
                    "engine memory fraction did not help the manual's 4B run."
                ),
                source=f"{MANUAL_TROUBLE} (The job stops with a Ray OutOfMemoryError), Miles 101 manual §2.3",
                details={
                    "node_ip": figures["ip"] if figures else None,
                    "used_gb": used,
                    "total_gb": total,
                    "fraction": float(figures["fraction"]) if figures else None,
                    "lines": len(evidence),
                },
            )
        ]

    def _attn_implementation(self) -> list[Finding]:
        if not self._attn:
            return []
        line, name, accepted = self._attn[0]
        accepted_text = ", ".join(accepted) if accepted else "the names in the error"
        return [
            Finding(
                rule="attn_implementation",
                severity="error",
                title=f"transformers rejects the attention implementation {name or '(unnamed)'!r}",
                evidence=tuple(
                    self._ev(ln, focus="attn_implementation") for ln, _, _ in self._attn[:MAX_EVIDENCE]
                ),
                cause=(
                    f"The trainer asked transformers for attention {name!r}, which the installed version "
                    f"does not accept for this model. It accepts: {accepted_text}."
                ),
                fix=(
                    "Pick one from that list (sdpa, or eager for the plainest path) for the trainer's "
                    "attention setting; leave it at its default unless you need another kernel."
                ),
                source=f"{MANUAL_TROUBLE} (The trainer rejects the attention implementation), transformers "
                "modeling_utils get_correct_attn_implementation",
                details={"requested": name, "accepted": accepted},
            )
        ]

    def _engine_oom_start(self) -> list[Finding]:
        out = []
        early = [ln for ln, before_rollout in self._cuda_oom if before_rollout]
        if early:
            ray = (
                " Ray's OutOfMemoryError is in the log too: read that finding first."
                if self._ray_memory or self._ray_oom_lines
                else ""
            )
            out.append(
                Finding(
                    rule="engine_oom_start",
                    severity="error",
                    title="CUDA out of memory before the first rollout: the engine's memory fraction does not fit",
                    evidence=tuple(self._ev(ln, focus="out of memory") for ln in early[:MAX_EVIDENCE]),
                    cause=(
                        "--sglang-mem-fraction-static does not fit the GPU. With --colocate the trainer "
                        "already holds GPU memory when the engine starts; a fraction that is too high "
                        "leaves no room for activations and CUDA graphs." + ray
                    ),
                    fix=(
                        "Lower --sglang-mem-fraction-static by 0.05-0.1 at a time (Miles asks for 0.8 or "
                        "lower with --colocate; the manual's runs used 0.4)."
                    ),
                    source=f"{MANUAL_TROUBLE} (The engine runs out of memory at start)",
                    details={"lines": len(early)},
                )
            )
        small = [(ln, n) for ln, n in self._kv if n < self.options.min_kv_tokens]
        if small:
            tokens = min(n for _, n in small)
            out.append(
                Finding(
                    rule="engine_oom_start",
                    severity="warning",
                    title=f"tiny KV cache: {tokens:,} tokens (grpolab's floor {self.options.min_kv_tokens:,})",
                    evidence=tuple(self._ev(ln, focus="KV Cache") for ln, _ in small[:MAX_EVIDENCE]),
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
                    source=f"{MANUAL_TROUBLE} (The engine runs out of memory at start)",
                    details={"kv_tokens": tokens, "min_kv_tokens": self.options.min_kv_tokens},
                )
            )
        return out

    def _cuda_oom_later(self) -> list[Finding]:
        late = [ln for ln, before_rollout in self._cuda_oom if not before_rollout]
        if not late:
            return []
        return [
            Finding(
                rule="cuda_oom",
                severity="error",
                title="CUDA out of memory after the run started",
                evidence=tuple(self._ev(ln, focus="out of memory") for ln in late[:MAX_EVIDENCE]),
                cause=(
                    "A GPU ran out of memory after the first rollout: in training (micro-batch or sequence "
                    "too long) or in the engine after the trainer's offload/reload cycle under --colocate."
                ),
                fix=(
                    "Read the lines above for the process (trainer or engine). Trainer: lower the "
                    "micro-batch or max tokens per GPU. Engine under --colocate: lower "
                    "--sglang-mem-fraction-static to 0.7 or 0.6."
                ),
                source="Miles debugging: Does step 2 OOM under colocate?",
                details={"lines": len(late)},
            )
        ]

    def _illegal_memory_access(self) -> list[Finding]:
        lines = self._lines.get("illegal_memory_access", [])
        if not lines:
            return []
        return [
            Finding(
                rule="illegal_memory_access",
                severity="error",
                title="CUDA illegal memory access",
                evidence=tuple(self._ev(ln, focus="illegal memory access") for ln in lines[:MAX_EVIDENCE]),
                cause="In SGLang this is usually an out-of-memory condition in disguise.",
                fix=(
                    "Lower --sglang-mem-fraction-static. To find the kernel, rerun with "
                    "CUDA_LAUNCH_BLOCKING=1 (slow) and try without CUDA graphs or speculative decoding."
                ),
                source=KERNEL_PITFALLS,
                details={"lines": len(lines)},
            )
        ]

    def _inductor_cache(self) -> list[Finding]:
        lines = [ln for ln in self._lines.get("json_decode_error", []) if self._near("inductor", ln.line)]
        if not lines:
            return []
        mention = self._near("inductor", lines[0].line)
        return [
            Finding(
                rule="inductor_cache",
                severity="error",
                title="JSONDecodeError from torch inductor: corrupt compile cache",
                evidence=tuple(
                    sorted(
                        [self._ev(ln, focus="JSONDecodeError") for ln in lines[:MAX_EVIDENCE]]
                        + self._mention_evidence("inductor", mention, "inductor frame"),
                        key=lambda e: e.line,
                    )
                ),
                cause=(
                    f"torch inductor failed to read a cache entry (inductor frame at line {mention}); the "
                    "compile cache is corrupt, e.g. after a run was killed while writing it."
                ),
                fix="Set TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 (or delete the inductor cache directory) and rerun.",
                source=KERNEL_PITFALLS,
                details={"lines": len(lines), "inductor_line": mention},
            )
        ]

    def _crash_lines(self) -> list[tuple[_Line, str, int | None]]:
        out = []
        for key in ("message_truncated", "segfault"):
            for ln in self._lines.get(key, []):
                out.append((ln, key, self._near("weight_update", ln.line)))
        out.sort(key=lambda item: item[0].line)
        return out

    def _nccl_weight_update(self) -> list[Finding]:
        crashes = [
            (ln, key, near) for ln, key, near in self._crash_lines() if key == "message_truncated" or near
        ]
        if not crashes:
            return []
        truncated = any(key == "message_truncated" for _, key, _ in crashes)
        segfault = any(key == "segfault" for _, key, _ in crashes)
        near = next((n for _, _, n in crashes if n), None)
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
        evidence = [self._ev(ln) for ln, _, _ in crashes[:MAX_EVIDENCE]]
        evidence += self._mention_evidence("weight_update", near, "weight update")
        return [
            Finding(
                rule="nccl_weight_update",
                severity="error",
                title=f"the weight update failed: {what}",
                evidence=tuple(sorted(evidence, key=lambda e: e.line)),
                cause=" ".join(causes) + (f" The weight-update call is at line {near}." if near else ""),
                fix=" ".join(fixes),
                source=f"{MANUAL_TROUBLE} (The weight update fails on many GPUs)",
                details={
                    "lines": len(crashes),
                    "weight_update_line": near,
                    "segfault": segfault,
                    "truncated": truncated,
                },
            )
        ]

    def _segfault(self) -> list[Finding]:
        lines = [ln for ln, key, near in self._crash_lines() if key == "segfault" and not near]
        if not lines:
            return []
        return [
            Finding(
                rule="segfault",
                severity="error",
                title="a process crashed with a segmentation fault",
                evidence=tuple(self._ev(ln) for ln in lines[:MAX_EVIDENCE]),
                cause=(
                    f"A native crash outside a weight update (no weight-update call within {NEARBY_LINES} "
                    "lines): a kernel, a communication library or an extension module."
                ),
                fix=(
                    "Read the stack printed after the fault (Python's faulthandler lists the frames); rerun "
                    "with CUDA_LAUNCH_BLOCKING=1 and NCCL_DEBUG=INFO to find the call."
                ),
                source=KERNEL_PITFALLS,
                details={"lines": len(lines)},
            )
        ]

    def _nccl_watchdog_timeout(self) -> list[Finding]:
        if not self._watchdog:
            return []
        # torch repeats each timeout ("… thread terminated with exception: [Rank r] Watchdog caught …"),
        # sometimes without the process group the first line names: one report per (rank, SeqNum, op)
        reports: dict[tuple[int | None, int, str], tuple[_Line, dict[str, Any]]] = {}
        for line, info in self._watchdog:
            seen = reports.get((info["rank"], info["seq"], info["op"]))
            if seen is None or (seen[1]["pg"] is None and info["pg"] is not None):
                reports[(info["rank"], info["seq"], info["op"])] = (line if seen is None else seen[0], info)
        # one entry per (group, rank): its first timed-out work (the oldest SeqNum it reports)
        first: dict[tuple[int | None, int | None], tuple[_Line, dict[str, Any]]] = {}
        for line, info in reports.values():
            key = (info["pg"], info["rank"])
            if key not in first or info["seq"] < first[key][1]["seq"]:
                first[key] = (line, info)
        groups: dict[int | None, dict[int | None, dict[str, Any]]] = {}
        for (pg, rank), (_, info) in first.items():
            groups.setdefault(pg, {})[rank] = info
        verdicts, kinds = [], []
        for pg in sorted(groups, key=lambda g: -1 if g is None else g):
            ranks = groups[pg]
            where = "" if pg is None else f" (process group {pg})"
            top = max(info["seq"] for info in ranks.values())
            behind = {r: i for r, i in ranks.items() if i["seq"] < top}
            front = {r: i for r, i in ranks.items() if i["seq"] == top}
            ops: dict[str, list[int | None]] = {}
            for r, i in front.items():
                ops.setdefault(i["op"], []).append(r)
            named = [r for r in ranks if r is not None]
            if len(ops) > 1:
                kinds.append("mismatched")
                verdicts.append(
                    f"mismatched collectives{where}: at {_seq(top)} "
                    + "; ".join(
                        f"{_ranks(r for r in rs if r is not None)} run {op}" for op, rs in sorted(ops.items())
                    )
                    + ". The ranks took different code paths (a collective called on some ranks only)."
                )
            if behind:
                kinds.append("behind")
                lows = sorted({i["seq"] for i in behind.values()})
                verdicts.append(
                    f"{_ranks(r for r in behind if r is not None)} behind{where}: timed out at SeqNum "
                    + ", ".join(str(s) for s in lows)
                    + f" while {_ranks(r for r in front if r is not None)} reached {_seq(top)}. The ranks "
                    "behind have not issued the collective the others wait in: they are stuck or slow "
                    "before it (read their last lines)."
                )
            if len(ops) == 1 and not behind:
                kinds.append("same")
                op = next(iter(ops))
                missing = []
                if named:
                    missing = [r for r in range(max(named) + 1) if r not in ranks]
                verdicts.append(
                    f"the same collective timed out on {_ranks(named) if named else 'every rank that reports'}"
                    f"{where}: {_seq(top)} {op}. A network problem, a straggler or a timeout too short for "
                    "the work, not a code-path mismatch."
                    + (
                        f" {_ranks(missing)} did not report a timeout: look there for the straggler or an exit."
                        if missing
                        else ""
                    )
                )
        weight_line = self._near("weight_update", self._watchdog[0][0].line)
        timeouts = sorted({i["timeout_ms"] for _, i in self._watchdog if i["timeout_ms"]})
        kind = "mismatched" if "mismatched" in kinds else ("behind" if "behind" in kinds else "same")
        title = {
            "same": "NCCL watchdog timeout: the same collective timed out on every reporting rank",
            "mismatched": "NCCL watchdog timeout: mismatched collectives across ranks",
            "behind": "NCCL watchdog timeout: some ranks are behind the others",
        }[kind]
        if weight_line:
            title += " (during the weight sync)"
        fix = (
            "Rerun with NCCL_DEBUG=INFO and TORCH_DISTRIBUTED_DEBUG=DETAIL (logs every collective with its "
            "ranks and shapes), a shorter NCCL timeout so the hang fails fast, and CUDA_LAUNCH_BLOCKING=1 "
            "when a kernel error may be behind it; while it hangs, `grpolab diagnose hang` shows each rank's stack."
        )
        if weight_line:
            fix = (
                "NCCL hang during weight sync: raise the NCCL timeout and rerun with NCCL_DEBUG=INFO. " + fix
            )
        evidence_lines = sorted(
            {id(line): line for line, _ in first.values()}.values(), key=lambda ln: ln.line
        )
        return [
            Finding(
                rule="nccl_watchdog_timeout",
                severity="error",
                title=title,
                evidence=tuple(self._ev(ln, focus="Watchdog caught") for ln in evidence_lines[:MAX_EVIDENCE]),
                cause=" ".join(v[0].upper() + v[1:] for v in verdicts)
                + (f" A weight-update call is at line {weight_line}." if weight_line else ""),
                fix=fix,
                source=AREAL_HANGS + (f"; {KERNEL_PITFALLS}" if weight_line else ""),
                details={
                    "kind": kind,
                    "ranks": [
                        {
                            "rank": r,
                            "process_group": pg,
                            "seq": i["seq"],
                            "op": i["op"],
                            "ran_ms": i["ran_ms"],
                        }
                        for (pg, r), (_, i) in sorted(
                            first.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1]))
                        )
                    ],
                    "timeout_ms": timeouts,
                    "weight_update_line": weight_line,
                },
            )
        ]

    def _step0_rules(self) -> list[Finding]:
        if self._step0 is None:
            return []
        line, metrics = self._step0
        out = []
        gap = metrics.get("train/train_rollout_logprob_abs_diff")
        limit = self.options.max_step0_gap
        if gap is not None and (not math.isfinite(gap) or gap > limit):
            out.append(
                Finding(
                    rule="step0_gap",
                    severity="error",
                    title=f"step-0 log-prob gap {gap:.4g} is far above range (limit {limit:g})",
                    evidence=(self._ev(line, focus="'train/train_rollout_logprob_abs_diff'"),),
                    cause=(
                        "At step 0 the engine and the trainer should score the same answers with the same "
                        "weights; a large train/train_rollout_logprob_abs_diff means they do not start from "
                        "the same weights, or read them in different formats. The manual's healthy "
                        "Qwen3-0.6B runs had 0.0148-0.0157."
                    ),
                    fix=(
                        "Stop the run before it trains on wrong numbers. Check the checkpoint paths of both "
                        "sides (--hf-checkpoint and the trainer's load path) and compare with your healthy "
                        "runs (`grpolab gate`)."
                    ),
                    source=f"{MANUAL_TROUBLE} (The gap at step 0 is far above your range)",
                    details={"gap": gap, "limit": limit},
                )
            )
        kl = metrics.get("train/ppo_kl")
        if kl is not None and kl != 0.0:
            out.append(
                Finding(
                    rule="kl_nonzero_step0",
                    severity="warning",
                    title=f"train/ppo_kl is {kl:.3g} at step 0 (expected exactly 0)",
                    evidence=(self._ev(line, focus="'train/ppo_kl'"),),
                    cause=(
                        "Step 0 is computed before the first optimizer update, when the policy is the old "
                        "policy, so its train/ppo_kl should be exactly 0. A non-zero value means two forwards of "
                        "the same weights on the same tokens disagree: non-deterministic fused attention (or "
                        "dropout left on)."
                    ),
                    fix="Force a deterministic attention kernel (Miles: --attention-backend flash) and turn dropout off.",
                    source=KERNEL_PITFALLS,
                    details={"ppo_kl": kl},
                )
            )
        return out

    def _grad_norm_nan(self) -> list[Finding]:
        if not self._grad_nonfinite:
            return []
        first_step = min(self._grad_nonfinite)
        line, value = self._grad_nonfinite[first_step]
        bad_rewards = [ln for ln, _ in self._rewards_nonfinite if ln.line <= line.line]
        if bad_rewards:
            return []  # the reward finding explains it
        steps = sorted(self._grad_nonfinite)
        seen_rewards = self._first_rollout is not None
        return [
            Finding(
                rule="grad_norm_nan",
                severity="error",
                title=f"train/grad_norm is {value} at step {first_step}"
                + (f" ({len(steps)} steps)" if len(steps) > 1 else "")
                + (" while the rewards are finite" if seen_rewards else ""),
                evidence=tuple(
                    self._ev(self._grad_nonfinite[s][0], focus="'train/grad_norm'")
                    for s in steps[:MAX_EVIDENCE]
                ),
                cause=(
                    "The gradient overflowed although "
                    + (
                        "every rollout/raw_reward before it is finite"
                        if seen_rewards
                        else "no non-finite reward is in the log"
                    )
                    + ": usually a bad chat template (garbage tokens with extreme log-probs) or activation "
                    "overflow in low precision (FP8)."
                ),
                fix=(
                    "Check the chat template on a few prompts, run the step in bf16/fp32 instead of FP8, and "
                    "replay the step (`grpolab replay`) to find the first non-finite tensor."
                ),
                source=KERNEL_PITFALLS,
                details={"steps": steps, "first_step": first_step},
            )
        ]

    def _reward_nonfinite(self) -> list[Finding]:
        if not self._rewards_nonfinite:
            return []
        line, value = self._rewards_nonfinite[0]
        return [
            Finding(
                rule="reward_nonfinite",
                severity="error",
                title=f"rollout/raw_reward is {value}",
                evidence=tuple(
                    self._ev(ln, focus="'rollout/raw_reward'")
                    for ln, _ in self._rewards_nonfinite[:MAX_EVIDENCE]
                ),
                cause="The reward function returned NaN or Inf for some answers; every later number inherits it.",
                fix="Make the reward function return finite floats (catch parse failures and score them 0).",
                source="grpolab",
                details={"lines": len(self._rewards_nonfinite)},
            )
        ]

    def _wandb_group(self) -> list[Finding]:
        lines = [ln for ln in self._lines.get("none_plus_str", []) if self._near("wandb", ln.line)]
        if not lines:
            return []
        return [
            Finding(
                rule="wandb_group",
                severity="error",
                title="the run stopped at start in the wandb setup: TypeError NoneType + str",
                evidence=tuple(
                    sorted(
                        [self._ev(ln) for ln in lines[:MAX_EVIDENCE]]
                        + self._mention_evidence("wandb", self._near("wandb", lines[0].line), "wandb frame"),
                        key=lambda e: e.line,
                    )
                ),
                cause=(
                    "The wandb setup joins the run group with a string; without --wandb-group the group is "
                    "None and the run stops at start."
                ),
                fix="Pass --wandb-group (any name) with --use-wandb.",
                source="Miles 101 manual (Send the signals to a dashboard: Keep --wandb-group)",
                details={"lines": len(lines), "wandb_line": self._near("wandb", lines[0].line)},
            )
        ]

    def _dead_engine(self, others: Sequence[Finding]) -> list[Finding]:
        engine = self.engine
        if engine.total == 0 or engine.first is None:
            return []
        rule = engine.rule
        evidence = [self._ev(engine.first, "first 503")]
        evidence += [self._ev(ln, "above the first 503") for ln in engine.above]
        evidence.sort(key=lambda e: e.line)
        above = [f for f in others if f.severity == "error" and 0 < f.first_line < engine.first.line]
        above_text = (
            " Above the first 503: "
            + "; ".join(f"{f.rule} at line {f.first_line} ({f.title})" for f in above)
            + "."
            if above
            else " Read the engine lines above the first 503 for the reason it died."
        )
        kv_before = [ln for ln, _ in self._kv if ln.line < engine.first.line]
        start_note = (
            " The engine had started (KV cache allocated) before the first 503."
            if kv_before
            else " No `KV Cache is allocated` line precedes the first 503: an SGLang engine never finished starting."
        )
        if not engine.timed:
            severity: Severity = "warning" if engine.total > rule.limit else "info"
            return [
                Finding(
                    rule="dead_engine",
                    severity=severity,
                    title=f"{engine.total:,} × 503 Service Unavailable without timestamps: the watchdog's time rule "
                    "could not be applied (count only)",
                    evidence=tuple(evidence),
                    cause=(
                        "A dead rollout engine and a busy healthy one both write 503 errors; only their times "
                        "tell them apart, and these lines carry none." + above_text
                    ),
                    fix=(
                        "Look at the run live: `grpolab watchdog LOG` stamps lines as they are written. Stop "
                        "the run if the errors never stop and the GPU is idle."
                    ),
                    source=MANUAL_WATCHDOG,
                    details={"count": engine.total, "timed": False},
                )
            ]
        times = engine.times()
        assert engine.start is not None
        first_t = engine.start
        last_t = engine.last_time if engine.last_time is not None else (times[-1] if times else first_t)
        checks = engine.check_counts(times)
        run = most = 0
        for _, n in checks:
            run = run + 1 if n > rule.limit else 0
            most = max(most, run)
        peak = max((n for _, n in checks), default=0)
        replay = replay_rule(
            times, rule, start=float(first_t), end=float(checks[-1][0]) if checks else float(first_t)
        )
        details: dict[str, Any] = {
            "count": engine.total,
            "untimed": engine.untimed,
            "first_time": _hhmmss(first_t),
            "last_time": _hhmmss(last_t),
            "span_s": last_t - first_t,
            "peak_per_window": peak,
            "most_checks_in_a_row": most,
            "rule": {
                "limit": rule.limit,
                "checks": rule.checks,
                "interval_s": rule.interval,
                "window_s": rule.window,
            },
            "stopped_after_s": None if replay.stopped_at is None else replay.stopped_at - first_t,
            "last_503": trim_line(engine.last) if engine.last else None,
            "timed": True,
        }
        untimed = f" ({engine.untimed:,} of them without a time)" if engine.untimed else ""
        if replay.stopped_at is None:
            return [
                Finding(
                    rule="engine_503_bursts",
                    severity="info",
                    title=f"{engine.total:,} × 503 Service Unavailable: the dead-engine rule is not met (at most "
                    f"{most} check{'' if most == 1 else 's'} in a row above {rule.limit}; it needs {rule.checks})",
                    evidence=(self._ev(engine.first, "first 503"),),
                    cause=(
                        f"The 503s ran from {_hhmmss(first_t)} to {_hhmmss(last_t)}{untimed}, at most {peak:,} in "
                        f"{rule.window:g} s. The rule (every {rule.interval:g} s count the last {rule.window:g} s; "
                        f"stop after {rule.checks} counts above {rule.limit} in a row) stops only errors that never "
                        "stop: a busy engine answers 503 in bursts of up to about a minute and the client retries."
                    ),
                    fix="Nothing to do for the 503s by themselves; read the other findings if the run failed.",
                    source=MANUAL_WATCHDOG,
                    details=details,
                )
            ]
        stop_after = replay.stopped_at - first_t
        return [
            Finding(
                rule="dead_engine",
                severity="error",
                title=f"the rollout engine died: {engine.total:,} × 503 Service Unavailable over "
                f"{_minutes(last_t - first_t)}; the watchdog rule stops the run {_minutes(stop_after)} after the first",
                evidence=tuple(evidence),
                cause=(
                    f"The 503 errors never stopped: more than {rule.limit} in every {rule.window:g} s window for "
                    f"{most} checks in a row (peak {peak:,}), from {_hhmmss(first_t)} to {_hhmmss(last_t)}"
                    f"{untimed}. The router answers 503 when no engine can take a request; the trainer keeps "
                    "sending requests to a dead engine and the run never fails by itself."
                    + start_note
                    + above_text
                ),
                fix=(
                    "Stop the run, fix the cause above the first 503, and start every unattended run with "
                    "`grpolab watchdog` (it stops such a run about five minutes after the errors start)."
                ),
                source=f"{MANUAL_WATCHDOG}; {MANUAL_TROUBLE} (The GPU is idle and the log keeps growing)",
                details=details,
            )
        ]


def count_by_severity(findings: Iterable[Finding]) -> dict[str, int]:
    """{"error": n, "warning": n, "info": n} over `findings`."""
    out = dict.fromkeys(SEVERITIES, 0)
    for f in findings:
        out[f.severity] += 1
    return out


__all__ = [
    "DEAD_ENGINE_NEEDLE",
    "DEFAULT_MAX_STEP0_GAP",
    "DEFAULT_MIN_KV_TOKENS",
    "EngineErrors",
    "Evidence",
    "Finding",
    "LogRules",
    "RuleOptions",
    "SIGNATURES",
    "Signature",
    "clean_line",
    "count_by_severity",
    "metric_value",
    "trim_line",
]
