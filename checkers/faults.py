"""Fault injection for CI: `--ci-ft-test-actions '[{"at_rollout": 2, "action": "...", "rank": 1}]'`.

What it does (after Miles `miles/utils/test_utils/ft_test_actions.py`, notes section 3.7): each action
fires once, on one rank, at one point of one rollout, and produces a real failure that the rest of the
tooling has to see — a dead rank that leaves its peers blocked in a collective, an exception on one
rank only, a genuine hang, or an engine that stops under a live trainer. These are the hangs that
`grpolab diagnose hang` classifies.

| action                   | point (`maybe_fire`) | effect                                                        |
| ------------------------ | -------------------- | ------------------------------------------------------------- |
| `crash_before_allreduce` | `before_allreduce`   | `os._exit(1)` (Miles' action, same exit)                      |
| `raise_in_train`         | `train`              | raise `InjectedFault` (a `RuntimeError`) on that rank only    |
| `sleep_forever_at_end`   | `end_of_rollout`     | `time.sleep(3600)` in a loop forever, in `sleep_forever_injected` |
| `stop_engine_at_end`     | `end_of_rollout`     | call the `on_stop_engine` callback (the engine shutdown)      |
| `skip_weight_sync`       | `weight_sync`        | returned to the loop, which skips the sync after the rollout  |
|                          |                      | but counts its version as acknowledged (a lost update)        |
| `kill_engine_in_train`   | `train`              | SIGKILL engine 0 of the launched fleet (`on_kill_engine`)     |
| `kill_engine_in_rollout` | `rollout`            | SIGKILL engine 0 once the rollout's requests reached it       |

The two kill actions test `--use-fault-tolerance` (Miles' rollout-side injector crashes one engine once):
killed while the trainer trains, the engine is found dead by the next call (the weight sync, its memory
released); killed in a rollout,
every request it held is unanswered and is sent again once it is back.

`skip_weight_sync` makes a stale engine: it keeps generating with the weights of the sync before, while
the trainer believes the engine holds the new version, so the weight-version check
(checkers/weight_version.py) must fail the next rollout, naming the sample and both versions.

Each action announces itself first with `[grpolab fault] injecting <action> on rank R at rollout N`
on stderr (every rank) and, where the `grpolab` logger has handlers (a run), in console.log too (at
warning level, so ranks other than 0, whose logger keeps warnings only, do not drop it), so that
`grpolab diagnose log` tells an injected failure from a real one.

Validation is strict like Miles' pydantic model: unknown fields, wrong types (a bool is not an
int), a missing field or malformed JSON raise `ValueError` naming `--ci-ft-test-actions`, the item
index and the field. Differences from Miles: no FT cells (Miles' `stop_cell_at_end` /
`start_cell_at_end`, `cell_index`, `attempt` are rejected with that reason), and four actions of ours.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from grpolab.core.config.validation import register_value_check

FLAG = "--ci-ft-test-actions"
NOTICE_PREFIX = "[grpolab fault] injecting "
"""How the line announcing a fault starts (the log doctor's `fault_injected` rule looks for it)."""
FAULT_POINTS = ("before_allreduce", "train", "end_of_rollout", "weight_sync", "rollout")
ACTION_POINTS = {
    "crash_before_allreduce": "before_allreduce",
    "raise_in_train": "train",
    "sleep_forever_at_end": "end_of_rollout",
    "stop_engine_at_end": "end_of_rollout",
    "skip_weight_sync": "weight_sync",
    "kill_engine_in_train": "train",
    "kill_engine_in_rollout": "rollout",
}
_KILLS = {"kill_engine_in_train", "kill_engine_in_rollout"}
# Actions after which the rank does not carry on normally; at one point they fire after the others.
_TERMINAL = {"crash_before_allreduce", "raise_in_train", "sleep_forever_at_end"}
_MILES_ONLY = {
    "stop_cell_at_end": "action",
    "start_cell_at_end": "action",
    "cell_index": "field",
    "attempt": "field",
}
_FIELDS = ("at_rollout", "action", "rank")


class InjectedFault(RuntimeError):
    """The exception `raise_in_train` raises (on the chosen rank only)."""


@dataclass(frozen=True, kw_only=True)
class FaultAction:
    """One entry of `--ci-ft-test-actions`."""

    at_rollout: int
    """Rollout id during which the action fires (>= 0)."""
    action: str
    """One of `ACTION_POINTS`."""
    rank: int = 0
    """Global rank that fires it (>= 0)."""

    @property
    def point(self) -> str:
        """The `maybe_fire` point this action fires at."""
        return ACTION_POINTS[self.action]


def _fail(where: str, message: str) -> NoReturn:
    raise ValueError(f"{FLAG}: {where}{message}")


class _JSONObject(dict):
    """A JSON object that remembers keys given twice (json.loads would silently keep the last)."""

    duplicates: list[str]


def _keep_duplicates(pairs: list[tuple[str, Any]]) -> _JSONObject:
    obj = _JSONObject(pairs)
    keys = [k for k, _ in pairs]
    obj.duplicates = sorted({k for k in keys if keys.count(k) > 1})
    return obj


def _json_kind(value: Any) -> str:
    """JSON's name for a parsed value's type (bool checked before int: True is an int in Python)."""
    kinds = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (list, "array"))
    return next(
        (name for t, name in kinds if isinstance(value, t)), "object" if value is not None else "null"
    )


