"""Every `grpolab` command in the README's and the docs' bash blocks runs as written on a fresh
clone (issue 15 item 22; issue 22: the README is a door to `docs/`), checked the fastest honest way,
without running them:

- the pages are README.md, then each `docs/*.md` page in the order the README links them (a docs
  page may use what a README command made, as its reader has run those); every docs page is linked;
- it parses: `grpolab`'s own parser accepts the subcommand and every flag (a misspelt or removed
  flag, a bad value or a missing argument fails here);
- it is pasted as is: no `[--optional]` syntax and no `...` elision inside a command;
- a `grpolab train` command also builds its run config (`config_from_args`: the checks a run makes
  of its flags before anything loads);
- the files a command reads ship with the repository (`--hf-checkpoint`, `--prompt-data`: a path
  outside the repository, such as `../shared/data/...`, does not exist on a fresh clone), or are
  written by a command before it (a recording template read by `--load-debug-rollout-data` /
  `--ci-inject-rollout-data-path` / `grpolab replay inspect` must be one that an earlier command
  saves with `--save-debug-rollout-data`).

- the paths a command reads as arguments (`grpolab gate LOG --baseline LOG`, `diagnose log FILE`,
  `replay convert IN.pt`, `ui ROOT`: `_READ_ARGS` names them for every subcommand, and a
  subcommand the table lacks fails the test) ship with the repository or are made before it: a run
  directory of an earlier `grpolab train` (`--run-dir`, or `runs/` for its default) or a file in it,
  a recording, or an earlier `replay convert`'s output.

Commands that need the reader's own machines (a running SGLang fleet at an IP, a git history to
bisect) are in ```sh blocks: they are parsed and validated like the others, and not checked for
files. What the commands do when run is what the rest of the test suite checks.
"""

from __future__ import annotations

import argparse
import functools
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from grpolab.cli import build_parser
from grpolab.core.config.flags import config_from_args

REPO = Path(__file__).resolve().parents[1]


