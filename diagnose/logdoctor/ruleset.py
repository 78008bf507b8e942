"""Every registered log-doctor rule at work on one log: lines in by needle, context, findings out.

Pure (no I/O). The scanner (logdoctor/scan.py) drives a `LogRules`: `on_line` for each line holding one of
`needles` (and, per time bucket, the `counted` needle's counter), then `add_context` with the lines
around `wants_context()`, `on_launch_line` for each of `launch_flags()`, and last `finish()`. The
scanner knows no rule: needles, dispatch, context and launch flags all come from the registry.

Besides the rules, a `LogRules` tracks the run's progress (its first and last `rollout N` metric line)
and the context mentions, which several rules read, and holds what the log's run directory recorded
(`run`: every rank's error and the final status; logdoctor/run_outcome.py) when a run directory was given.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, TypeVar

from grpolab.diagnose.logdoctor.model import (
    MAX_CONTEXT_LINES,
    METRIC_NEEDLE,
    NEARBY_LINES,
    RULES,
    SEVERITIES,
    Evidence,
    Finding,
    Line,
    Mention,
    Rule,
    RuleOptions,
    clean_line,
    is_rollout_line,
    trim_line,
)
from grpolab.diagnose.logdoctor.rules import RULE_FAMILIES
from grpolab.diagnose.logdoctor.rules.dead_engine import EngineErrors

if TYPE_CHECKING:
    from grpolab.diagnose.logdoctor.run_outcome import RunOutcome


R = TypeVar("R", bound=Rule)


class LogRules:
    """The registered rules on one log, and what they share.

    Args:
        file: the log's name as given on the command line (it goes into every evidence line).
        options: rule limits (defaults: `RuleOptions()`).
        run: what the log's run directory recorded (rank errors, final status), when the log is a run
            directory's console.log; None for a plain log file.

    Raises:
        ValueError: more than one registered rule has a `counted_needle` (the scanner counts one).
    """

    def __init__(self, file: str, options: RuleOptions | None = None, run: RunOutcome | None = None) -> None:
        self.file = file
        self.options = options or RuleOptions()
        self.run = run
        """The run directory's record of how the run ended, or None for a plain log file."""
        self.first_rollout: int | None = None
        """Line number of the first `rollout N: {…'rollout/raw_reward'…}` line, or None."""
        self.last_rollout: int | None = None
        """Line number of the last such line, or None."""
        family = {module.__name__: i for i, module in enumerate(RULE_FAMILIES)}
        kinds = sorted(
            RULES.values(), key=lambda kind: (kind.judged_last, family.get(kind.__module__, len(family)))
        )
        self._rules: list[Rule] = [kind(self) for kind in kinds]
        self._by_id = {rule.id: rule for rule in self._rules}
        observers: dict[bytes, list[Callable[[Line], None]]] = {METRIC_NEEDLE: [self._on_progress]}
        for rule in self._rules:
            for needle in rule.needles:
                observers.setdefault(needle, []).append(rule.observe)
        self._observers = {needle: tuple(calls) for needle, calls in observers.items()}
        self.needles: tuple[bytes, ...] = tuple(self._observers)
        """Every needle whose lines go to `on_line` (distinct)."""
        self.counted: tuple[bytes, EngineErrors] | None = None
        """The needle counted per time bucket and its counter (`Rule.counted_needle`), or None."""
        for rule in self._rules:
            if rule.counted_needle is not None:
                if self.counted is not None:
                    raise ValueError(f"rule {rule.id!r} counts a second needle; the scanner counts one")
                self.counted = (rule.counted_needle, rule.errors)
        self._context_readers = [r for r in self._rules if type(r).on_context is not Rule.on_context]
        self._mention_kinds: tuple[Mention, ...] = tuple(
            dict.fromkeys(m for r in self._rules for m in r.mentions)
        )
        self._mentions: dict[Mention, list[int]] = {}
        self._mention_text: dict[int, str] = {}
        self._context_wanted: list[int] = []
        self._asked: dict[str, int] = {}

    # -------------------------------------------------------------- feeding
    def on_line(self, needles: Sequence[bytes], line_no: int, text: str) -> bool:
        """One line holding at least one needle: `needles` are those it holds (1-based line_no).

        Returns:
            True when the rules want this line's surroundings (it is now in `wants_context()`).
        """
        line = Line(line_no, clean_line(text))
        asked = len(self._context_wanted)
        observers = self._observers
        if len(needles) == 1:
            for observe in observers[needles[0]]:
                observe(line)
        else:
            for observe in dict.fromkeys(call for needle in needles for call in observers[needle]):
                observe(line)
        return len(self._context_wanted) > asked

    def _on_progress(self, line: Line) -> None:
        if "'rollout/raw_reward'" in line.text and is_rollout_line(line.text):
            if self.first_rollout is None:
                self.first_rollout = line.line
            self.last_rollout = line.line

    def ask_context(self, key: str, line: Line) -> None:
        """Ask for the lines around `line` (at most MAX_CONTEXT_LINES per `key`, the first ones)."""
        if self._asked.get(key, 0) < MAX_CONTEXT_LINES:
            self._asked[key] = self._asked.get(key, 0) + 1
            self._context_wanted.append(line.line)

    def wants_context(self) -> list[int]:
        """Line numbers of the lines whose surroundings (±NEARBY_LINES) the rules asked for (ascending)."""
        return sorted(set(self._context_wanted))

    def add_context(self, lines: Iterable[tuple[int, str]]) -> None:
        """Lines (number, text) around a line of `wants_context()`: every rule reads them
        (`Rule.on_context`) and the rules' mentions among them are recorded with their line numbers."""
        for line_no, text in lines:
            for rule in self._context_readers:
                rule.on_context(line_no, text)
            for mention in self._mention_kinds:
                if mention.found_in(text):
                    seen = self._mentions.setdefault(mention, [])
                    self._mention_text.setdefault(line_no, clean_line(text))
                    if line_no not in seen:
                        bisect.insort(seen, line_no)

    def launch_flags(self) -> list[str]:
        """Flags (without `--`) whose launch command line the rules want (see `Rule.launch_flag`)."""
        return [r.launch_flag for r in self._rules if r.launch_flag and r.wants_launch_line()]

    def on_launch_line(self, flag: str, text: str) -> None:
        """The line holding `--<flag>` (from the head of the log)."""
        for rule in self._rules:
            if rule.launch_flag == flag:
                rule.on_launch_line(text)

    # -------------------------------------------------------------- for the rules
    def rule(self, kind: type[R]) -> R:
        """This log's instance of the rule class `kind` (for a rule that reads what another saw).

        Raises:
            ValueError: `kind` is not a registered rule (the message lists the registered ids).
        """
        found = self._by_id.get(getattr(kind, "id", ""))
        if not isinstance(found, kind):
            raise ValueError(
                f"{kind.__qualname__} is not a registered rule; registered: {', '.join(RULES.names())}"
            )
        return found

    def rollout_after(self, line_no: int) -> bool:
        """Whether a rollout metric line follows line `line_no`."""
        return self.last_rollout is not None and self.last_rollout > line_no

    def near(self, mention: Mention, line_no: int) -> int | None:
        """The line of `mention` closest to `line_no` within NEARBY_LINES, or None (context lines only)."""
        lines = self._mentions.get(mention, [])
        i = bisect.bisect_left(lines, line_no)
        best = None
        for j in (i - 1, i):
            if 0 <= j < len(lines) and abs(lines[j] - line_no) <= NEARBY_LINES:
                if best is None or abs(lines[j] - line_no) < abs(best - line_no):
                    best = lines[j]
        return best

    def mention_evidence(self, line_no: int | None, note: str) -> list[Evidence]:
        """The context line `line_no` (a mention from `near`) as evidence, if it was read."""
        if line_no is None or line_no not in self._mention_text:
            return []
        return [Evidence(self.file, line_no, trim_line(self._mention_text[line_no]), note)]

    # -------------------------------------------------------------- findings
    def finish(self) -> list[Finding]:
        """All findings: first those resting on the run directory's records (the rank errors, root cause
        first, in the order their rule gives), then the log's, ordered by their first evidence line (then
        severity, then rule id)."""
        found: list[Finding] = []
        for rule in self._rules:
            found += rule.findings(tuple(found))

        def order(f: Finding) -> tuple[int, int, int, str]:
            if f.evidence and f.evidence[0].file != self.file:
                return (0, 0, 0, "")  # the sort is stable: their rule's order is kept
            return (1, f.first_line, SEVERITIES.index(f.severity), f.rule)

        found.sort(key=order)
        return found


__all__ = ["RULE_FAMILIES", "LogRules"]