def _non_negative_int(item: dict[str, Any], field: str, where: str) -> int:
    value = item[field]
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(
            where,
            f"field {field!r} must be an integer >= 0, got {json.dumps(value)} (a JSON {_json_kind(value)})",
        )
    if value < 0:
        _fail(where, f"field {field!r} must be an integer >= 0, got {value}")
    return value


def parse_fault_actions(text: str) -> list[FaultAction]:
    """Parse and strictly validate the `--ci-ft-test-actions` JSON.

    Args:
        text: a JSON array of objects `{"at_rollout": int >= 0, "action": str, "rank": int >= 0 = 0}`.

    Raises:
        ValueError: naming `--ci-ft-test-actions`, the item index and the field: malformed JSON, not an
            array, an item that is not an object, a missing/unknown/duplicated field, a wrong type, a
            negative number, an unknown action (lists the valid ones), or the same action twice.
    """
    try:
        data = json.loads(text, object_pairs_hook=_keep_duplicates)
    except json.JSONDecodeError as e:
        _fail("", f"malformed JSON at line {e.lineno} column {e.colno}: {e.msg} (got {text[:80]!r})")
    if not isinstance(data, list):
        _fail("", f"expected a JSON array of action objects, got a JSON {_json_kind(data)}")
    actions: list[FaultAction] = []
    for index, item in enumerate(data):
        where = f"item {index}: "
        if not isinstance(item, dict):
            _fail(where, f"expected an object, got {json.dumps(item)}")
        if item.duplicates:
            _fail(where, f"field {item.duplicates[0]!r} is given twice")
        for field in item:
            if field not in _FIELDS:
                why = " (a Miles FT-cell field; grpolab has no FT cells)" if field in _MILES_ONLY else ""
                _fail(where, f"unknown field {field!r}{why}; allowed: {', '.join(_FIELDS)}")
        for field in ("at_rollout", "action"):
            if field not in item:
                _fail(where, f"missing required field {field!r}")
        at_rollout = _non_negative_int(item, "at_rollout", where)
        rank = _non_negative_int(item, "rank", where) if "rank" in item else 0
        action = item["action"]
        if not isinstance(action, str):
            _fail(where, f"field 'action' must be a string, got {json.dumps(action)}")
        if action not in ACTION_POINTS:
            why = " (a Miles FT-cell action; grpolab has no FT cells)" if action in _MILES_ONLY else ""
            _fail(where, f"field 'action': unknown action {action!r}{why}; valid: {', '.join(ACTION_POINTS)}")
        parsed = FaultAction(at_rollout=at_rollout, action=action, rank=rank)
        if parsed in actions:
            _fail(
                where,
                f"field 'action': duplicates item {actions.index(parsed)} ({action} at rollout {at_rollout})",
            )
        actions.append(parsed)
    return actions