@functools.cache
def _shipped() -> frozenset[Path]:
    """What a fresh clone holds: the files git tracks and their folders (absolute paths). Only what
    git tracks counts, never what the user's own runs left in the checkout (`runs/` after the
    quick start); without git (a source tarball) every file on disk counts."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return frozenset(p for p in REPO.rglob("*") if ".venv" not in p.parts)
    files = [REPO / f for f in listed.split("\0") if f]
    return frozenset([*files, *(d for f in files for d in f.parents if REPO in d.parents)])


def _ships(path: Path) -> bool:
    """Whether `path` (absolute, resolved) is in a fresh clone of the repository."""
    return REPO in path.parents and path in _shipped()


README = REPO / "README.md"
_DOC_LINK = re.compile(r"\]\((docs/[\w.-]+\.md)\)")


def pages() -> list[Path]:
    """README.md, then the docs pages in the order the README first links them."""
    linked = dict.fromkeys(_DOC_LINK.findall(README.read_text(encoding="utf-8")))
    return [README, *(REPO / link for link in linked)]


def page_commands(lang: str = "bash") -> list[list[str]]:
    """The commands of every page (`pages()`), in reading order."""
    return [argv for page in pages() for argv in readme_commands(page.read_text(encoding="utf-8"), lang)]


_READS = ("--hf-checkpoint", "--prompt-data")
_TEMPLATE_READERS = ("--load-debug-rollout-data", "--ci-inject-rollout-data-path")


def readme_commands(text: str, lang: str = "bash") -> list[list[str]]:
    """The argv (after `grpolab`) of every `grpolab` command in the text's ```<lang> blocks, in order:
    continuation lines joined, comments dropped, `&&` chains split. `lang` "bash": commands that run
    on a fresh clone; "sh": ones that need the reader's machines.

    Raises:
        ValueError: a block ends inside a quoted argument, or a command holds `[--optional]` syntax
            or a `...` elision (it would not run as pasted).
    """
    found = []
    for block in re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S):
        pending = ""  # a quoted argument may span lines (a JSON body): read on until it closes
        for line in block.replace("\\\n", " ").splitlines():
            pending += line + "\n"
            try:
                tokens = shlex.split(pending, comments=True)
            except ValueError:
                continue
            shown, pending = pending.strip(), ""
            if any(t == "..." or t.startswith("[-") for t in tokens):  # ` [--json]`, ` [--tol 0]`, ` ...`
                raise ValueError(f"not a command that runs as pasted ([...] or ...): {shown!r}")
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


COMMANDS = page_commands()
YOUR_MACHINES = page_commands("sh")

_READ_ARGS: dict[tuple[str, ...], tuple[str, ...]] = {
    ("ui",): ("roots",),
    ("replay", "inspect"): ("file",),
    ("replay", "convert"): ("input",),
    ("replay", "logprobs"): ("run_dir",),
    ("replay", "filter"): ("template",),
    ("gate",): ("target", "baseline"),
    ("check", "template"): ("messages",),
    ("check", "turns"): ("recordings",),
    ("check", "parity"): ("prompt_data", "baseline"),
    ("check", "resume"): (),
    ("convert",): ("to_hf", "origin_hf_dir"),
    ("estimate",): (),
    ("agent", "run"): ("prompt_data",),
    ("diagnose", "hang"): ("run_dir",),
    ("diagnose", "log"): ("files",),
    ("diagnose", "gpu"): (),
    ("watchdog",): ("target",),
    ("serve",): (),
    ("diff",): ("run_a", "run_b", "baseline"),
}
"""The argparse dests each subcommand reads paths from (`--hf-checkpoint`: `_READS`, for all)."""


def _subcommand(args: argparse.Namespace) -> tuple[str, ...]:
    """("replay", "convert"), ("gate",), ...: the command and its own subcommand, if it has one."""
    subs = [
        getattr(args, d, None)
        for d in ("replay_command", "diagnose_command", "check_kind", "hash_command", "agent_command")
    ]
    return (args.command, *[s for s in subs if s][:1])


def _read_paths(argv: list[str]) -> list[str]:
    """The paths a non-train command reads (see `_READ_ARGS`).

    Raises:
        KeyError: a subcommand `_READ_ARGS` does not list (add it there).
    """
    args = build_parser().parse_args(argv)
    values = [getattr(args, dest) for dest in _READ_ARGS[_subcommand(args)]]
    return [v for value in values if value for v in (value if isinstance(value, list) else [value])]


def test_the_readme_has_the_commands_it_documents() -> None:
    """The extraction itself: one command per subcommand family at least, and the chained quick start."""
    firsts = {argv[0] for argv in COMMANDS}
    assert {"train", "ui", "replay", "gate", "diagnose", "watchdog", "diff", "serve"} <= firsts
    assert readme_commands(README.read_text(encoding="utf-8"))[0] == ["train"]  # the quick start
    assert len(COMMANDS) >= 30


def test_the_readme_is_a_door_to_every_docs_page() -> None:
    """Every docs page is linked from the README (a page nobody links is a page nobody reads), each
    link points at a page that exists, and the README stays short."""
    linked = {p.relative_to(REPO).as_posix() for p in pages()[1:]}
    on_disk = {p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md")}
    assert linked == on_disk
    assert len(README.read_text(encoding="utf-8").splitlines()) < 250


@pytest.mark.parametrize(
    "argv", COMMANDS + YOUR_MACHINES, ids=[" ".join(a)[:60] for a in COMMANDS + YOUR_MACHINES]
)
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
    assert file_problems(COMMANDS) == []


def file_problems(commands: list[list[str]]) -> list[str]:
    """What the commands read that neither ships with the repository nor is made by a command before."""
    saved: list[str] = []
    made: set[Path] = set()  # run directories and converted recordings, relative to the repository
    problems = []
    for argv in commands:
        shown = "grpolab " + " ".join(argv)
        for flag in _READS:
            value = _flag(argv, flag)
            path = (REPO / value).resolve() if value else None
            if path is not None and not _ships(path):
                problems.append(f"{shown}: {flag} {value} is not in a fresh clone")
        for flag in _TEMPLATE_READERS:
            value = _flag(argv, flag)
            if value is not None and value not in saved:
                problems.append(f"{shown}: {flag} {value} is recorded by no README command before it")
        if argv[0] != "train":
            for value in _read_paths(argv):
                if not _exists_or_made(value, made, saved):
                    problems.append(
                        f"{shown}: {value} is not in a fresh clone nor made by a command before it"
                    )
        if argv[0] == "train":  # its run directory; without --run-dir one under runs/ whose name is a time
            made.add(Path(_flag(argv, "--run-dir") or "runs/<time>"))
        if argv[:2] == ["replay", "convert"]:
            made.add(Path(argv[3]))
        template = _flag(argv, "--save-debug-rollout-data")
        if template is not None:
            saved.append(template)
    return problems


def _exists_or_made(value: str, made: set[Path], saved: list[str]) -> bool:
    """Whether `value` ships inside the repository, is (in) something made before, or is a recording."""
    if _ships((REPO / value).resolve()):
        return True
    rel = Path(value)
    made_paths = {m for m in made if "<" not in str(m)}
    return (
        any(rel in m.parents for m in made)
        or any(rel == m or m in rel.parents for m in made_paths)
        or any(_made_by(t, value) for t in saved)
    )


def test_the_checks_catch_what_a_fresh_clone_lacks() -> None:
    """The extraction and the file rule on the README's old mistakes: a prompt file outside the
    repository, a replay of a recording nobody made."""
    old = (
        "```bash\n# a comment\ngrpolab train \\\n  --prompt-data ../shared/data/gsm8k/train.jsonl\n"
        "grpolab train --load-debug-rollout-data 'runs/rec/r_{rollout_id}.grz' --num-rollout 3\n```\n"
    )
    for pasted_as_is_would_fail in (
        "grpolab diff a b [--tol 0] [--json]",
        "grpolab train --nproc-per-node 2 ...",
    ):
        with pytest.raises(ValueError, match="not a command that runs as pasted"):
            readme_commands(f"```bash\n{pasted_as_is_would_fail}\n```\n")
    assert readme_commands("```bash\ngrpolab gate 'a[0]>=1'\n```\n") == [["gate", "a[0]>=1"]]
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


def test_the_checks_catch_the_commands_a_tester_could_not_run() -> None:
    """The README's old examples that failed on a fresh clone (issue 15 fix F7): each reads a file
    or run directory that neither ships nor is made before; a train command makes its run directory
    (and `runs/`), a convert its output; a command needing the reader's fleet goes in an sh block."""
    old = [
        ["replay", "convert", "miles_rollout_0.pt", "r_0.grz"],
        ["gate", "runs/candidate", "--baseline", "runs/seed1", "runs/seed2", "miles_seed3.log"],
        ["diagnose", "log", "console.log", "miles.log"],
        ["ui", "runs/", "../miles-lab/runs/plain.log"],
    ]
    problems = file_problems(old)
    for path in ["miles_rollout_0.pt", "runs/candidate", "runs/seed1", "runs/seed2", "miles_seed3.log"]:
        assert any(f" {path} is not in a fresh clone nor made by a command before it" in p for p in problems)
    for path in ["console.log", "miles.log", "runs/", "../miles-lab/runs/plain.log"]:
        assert any(
            p.endswith(f": {path} is not in a fresh clone nor made by a command before it") for p in problems
        )
    assert len(problems) == 9
    made = REPO / "runs" / "candidate"  # as the user's own runs leave it after the quick start
    created = [d for d in (made.parent, made) if not d.exists()]
    made.mkdir(parents=True, exist_ok=True)
    try:
        assert file_problems(old) == problems  # what the user ran is not in a fresh clone
    finally:
        for d in reversed(created):
            d.rmdir()
    made_first = [
        ["train", "--run-dir", "runs/my-run"],
        ["replay", "convert", "fixtures/miles/miles_rollout_0.pt", "runs/m.grz"],
        ["ui", "runs/", "fixtures/logs/miles_plain.log"],
        ["diagnose", "log", "runs/my-run/console.log", "runs/m.grz"],
        ["gate", "runs/my-run", "--baseline", "fixtures/logs/gate_seed1.log"],
    ]
    assert file_problems(made_first) == []
    assert file_problems(made_first[2:]) != []  # nothing made them
    with pytest.raises(KeyError):
        _read_paths(["hash", "diff", "a", "b"])  # a subcommand the table lacks fails, not passes
    text = "```bash\ngrpolab train\n```\n```sh\ngrpolab train --sglang-router-ip 10.0.0.5\n```\n"
    assert readme_commands(text) == [["train"]]
    assert readme_commands(text, "sh") == [["train", "--sglang-router-ip", "10.0.0.5"]]
    assert ["train", "--sglang-router-ip", "10.0.0.5", "--sglang-router-port", "30000"] in YOUR_MACHINES
    assert not any("--sglang-router-ip" in argv for argv in COMMANDS)
