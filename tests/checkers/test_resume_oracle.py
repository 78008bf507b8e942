"""`grpolab check resume` (checkers/resume_command.py): a run killed after its checkpoint and resumed with
`--load` is the straight run bit for bit, with an lr schedule, a shuffled prompt stream crossing an epoch
boundary at the resume, KL and TIS; a flag changed on resume is named at the first step it changes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from grpolab.cli import main

SMALL = ["--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "8"]


def oracle(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, dict]:
    code = main(["check", "resume", "--json", *argv])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else {}


def test_a_killed_and_resumed_run_is_the_straight_run(tmp_path: Path, capsys) -> None:
    rows = [json.dumps({"question": f"What is {a} + {a}?", "answer": str(2 * a)}) for a in (1, 2, 3)]
    data = tmp_path / "three.jsonl"
    data.write_text("\n".join(rows) + "\n")  # rollout 1 reads the last row of epoch 0 and one of epoch 1
    flags = [*SMALL, "--prompt-data", str(data), "--rollout-shuffle", "--lr-decay-style", "cosine",
             "--lr-warmup-iters", "1", "--use-kl-loss", "--kl-loss-coef", "0.01", "--use-tis"]  # fmt: skip
    code, report = oracle(
        capsys, "--steps", "2", "--resume-at", "1", "--work-dir", str(tmp_path / "w"), "--", *flags
    )
    assert code == 0 and report["same"] and report["differences"] == []
    steps = [json.loads(x) for x in (tmp_path / "w" / "resumed" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if r["kind"] == "step"] == [1]  # the resumed run trained rollout 1 only
    assert (
        main(["check", "resume", "--steps", "2", "--resume-at", "1", "--work-dir", str(tmp_path / "w")]) == 2
    )
    assert "is not empty" in capsys.readouterr().err


def test_a_flag_changed_on_resume_is_named_at_its_first_step(tmp_path: Path, capsys) -> None:
    code, report = oracle(capsys, "--steps", "2", "--resume-at", "1", "--resume-extra", "--entropy-coef 0.01",
                          "--", *SMALL, "--rollout-temperature", "1.5")  # fmt: skip
    assert code == 1 and not report["same"]
    assert report["differences"][0].startswith("step 1 train/")  # rollout 0 is the same; step 1 is not


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "1", "--resume-at", "1"], "--steps must be >= 2"),
        (["--steps", "3", "--resume-at", "3"], "--resume-at must be in 1..2"),
        (
            ["--steps", "3", "--resume-at", "1", "--", "--save", "x"],
            "--save: set by grpolab check resume itself",
        ),
        (
            ["--steps", "2", "--resume-at", "1", "--", "--rollout-batch-size", "0"],
            "--rollout-batch-size must be >= 1",
        ),
    ],
)
def test_check_resume_bad_input_exits_2(capsys, argv: list[str], message: str) -> None:
    assert main(["check", "resume", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_two_ranks_resume_bit_for_bit(capsys) -> None:
    """The same oracle on a 2-rank world (torchrun, gloo, FSDP2): its killed process group ends together."""
    code, report = oracle(capsys, "--steps", "2", "--resume-at", "1", "--", *SMALL, "--nproc-per-node", "2",
                          "--lr-decay-style", "linear")  # fmt: skip
    assert code == 0 and report["same"], report


def test_a_run_that_fails_keeps_the_log_it_cites(capsys) -> None:
    """A train flag only the runs themselves refuse: the error cites the killed run's log, which is kept."""
    import re

    assert main(["check", "resume", "--steps", "2", "--resume-at", "1", "--", "--no-such-flag"]) == 2
    err = capsys.readouterr().err
    cited = re.search(r"\(log: (\S+)\)", err)
    assert cited is not None and "--no-such-flag" in Path(cited[1]).read_text(), err
    shutil.rmtree(Path(cited[1]).parent)
