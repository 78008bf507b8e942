"""Grad-norm templates, JSON files and the Miles tolerance rule (math.isclose, rel = abs = 0.03)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from grpolab.checkers.errors import CheckFailure
from grpolab.checkers.grad_norm import (
    check_grad_norm,
    grad_norm_path,
    load_grad_norm,
    save_grad_norm,
    validate_grad_norm_template,
)


def test_template_with_fields_is_fine() -> None:
    assert validate_grad_norm_template("gn/{role}_{rollout_id}_{step_id}.json") is None
    assert validate_grad_norm_template("gn/{rollout_id:04d}-{{literal}}.json") is None
    assert grad_norm_path(
        "gn/{rollout_id:04d}_{step_id}.json", role="actor", rollout_id=7, step_id=1
    ) == Path("gn/0007_1.json")


def test_template_without_fields_gives_a_note() -> None:
    note = validate_grad_norm_template("gn.json", flag="--ci-load-grad-norm")
    assert note is not None and note.startswith("--ci-load-grad-norm: 'gn.json' has no {role}")


@pytest.mark.parametrize(
    ("template", "needle"),
    [
        ("gn_{step}.json", "uses the field {step}"),
        ("gn_{}.json", "uses the field {}"),
        ("gn_{0}.json", "uses the field {0}"),
        ("gn_{role.upper}.json", "uses the field {role.upper}"),
        ("gn_{role.json", "not a valid path template"),
        ("gn_}.json", "not a valid path template"),
        ("gn_{role:d}.json", "not a valid path template"),
        ("", "empty"),
    ],
)
def test_bad_templates_name_the_flag(template: str, needle: str) -> None:
    with pytest.raises(ValueError) as e:
        validate_grad_norm_template(template, flag="--ci-save-grad-norm")
    assert str(e.value).startswith("--ci-save-grad-norm: ") and needle in str(e.value)


def test_save_writes_round_tripping_json(tmp_path: Path) -> None:
    template = str(tmp_path / "gn" / "{role}_{rollout_id}_{step_id}.json")
    value = 0.1 + 0.2  # 0.30000000000000004: needs all 17 digits
    path = save_grad_norm(template, value, role="actor", rollout_id=3, step_id=1)
    assert path == tmp_path / "gn" / "actor_3_1.json"
    record = json.loads(path.read_text())
    assert record == {"grad_norm": 0.30000000000000004, "role": "actor", "rollout_id": 3, "step_id": 1}
    assert load_grad_norm(path) == value
    assert not path.read_bytes().startswith(b"PK")  # not a torch pickle


def test_check_within_miles_tolerance(tmp_path: Path) -> None:
    template = str(tmp_path / "{role}_{rollout_id}_{step_id}.json")
    save_grad_norm(template, 1.0, role="actor", rollout_id=3, step_id=1)
    # isclose(1.02, 1.0, rel_tol=0.03, abs_tol=0.03): |diff| 0.02 <= max(0.03 * 1.02, 0.03)
    assert check_grad_norm(template, 1.02, role="actor", rollout_id=3, step_id=1) == 1.0
    with pytest.raises(CheckFailure) as e:
        check_grad_norm(template, 1.05, role="actor", rollout_id=3, step_id=1)  # 0.05 > 0.0315
    assert e.value.checker == "grad_norm"
    assert str(e.value).startswith(
        "grad_norm check failed: grad norm mismatch at rollout 3 step 1: got 1.05, expected 1.0 (rtol=0.03, atol=0.03)"
    )
    # tighter tolerance from --ci-grad-norm-rtol
    with pytest.raises(CheckFailure, match=r"\(rtol=0.01, atol=0.01\)"):
        check_grad_norm(template, 1.02, role="actor", rollout_id=3, step_id=1, rtol=0.01, atol=0.01)


def test_zero_tolerance_is_bitwise(tmp_path: Path) -> None:
    template = str(tmp_path / "{rollout_id}_{step_id}.json")
    value = 0.1 + 0.2
    save_grad_norm(template, value, role="actor", rollout_id=0, step_id=0)
    check_grad_norm(template, 0.1 + 0.2, role="actor", rollout_id=0, step_id=0, rtol=0, atol=0)
    next_up = float(torch.nextafter(torch.tensor(value, dtype=torch.float64), torch.tensor(1.0)))
    with pytest.raises(
        CheckFailure, match=r"got 0.3000000000000001, expected 0.30000000000000004 \(bitwise\)"
    ):
        check_grad_norm(template, next_up, role="actor", rollout_id=0, step_id=0, rtol=0, atol=0)
    with pytest.raises(CheckFailure, match="bitwise"):
        check_grad_norm(template, 0.3, role="actor", rollout_id=0, step_id=0, rtol=0, atol=0)


def test_missing_and_unreadable_files_name_the_path(tmp_path: Path) -> None:
    template = str(tmp_path / "{role}_{rollout_id}_{step_id}.json")
    missing = tmp_path / "actor_5_0.json"
    with pytest.raises(CheckFailure, match=f"grad norm file missing: {missing}"):
        check_grad_norm(template, 1.0, role="actor", rollout_id=5, step_id=0)
    missing.write_text('{"norm": 1.0}')
    with pytest.raises(CheckFailure, match=f"grad norm file {missing} is unreadable"):
        check_grad_norm(template, 1.0, role="actor", rollout_id=5, step_id=0)
    missing.write_text('{"grad_norm": true}')
    with pytest.raises(CheckFailure, match="not a number"):
        check_grad_norm(template, 1.0, role="actor", rollout_id=5, step_id=0)
    with pytest.raises(ValueError, match="--ci-grad-norm-rtol"):
        check_grad_norm(template, 1.0, role="actor", rollout_id=5, step_id=0, rtol=-1)
    with pytest.raises(ValueError, match="--ci-load-grad-norm"):
        check_grad_norm(str(tmp_path / "{bad}"), 1.0, role="actor", rollout_id=5, step_id=0)


def test_reads_a_miles_torch_save_file(tmp_path: Path) -> None:
    torch.save(2.5, tmp_path / "grad_norm_actor_0_0.pt")
    template = str(tmp_path / "grad_norm_{role}_{rollout_id}_{step_id}.pt")
    assert check_grad_norm(template, 2.51, role="actor", rollout_id=0, step_id=0) == 2.5


def test_template_without_fields_overwrites_one_file(tmp_path: Path) -> None:
    template = str(tmp_path / "gn.json")
    save_grad_norm(template, 1.0, role="actor", rollout_id=0, step_id=0)
    path = save_grad_norm(template, 4.0, role="actor", rollout_id=0, step_id=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gn.json"]
    assert load_grad_norm(path) == 4.0
