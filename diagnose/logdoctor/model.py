"""The log doctor's model: findings, evidence, rule options, the rule registry and the helpers rules share.

Each rule names one failure from the Miles 101 manual's troubleshooting list (section 7.1), its
dead-engine watchdog (section 1.2), the Miles debugging page's "Common kernel pitfalls" table or the
AReaL debugging guide's hang patterns, and says what the log shows, why, and what to do. A rule is a
`Rule` subclass registered by id with `@register`; its id, severity, needles, cause, fix and source
are the class attributes at its top. The rules live by family: logdoctor/rules/engine.py (a run or engine that
cannot start or runs out of memory), logdoctor/rules/announcements.py (grpolab's own lines: an injected CI fault, the
engine client's timeout), logdoctor/rules/run_failure.py (a failed `grpolab train`: its error line and every
rank's recorded error), logdoctor/rules/kernels.py (kernel and weight-update crashes),
logdoctor/rules/nccl_timeout.py (NCCL watchdog timeouts), logdoctor/rules/metrics.py (the metrics a run prints, and its
wandb setup) and logdoctor/rules/dead_engine.py (the 503 watchdog).

How a rule sees a log (logdoctor/ruleset.py runs every registered rule on one log; logdoctor/scan.py reads the file):
- `Rule.needles` are fixed byte strings. The scanner finds every line holding one and hands it to
  the rule's `observe`. Lines without a needle are never decoded.
- A rule that needs nearby lines (a wandb frame around a TypeError, a weight-update call around a
  segfault) asks for them with `LogRules.ask_context`: after the pass the scanner reads
  ±`NEARBY_LINES` around each asked line; every rule gets them in `on_context`, and the words of the
  rules' `mentions` found there are recorded for `LogRules.near`.
- `Rule.launch_flag` names a flag of the launch command line that the rule reads (from the head of
  the log), when `wants_launch_line()` says so.
- `Rule.counted_needle` is for lines too many for per-line work (the dead-engine rule's 503 lines:
  200,533 in the manual's 147 MB log): the scanner counts them per time bucket into the rule's
  `errors` and hands over only the first line (with the lines above it) and the text of the last.
- `Rule.findings` turns what the rule saw into `Finding`s; the report orders them by first evidence line.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from grpolab.core.registry import Registry
from grpolab.diagnose.common.dead_engine import WatchdogRule

if TYPE_CHECKING:
    from grpolab.diagnose.logdoctor.rules.dead_engine import EngineErrors
    from grpolab.diagnose.logdoctor.ruleset import LogRules

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
MAX_CONTEXT_LINES = 16
"""Error lines per kind whose surroundings are read (the first ones; a crash repeats its lines)."""
EVIDENCE_WIDTH = 240
"""Characters kept of an evidence line (a metric line is cut around the metric it is about)."""
MAX_EVIDENCE = 6
"""Evidence lines shown per finding (the count of all matching lines is in `details`)."""

METRIC_NEEDLE = b": {'"
"""What every metric line holds: `<kind> <N>: {'<name>': <value>, …}` (Miles, grpolab)."""

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_LAUNCHER_RANK = re.compile(r"^\[(?:rank|default)(\d+)\]:")
_ROLLOUT_INDEX = re.compile(r"(?:^|[\s\]\)])rollout (\d+): \{")


@dataclass(frozen=True)
class Line:
    """A log line as the rules keep it: 1-based number and text (`clean_line`)."""

    line: int
    text: str


@dataclass(frozen=True)
class Mention:
    """Words that tie an error line to its context, when one of them is within NEARBY_LINES of it.

    Attributes:
        name: what the words stand for (in messages).
        words: any one of them in a context line is a mention.
        skip_metric_lines: a metric line (`: {`) is never a mention (a weight-update word in a
            metric name is not a weight-update call).
    """

    name: str
    words: tuple[str, ...]
    skip_metric_lines: bool = False

    def found_in(self, text: str) -> bool:
        """Whether `text` mentions it."""
        return any(w in text for w in self.words) and not (self.skip_metric_lines and ": {" in text)


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


def launcher_rank(text: str) -> int | None:
    """The rank of a torchrun line prefix (`[rank1]:` with --tee, `[default1]:` with --log-dir), or None."""
    m = _LAUNCHER_RANK.match(text)
    return int(m[1]) if m else None


def is_rollout_line(text: str) -> bool:
    """Whether a line holding `'rollout/raw_reward'` is a `rollout N: {…}` metric line (Miles, grpolab)."""
    return _ROLLOUT_INDEX.search(text) is not None


def keep_line(lines: list[Line], line: Line) -> bool:
    """Add `line` to `lines` (kept in line order) unless it is among the last MAX_EVIDENCE of them
    (a line with two needles, or read again as context); returns whether it was added."""
    if any(seen.line == line.line for seen in lines[-MAX_EVIDENCE:]):
        return False
    lines.append(line)
    if lines[-2:-1] and lines[-2].line > line.line:
        lines.sort(key=lambda ln: ln.line)
    return True


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
        rule: rule id (`Rule.id`).
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


class Rule:
    """One known failure: what the log shows (`needles`), why (`cause`), what to do (`fix`), and where
    that comes from (`source`).

    A subclass sets the class attributes, implements `findings` and, when it has needles, `observe`;
    it keeps what it saw in its instance. `LogRules` makes one instance per log and passes itself as
    `log` (the file name, the options, context, the run's progress, the other rules, and `log.run`:
    what the run directory recorded, for a run directory's console.log).
    """

    id: ClassVar[str]
    """Rule id in findings (snake_case), unique in the registry."""
    severity: ClassVar[Severity]
    """Severity of its findings (a rule that reports a milder case too says so in its docstring)."""
    source: ClassVar[str]
    """Where the signature, cause and fix come from."""
    cause: ClassVar[str] = ""
    """Why it happens, when that text holds no figure (else `findings` writes it)."""
    fix: ClassVar[str] = ""
    """What to do, when that text holds no figure (else `findings` writes it)."""
    needles: ClassVar[tuple[bytes, ...]] = ()
    """Fixed strings, plain ASCII without a newline (the scanner relies on both), whose lines go to
    `observe`; a rule without needles reads what other rules saw (`LogRules.rule`)."""
    mentions: ClassVar[tuple[Mention, ...]] = ()
    """Words of context lines the rule looks up with `LogRules.near`."""
    launch_flag: ClassVar[str | None] = None
    """A flag of the launch command line (without `--`) the rule reads in `on_launch_line`."""
    counted_needle: ClassVar[bytes | None] = None
    """A needle too frequent for per-line work: its lines are counted per time bucket into `errors`."""
    judged_last: ClassVar[bool] = False
    """Judged after every other rule, so that `findings` gets all of theirs."""
    errors: EngineErrors
    """The counter of `counted_needle`'s lines (set by a rule that has one)."""

    def __init__(self, log: LogRules) -> None:
        self.log = log

    def observe(self, line: Line) -> None:
        """A line holding one of `needles` (once per line, however many it holds)."""
        raise NotImplementedError(f"rule {self.id!r} has needles but no observe()")

    def on_context(self, line_no: int, text: str) -> None:
        """A line read around a line some rule asked context for (`text` as in the file)."""

    def wants_launch_line(self) -> bool:
        """Whether the rule needs the launch command line holding `--<launch_flag>`."""
        return False

    def on_launch_line(self, text: str) -> None:
        """The line holding `--<launch_flag>` (from the head of the log)."""

    def findings(self, earlier: Sequence[Finding]) -> list[Finding]:
        """What the rule saw, as findings (none when it saw nothing wrong).

        Args:
            earlier: findings of the rules judged before this one (in the order of
                `ruleset.RULE_FAMILIES`, then of definition; `judged_last` rules after all others).
        """
        raise NotImplementedError

    def ev(self, line: Line, note: str = "", focus: str | None = None) -> Evidence:
        """`line` as evidence (cut around `focus`, see `trim_line`)."""
        return Evidence(self.log.file, line.line, trim_line(line.text, focus), note)

    def finding(
        self,
        title: str,
        evidence: Iterable[Evidence],
        details: dict[str, Any],
        *,
        severity: Severity | None = None,
        cause: str | None = None,
        fix: str | None = None,
        source: str | None = None,
    ) -> Finding:
        """A finding of this rule; severity, cause, fix and source default to the class attributes."""
        return Finding(
            rule=self.id,
            severity=severity or self.severity,
            title=title,
            evidence=tuple(evidence),
            cause=self.cause if cause is None else cause,
            fix=self.fix if fix is None else fix,
            source=self.source if source is None else source,
            details=details,
        )


class SignatureRule(Rule):
    """A rule whose every needle line is evidence of one fixed finding (a signature with no figures).

    Subclasses set `title` and, to cut long lines around it, `evidence_focus`.
    """

    title: ClassVar[str]
    """The finding's title."""
    evidence_focus: ClassVar[str | None] = None
    """Text each evidence line is cut around (`trim_line`), or None for the line's start."""

    def __init__(self, log: LogRules) -> None:
        super().__init__(log)
        self.lines: list[Line] = []

    def observe(self, line: Line) -> None:
        keep_line(self.lines, line)

    def findings(self, earlier: Sequence[Finding]) -> list[Finding]:
        if not self.lines:
            return []
        evidence = (self.ev(ln, focus=self.evidence_focus) for ln in self.lines[:MAX_EVIDENCE])
        return [self.finding(self.title, evidence, {"lines": len(self.lines)})]


RULES: Registry[type[Rule]] = Registry("log doctor rule")
"""Every rule class by id, in registration order (logdoctor/ruleset.py imports the rule families)."""


def register(rule: type[Rule]) -> type[Rule]:
    """Class decorator: register `rule` under its id.

    Raises:
        ValueError: the id is taken or empty, the severity is unknown, a needle is not plain ASCII
            without a newline, or the rule has needles but no `observe`.
    """
    if not getattr(rule, "id", ""):
        raise ValueError(f"{rule.__qualname__} has no rule id")
    if getattr(rule, "severity", None) not in SEVERITIES:
        raise ValueError(f"rule {rule.id!r}: severity must be one of {SEVERITIES}")
    for needle in (*rule.needles, *([rule.counted_needle] if rule.counted_needle else [])):
        if not needle or not needle.isascii() or b"\n" in needle:
            raise ValueError(f"rule {rule.id!r}: needle {needle!r} must be plain ASCII without a newline")
    if rule.needles and rule.observe is Rule.observe:
        raise ValueError(f"rule {rule.id!r} has needles but no observe()")
    return RULES.register(rule.id)(rule)


def count_by_severity(findings: Iterable[Finding]) -> dict[str, int]:
    """{"error": n, "warning": n, "info": n} over `findings`."""
    out = dict.fromkeys(SEVERITIES, 0)
    for f in findings:
        out[f.severity] += 1
    return out


__all__ = [
    "DEFAULT_MAX_STEP0_GAP",
    "DEFAULT_MIN_KV_TOKENS",
    "METRIC_NEEDLE",
    "RULES",
    "Evidence",
    "Finding",
    "Line",
    "Mention",
    "Rule",
    "RuleOptions",
    "SignatureRule",
    "clean_line",
    "count_by_severity",
    "is_rollout_line",
    "keep_line",
    "launcher_rank",
    "register",
    "trim_line",
]
