"""Fixtures for tests/fleet: SGLang's generated JSON contract, loaded as tests/serve loads it."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "serve"))  # serving.load_contract

from serving import load_contract  # noqa: E402


@pytest.fixture(scope="session")
def contract() -> ModuleType:
    return load_contract()
