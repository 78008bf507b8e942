"""Grad-norm save/compare across runs: `--ci-save-grad-norm T` / `--ci-load-grad-norm T`.

What is computed (Miles `miles/backends/training_utils/ci_utils.py::check_grad_norm`, notes
section 3.5): after every optimizer step, on data-parallel rank 0 only, the step's grad norm is
written to (save) or compared with (load) the file `T.format(role=…, rollout_id=…, step_id=…)`,
`role` "actor"/"critic", `step_id` the optimizer step within the rollout. The comparison is
`math.isclose(got, expected, rel_tol=0.03, abs_tol=0.03)` (Miles' constants); `rtol = atol = 0`
means bitwise equality. Deviations from Miles: the file is a small JSON (`{"grad_norm": 1.25, ...}`,
the float written with its shortest round-tripping repr, written atomically) instead of a
`torch.save` pickle; a Miles `.pt` file is still read (`torch.load(weights_only=True)`) so a
grpolab run can be compared with a Miles one; the template is validated up front; a missing file
and a mismatch name the path, the rollout and the step.
"""

from __future__ import annotations

import json
import math
import string
from pathlib import Path

from grpolab.checkers.errors import CheckFailure
from grpolab.core.atomic import atomic_write_json
from grpolab.core.config.validation import register_value_check

TEMPLATE_FIELDS = ("role", "rollout_id", "step_id")
DEFAULT_RTOL = 0.03  # Miles: math.isclose(..., rel_tol=0.03, abs_tol=0.03)
DEFAULT_ATOL = 0.03
_SAMPLE = {"role": "actor", "rollout_id": 0, "step_id": 0}


def validate_grad_norm_template(template: str, *, flag: str = "--ci-save-grad-norm") -> str | None:
    """Check a `--ci-save-grad-norm` / `--ci-load-grad-norm` template.

    Allowed: the fields `{role}`, `{rollout_id}`, `{step_id}`, with optional format specs
    (`{rollout_id:04d}`); literal braces as `{{` / `}}`.

    Returns:
        None, or a note to show the user when the template has none of the fields (every step
        then writes or reads the same file, as in Miles).

    Raises:
        ValueError: naming `flag`, for an empty template, an unknown, positional or indexed field,
            unbalanced braces, or a format spec that does not fit the field.
    """
    if not template:
        raise ValueError(f"{flag}: the path template is empty")
    used: set[str] = set()
    try:
        for _, field, _, _ in string.Formatter().parse(template):
            if field is None:
                continue
            if field not in TEMPLATE_FIELDS:
                shown = "{}" if field == "" else "{" + field + "}"
                raise ValueError(
                    f"{flag}: {template!r} uses the field {shown}; only {{role}}, {{rollout_id}} and "
                    "{step_id} are allowed (write a literal brace as {{ or }})"
                )
            used.add(field)
        template.format(**_SAMPLE)
    except ValueError as e:
        if str(e).startswith(flag):
            raise
        raise ValueError(f"{flag}: {template!r} is not a valid path template: {e}") from e
    if not used:
        return (
            f"{flag}: {template!r} has no {{role}}, {{rollout_id}} or {{step_id}}; every step "
            "uses the same file (only the last step's grad norm is kept / every step compares with it)"
        )
    return None


def grad_norm_path(template: str, *, role: str, rollout_id: int, step_id: int) -> Path:
    """The file for one step: `template.format(role=…, rollout_id=…, step_id=…)`."""
    return Path(template.format(role=role, rollout_id=rollout_id, step_id=step_id))


def save_grad_norm(template: str, value: float, *, role: str, rollout_id: int, step_id: int) -> Path:
    """Write `{"grad_norm": value, "role": …, "rollout_id": …, "step_id": …}` atomically; return the path.

    Raises:
        ValueError: the template is invalid (names `--ci-save-grad-norm`).
    """
    validate_grad_norm_template(template, flag="--ci-save-grad-norm")
    path = grad_norm_path(template, role=role, rollout_id=rollout_id, step_id=step_id)
    record = {"grad_norm": float(value), "role": role, "rollout_id": rollout_id, "step_id": step_id}
    atomic_write_json(path, record)  # json writes floats with repr: the value round-trips exactly
    return path


def load_grad_norm(path: str | Path) -> float:
    """Read a grad norm saved by `save_grad_norm` (JSON) or by Miles (`torch.save(float)`).

    Raises:
        CheckFailure: the file is missing or holds no grad norm (names the path).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckFailure(
            "grad_norm", f"grad norm file missing: {path} (expected from a run with --ci-save-grad-norm)"
        )
    data = path.read_bytes()
    try:
        if data[:2] == b"PK":  # a zip archive: Miles' torch.save of a float
            import torch

            from grpolab.core.safe_load import load_pt

            value = load_pt(path, data=data)
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                value = value.item()
        else:
            value = json.loads(data)["grad_norm"]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"grad_norm is {type(value).__name__}, not a number")
        return float(value)
    except Exception as e:
        raise CheckFailure("grad_norm", f"grad norm file {path} is unreadable: {e}") from e


def grad_norms_match(value: float, expected: float, *, rtol: float, atol: float) -> bool:
    """`math.isclose(value, expected, rel_tol=rtol, abs_tol=atol)`; exact `==` when both are 0."""
    if rtol == 0 and atol == 0:
        return value == expected
    return math.isclose(value, expected, rel_tol=rtol, abs_tol=atol)


def check_grad_norm(
    template: str,
    value: float,
    *,
    role: str,
    rollout_id: int,
    step_id: int,
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
) -> float:
    """Compare this step's grad norm with the saved one (`--ci-load-grad-norm`); return the expected value.

    Raises:
        ValueError: the template is invalid or a tolerance is negative (names the flag).
        CheckFailure: the file is missing (names the path) or the values differ:
            `grad norm mismatch at rollout R step S: got X, expected Y (rtol=…, atol=…)`.
    """
    validate_grad_norm_template(template, flag="--ci-load-grad-norm")
    if not (rtol >= 0 and atol >= 0):
        raise ValueError(f"--ci-grad-norm-rtol: tolerances must be >= 0, got rtol={rtol}, atol={atol}")
    path = grad_norm_path(template, role=role, rollout_id=rollout_id, step_id=step_id)
    expected = load_grad_norm(path)
    value = float(value)
    if not grad_norms_match(value, expected, rtol=rtol, atol=atol):
        mode = "bitwise" if rtol == 0 and atol == 0 else f"rtol={rtol}, atol={atol}"
        raise CheckFailure(
            "grad_norm",
            f"grad norm mismatch at rollout {rollout_id} step {step_id}: got {value!r}, expected "
            f"{expected!r} ({mode}); role {role}, |diff| {abs(value - expected):.3e}, file {path}",
        )
    return expected


for _flag in ("--ci-save-grad-norm", "--ci-load-grad-norm"):  # the config checks each template it is given
    register_value_check(_flag, lambda template, flag: validate_grad_norm_template(template, flag=flag))
