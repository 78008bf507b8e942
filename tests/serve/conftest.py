"""Fixtures for tests/serve: SGLang's generated JSON contract (sglang 0.5.23's api_types, real)."""

from __future__ import annotations

from types import ModuleType

import pytest
from serving import load_contract


@pytest.fixture(scope="session")
def contract() -> ModuleType:
    return load_contract()
