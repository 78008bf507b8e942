"""Git for `grpolab bisect`: the repository, its revisions, git's own bisection order, worktrees.

Bisection asks git which commit to test next (`git rev-list --bisect-all BAD --not GOOD...`, the order
`git bisect` itself uses), keeping good/bad/skip in memory: the user's checkout (its HEAD, index,
refs/bisect and work tree) is never touched. Each tested commit is checked out in a temporary
`git worktree add --detach` that is removed afterwards.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path


class BisectInputError(ValueError):
    """Bad input to `grpolab bisect` (exit 2): the message names the flag or path."""


def git(repo: Path, *args: str) -> str:
    """Run `git -C repo ARGS` and return its stdout (stripped).

    Raises:
        RuntimeError: git exited non-zero (its stderr in the message) or is not installed.
    """
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
    except OSError as e:
        raise RuntimeError(f"git is not runnable: {e}") from None
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} in {repo}: {done.stderr.strip()}")
    return done.stdout.strip()


def default_repo() -> Path:
    """The grpolab checkout this package runs from: the repository root IS the package directory."""
    import grpolab

    return Path(grpolab.__file__).resolve().parent


def find_repo(path: str | Path | None) -> Path:
    """The top level of the git repository `--repo` names (default: the grpolab checkout).

    Raises:
        BisectInputError: the path does not exist or is not inside a git work tree.
    """
    repo = Path(path).expanduser().resolve() if path is not None else default_repo()
    if not repo.is_dir():
        raise BisectInputError(f"--repo {repo}: no such directory")
    try:
        return Path(git(repo, "rev-parse", "--show-toplevel"))
    except RuntimeError:
        raise BisectInputError(f"--repo {repo}: not a git repository (git rev-parse failed)") from None


def resolve_commit(repo: Path, rev: str, flag: str) -> str:
    """The full hash of commit `rev` in `repo`.

    Raises:
        BisectInputError: `rev` names no commit there (the message names `flag`).
    """
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}")
    except RuntimeError:
        raise BisectInputError(f"{flag} {rev}: no such commit in {repo}") from None


def check_range(repo: Path, good: str, bad: str) -> None:
    """Require `good` (full hash) to be a proper ancestor of `bad`.

    Raises:
        BisectInputError: good == bad, or good is not an ancestor of bad.
    """
    if good == bad:
        raise BisectInputError(f"--good and --bad are the same commit ({good[:12]}): nothing to bisect")
    try:
        git(repo, "merge-base", "--is-ancestor", good, bad)
    except RuntimeError:
        raise BisectInputError(
            f"--good {good[:12]} is not an ancestor of --bad {bad[:12]}: bisect needs good before bad"
        ) from None


def is_dirty(repo: Path) -> bool:
    """Whether tracked files of `repo`'s work tree differ from HEAD (untracked files ignored)."""
    return bool(git(repo, "status", "--porcelain", "--untracked-files=no"))


_BISECT_ALL = re.compile(r"^([0-9a-f]{40,64}) \(dist=(-?\d+)\)$")


def next_commit(repo: Path, bad: str, goods: list[str], skipped: set[str]) -> tuple[str | None, list[str]]:
    """Git's next commit to test, or the end of the bisection.

    `git rev-list --bisect-all BAD --not GOODS` lists the commits that may still be the first bad one,
    best split first (the order `git bisect` picks from); skipped commits are passed over as
    `git bisect skip` does.

    Returns:
        (commit, []) to test next; (None, [bad]) when `bad` is the first bad commit; (None, the
        candidates) when only skipped commits are left between the good ones and `bad`.
    """
    out = git(repo, "rev-list", "--bisect-all", bad, "--not", *goods)
    candidates = [m.group(1) for line in out.splitlines() if (m := _BISECT_ALL.match(line.strip()))]
    untested = [c for c in candidates if c != bad and c not in skipped]
    if untested:
        return untested[0], []
    left = [c for c in candidates if c in skipped]
    return None, [bad] if not left else [*left, bad]


def commit_summary(repo: Path, commit: str) -> dict[str, str]:
    """Short hash, subject, author date (ISO 8601) and `git show --stat` text of `commit`."""
    fmt = "%h%x00%s%x00%aI"
    short, subject, date = git(repo, "show", "--no-patch", f"--format={fmt}", commit).split("\x00")
    shown = git(repo, "show", "--no-color", "--stat", "--summary", "--pretty=medium", commit)
    return {"commit": commit, "short": short, "subject": subject, "author_date": date, "show": shown}


def add_worktree(repo: Path, commit: str, where: Path) -> Path:
    """`git worktree add --detach where commit`; returns `where`.

    Raises:
        RuntimeError: git refused (the message has git's reason).
    """
    git(repo, "worktree", "add", "--detach", "--force", str(where), commit)
    return where


def remove_worktree(repo: Path, where: Path) -> None:
    """Remove a worktree made by `add_worktree` (and git's record of it); never raises."""
    try:
        git(repo, "worktree", "remove", "--force", str(where))
    except RuntimeError:
        pass
    try:
        git(repo, "worktree", "prune")
    except RuntimeError:
        pass
