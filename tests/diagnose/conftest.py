"""Fixtures shared by the diagnose tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hang_fakes import FakeWorld


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeWorld]:
    """Real sleeping rank processes and a fake py-spy (`hang_fakes.FakeWorld`), closed afterwards."""
    w = FakeWorld(tmp_path)
    monkeypatch.setenv("FAKE_PYSPY_DIR", str(w.spy_dir))
    try:
        yield w
    finally:
        w.close()
