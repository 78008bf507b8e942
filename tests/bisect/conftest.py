"""Fixtures of `grpolab bisect`'s tests: a recording, and scratch git repositories (tests/bisect/scratch.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from scratch import make_scratch_repo


@pytest.fixture(scope="session")
def scratch_repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """The 8-commit scratch repository (commit 5 changes the loss) and its commits, oldest first."""
    root = tmp_path_factory.mktemp("scratch") / "repo"
    root.mkdir()
    return root, make_scratch_repo(root)


@pytest.fixture(scope="session")
def recording(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 2-rollout recording of a real short run (tests/runs.py SHORT), as a {rollout_id} template."""
    from runs import train_short

    tmp = tmp_path_factory.mktemp("rec")
    template = str(tmp / "r_{rollout_id}.grz")
    train_short(tmp / "run", "--save-debug-rollout-data", template)
    return template