def check_reachable(actions: Sequence[FaultAction], num_rollout: int) -> None:
    """Refuse an action that can never fire: rollout ids run 0 .. `num_rollout` - 1 (a resume or
    --debug-exit-after-rollout only narrows that), so `at_rollout` >= `num_rollout` is never reached.

    Raises:
        ValueError: naming `--ci-ft-test-actions`, the item, its at_rollout and --num-rollout.
    """
    for index, action in enumerate(actions):
        if action.at_rollout >= num_rollout:
            _fail(
                f"item {index}: ",
                f"field 'at_rollout' is {action.at_rollout} but --num-rollout {num_rollout} runs rollouts "
                f"0..{num_rollout - 1}, so {action.action} would never fire",
            )


def check_actions_can_fire(
    actions: Sequence[FaultAction], launches_engines: bool, *, world_size: int = 1, trains: bool = True
) -> None:
    """Before the run (no torch): refuse an action that would never fire: a kill_engine_* action on a run
    that launches no engines (`--rollout-num-engines`), an action of a rank past `world_size`, and one
    fired in training (`train`, `before_allreduce`) on a run that does not train (`--debug-rollout-only`).

    Raises:
        ValueError: naming `--ci-ft-test-actions`, the item and the action.
    """
    for index, action in enumerate(actions):
        if action.action in _KILLS and not launches_engines:
            _refuse_kill(index, action)
        _check_rank(index, action, world_size)
        if not trains and ACTION_POINTS[action.action] in ("train", "before_allreduce"):
            _fail(
                f"item {index}: ",
                f"{action.action} fires in training, and --debug-rollout-only trains nothing",
            )


def _check_rank(index: int, action: FaultAction, world_size: int) -> None:
    if action.rank >= world_size:
        _fail(f"item {index}: ", f"field 'rank': rank {action.rank} does not exist (world size {world_size})")


def _refuse_kill(index: int, action: FaultAction) -> NoReturn:
    _fail(f"item {index}: ", f"{action.action} needs engines the run launches (--rollout-num-engines N)")


def sleep_forever_injected() -> NoReturn:
    """Block forever (`time.sleep(3600)` in a loop): the `sleep_forever_at_end` hang.

    It exists to produce a real hang for `grpolab diagnose hang`: py-spy shows this frame at the
    top of the main thread's stack. `time.sleep` releases the GIL, so other threads (heartbeats)
    keep running, as in a rank stuck waiting on a peer. Only a signal ends it.
    """
    while True:
        time.sleep(3600)


def _announce(line: str) -> None:
    """`line` on stderr, and into console.log through the `grpolab` logger when it has handlers.

    The logger record skips stdout (`CONSOLE_LOG_ONLY`): the terminal already has the line on stderr.
    Without handlers (the injector outside a run) nothing is logged, so logging's last-resort handler
    does not print the line on stderr a second time.
    """
    print(line, file=sys.stderr, flush=True)
    logger = logging.getLogger("grpolab")
    if logger.hasHandlers():
        from grpolab.rundir.writer import CONSOLE_LOG_ONLY

        logger.warning(line, extra=CONSOLE_LOG_ONLY)


