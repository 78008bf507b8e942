"""An unknown flag of a subcommand shows that subcommand's usage, not the top-level `grpolab` one.

`grpolab train --bogus-flag` printed `usage: grpolab [-h] {train,replay,...}` and `grpolab: error:
unrecognized arguments`: argparse's subparsers leave unknown arguments to the top-level parser.
"""

from __future__ import annotations

import pytest

from grpolab.cli import main

CASES = [
    (["train", "--bogus-flag"], "grpolab train", "--bogus-flag"),
    (["train", "--num-rollout", "2", "--bogus-flag=3"], "grpolab train", "--bogus-flag=3"),
    (["replay", "inspect", "--bogus", "x.grz"], "grpolab replay inspect", "--bogus"),
    (["diagnose", "log", "--bogus", "f.log"], "grpolab diagnose log", "--bogus"),
    (["watchdog", "--bogus"], "grpolab watchdog", "--bogus"),
    (["gate", "--bogus", "f.log"], "grpolab gate", "--bogus"),
    (["hash", "diff", "a", "b", "--bogus"], "grpolab hash diff", "--bogus"),
    (["diff", "--bogus", "a", "b"], "grpolab diff", "--bogus"),
    (["ui", "--bogus"], "grpolab ui", "--bogus"),
    (["serve", "--hf-checkpoint", "m", "--bogus", "1"], "grpolab serve", "--bogus 1"),
]


@pytest.mark.parametrize(("argv", "prog", "unknown"), CASES, ids=[" ".join(c[0][:2]) for c in CASES])
def test_an_unknown_flag_shows_the_subcommands_usage(
    argv: list[str], prog: str, unknown: str, capsys
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.startswith(f"usage: {prog} "), out.err
    assert out.err.endswith(f"\n{prog}: error: unrecognized arguments: {unknown}\n"), out.err
    assert "{train," not in out.err  # not the top-level usage's list of subcommands


def test_a_bad_subcommand_still_shows_the_top_level_usage(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--bogus"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("usage: grpolab [-h]")
        and "grpolab: error: the following arguments are required" in err
    )
