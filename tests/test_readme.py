"""Every `grpolab` command in the README's bash blocks runs as written on a fresh clone (issue 15
item 22), checked the fastest honest way, without running them:

- it parses: `grpolab`'s own parser accepts the subcommand and every flag (a misspelt or removed
  flag, a bad value or a missing argument fails here);
- a `grpolab train` command also builds its run config (`config_from_args`: the checks a run makes
  of its flags before anything loads);
- the files a command reads ship with the repository (`--hf-checkpoint`, `--prompt-data`: a path
  outside the repository, such as `../shared/data/...`, does not exist on a fresh clone), or are
  written by a README command before it (a recording template read by `--load-debug-rollout-data` /
  `--ci-inject-rollout-data-path` / `grpolab replay inspect` must be one that an earlier command
  saves with `--save-debug-rollout-data`).

The other positional paths (`runs/my-run`, `runs/candidate`, `miles_seed3.log`, ...) name the
reader's own runs and logs, and are not checked. Text in `[...]` is optional syntax and `...` an
elision: both are dropped before parsing. What the commands do when run is what the rest of the
test suite checks (the train example's shape with the tiny model: tests/core; record and replay:
tests/replay).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from grpolab.cli import build_parser
from grpolab.core.config.flags import config_from_args

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
_OPTIONAL = re.compile(r"\s\[[^\]'\"]*\]")  # ` [--json]`, ` [--host 127.0.0.1]`: optional syntax
_READS = ("--hf-checkpoint", "--prompt-data")
_TEMPLATE_READERS = ("--load-debug-rollout-data", "--ci-inject-rollout-data-path")


def readme_commands(text: str) -> list[list[str]]:
    """The argv (after `grpolab`) of every `grpolab` command in the text's ```bash blocks, in order:
    continuation lines joined, comments, `[...]` optional parts and `...` dropped, `&&` chains split.

    Raises:
        ValueError: a block ends inside a quoted argument.
    """
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        pending = ""  # a quoted argument may span lines (a JSON body): read on until it closes
        for line in block.replace("\\\n", " ").splitlines():
            pending += line + "\n"
            try:
                tokens = shlex.split(_OPTIONAL.sub("", pending), comments=True)
            except ValueError:
                continue
            pending = ""
            tokens = [t for t in tokens if t != "..."]
            command: list[str] = []
            for token in [*tokens, "&&"]:
                if token != "&&":
                    command.append(token)
                    continue
                if command[:1] == ["grpolab"]:
                    found.append(command[1:])
                command = []
        if pending:
            raise ValueError(f"README bash block ends inside a quoted argument: {pending!r}")
    return found


def _flag(argv: list[str], name: str) -> str | None:
    """The last value of `--name VALUE` in argv (a repeated flag keeps its last value)."""
    values = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == name]
    return values[-1] if values else None


def _made_by(template: str, path: str) -> bool:
    """Whether `path` is one file of the recording template (`{rollout_id}` a number)."""
    return re.fullmatch(re.escape(template).replace(re.escape("{rollout_id}"), r"\d+"), path) is not None


COMMANDS = readme_commands(README.read_text(encoding="utf-8"))


def test_the_readme_has_the_commands_it_documents() -> None:
    """The extraction itself: one command per subcommand family at least, and the chained quick start."""
    firsts = {argv[0] for argv in COMMANDS}
    assert {"train", "ui", "replay", "gate", "diagnose", "watchdog"} <= firsts
    assert ["train"] in COMMANDS  # the quick start's bare `grpolab train` (after the venv and pip steps)
    assert len(COMMANDS) >= 15


@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(a)[:60] for a in COMMANDS])
def test_each_readme_command_parses(argv: list[str]) -> None:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # argparse's error already went to stderr; say which command
        pytest.fail(f"`grpolab {' '.join(argv)}` does not parse (exit {e.code})")
    if args.command == "train":
        config_from_args(args)  # ValueError names the flag


def test_files_the_commands_read_ship_with_the_repo_or_come_first() -> None:
    """`--hf-checkpoint` / `--prompt-data` lie inside the repository and exist; a recording a command
    reads is one an earlier command records."""
    saved: list[str] = []
    problems = []
    for argv in COMMANDS:
        shown = "grpolab " + " ".join(argv)
        for flag in _READS:
            value = _flag(argv, flag)
            path = (REPO / value).resolve() if value else None
            if path is not None and (REPO not in path.parents or not path.exists()):
                problems.append(f"{shown}: {flag} {value} is not in a fresh clone")
        for flag in _TEMPLATE_READERS:
            value = _flag(argv, flag)
            if value is not None and value not in saved:
                problems.append(f"{shown}: {flag} {value} is recorded by no README command before it")
        if argv[:2] == ["replay", "inspect"] and not any(_made_by(t, argv[2]) for t in saved):
            problems.append(f"{shown}: {argv[2]} is recorded by no README command before it")
        template = _flag(argv, "--save-debug-rollout-data")
        if template is not None:
            saved.append(template)
    assert problems == []


def test_the_checks_catch_what_a_fresh_clone_lacks() -> None:
    """The extraction and the file rule on the README's old mistakes: a prompt file outside the
    repository, a replay of a recording nobody made."""
    old = (
        "```bash\n# a comment\ngrpolab train \\\n  --prompt-data ../shared/data/gsm8k/train.jsonl [--json]\n"
        "grpolab train --load-debug-rollout-data 'runs/rec/r_{rollout_id}.grz' --num-rollout 3 ...\n```\n"
    )
    argvs = readme_commands(old)
    assert argvs == [
        ["train", "--prompt-data", "../shared/data/gsm8k/train.jsonl"],
        ["train", "--load-debug-rollout-data", "runs/rec/r_{rollout_id}.grz", "--num-rollout", "3"],
    ]
    path = (REPO / argvs[0][2]).resolve()
    assert REPO not in path.parents
    assert _made_by("runs/rec/r_{rollout_id}.grz", "runs/rec/r_0.grz")
    assert not _made_by("runs/rec/r_{rollout_id}.grz", "runs/other/r_0.grz")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--no-such-flag"])