class FaultInjector:
    """Fires this rank's `--ci-ft-test-actions` at the points the training loop passes.

    Call `maybe_fire(point, rollout_id)` at every point in `FAULT_POINTS`; each action fires at most
    once. At one point, non-terminal actions (`stop_engine_at_end`) fire before terminal ones.
    """

    def __init__(
        self,
        actions: Sequence[FaultAction],
        rank: int,
        *,
        on_stop_engine: Callable[[], None] | None = None,
        on_kill_engine: Callable[[bool], None] | None = None,
        on_fire: Callable[[FaultAction, int], None] | None = None,
        world_size: int | None = None,
    ) -> None:
        """
        Args:
            actions: all parsed actions (every rank's); only those with `rank == rank` fire here.
            rank: this process's global rank.
            on_stop_engine: shuts the engine down; required when this rank has `stop_engine_at_end`.
            on_kill_engine: SIGKILLs engine 0 of the fleet, at once (False) or once the rollout's requests
                reached it (True); required when this rank has a kill action.
            on_fire: called with (action, rollout_id) just before an action takes effect (even before
                `os._exit`), e.g. to append a `fault` event to events.jsonl.
            world_size: when given, an action whose rank is >= world_size is an error (it would
                never fire and the CI test would silently pass).

        Raises:
            ValueError: naming `--ci-ft-test-actions` and the item, for the two cases above.
        """
        self.rank = rank
        self._on_stop_engine, self._on_kill_engine = on_stop_engine, on_kill_engine
        self._on_fire = on_fire
        self._mine: list[tuple[int, FaultAction]] = []
        self._fired: set[int] = set()
        for index, action in enumerate(actions):
            if world_size is not None:
                _check_rank(index, action, world_size)
            if action.rank != rank:
                continue
            if action.action == "stop_engine_at_end" and on_stop_engine is None:
                _fail(f"item {index}: ", "stop_engine_at_end needs a running engine, and this run has none")
            if action.action in _KILLS and on_kill_engine is None:
                _refuse_kill(index, action)
            self._mine.append((index, action))

    def pending(self) -> list[FaultAction]:
        """This rank's actions that have not fired (at the end of a run: they never will)."""
        return [a for i, a in self._mine if i not in self._fired]

    def maybe_fire(self, point: str, rollout_id: int) -> list[FaultAction]:
        """Fire this rank's actions due at `point` of rollout `rollout_id`; return those that returned.

        At `weight_sync` the caller acts on what is returned: `skip_weight_sync` means "do not send
        this rollout's weights, count the version as acknowledged".

        Raises:
            ValueError: `point` is not one of `FAULT_POINTS`.
            InjectedFault: a `raise_in_train` action fired.
        """
        if point not in FAULT_POINTS:
            raise ValueError(f"unknown fault point {point!r}; valid: {', '.join(FAULT_POINTS)}")
        due = [
            (i, a)
            for i, a in self._mine
            if i not in self._fired and a.point == point and a.at_rollout == rollout_id
        ]
        due.sort(key=lambda ia: (ia[1].action in _TERMINAL, ia[0]))
        fired: list[FaultAction] = []
        for index, action in due:
            self._fired.add(index)
            self._fire(index, action, rollout_id)
            fired.append(action)
        return fired

    def _fire(self, index: int, action: FaultAction, rollout_id: int) -> None:
        what = f"{action.action} on rank {self.rank} at rollout {rollout_id} ({FLAG} item {index})"
        _announce(NOTICE_PREFIX + what)
        if action.action == "crash_before_allreduce":
            try:
                if self._on_fire is not None:
                    self._on_fire(action, rollout_id)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(1)
        if self._on_fire is not None:
            self._on_fire(action, rollout_id)
        if action.action == "raise_in_train":
            raise InjectedFault(f"injected fault: {what}")
        if action.action == "sleep_forever_at_end":
            sleep_forever_injected()
        if action.action == "stop_engine_at_end":
            assert self._on_stop_engine is not None
            self._on_stop_engine()
        if action.action in _KILLS:
            assert self._on_kill_engine is not None
            self._on_kill_engine(action.action == "kill_engine_in_rollout")


register_value_check(FLAG, lambda text, flag: parse_fault_actions(text))  # config validation's hook
