"""Samples over the process group (replay/wire.py, rollout/central.py): the `.grz` bytes rank 0 of a
multi-rank server run broadcasts, checked field by field, and one real 2-process gloo broadcast."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from replay_helpers import build_samples

from grpolab.cli import build_parser, config_from_args
from grpolab.core.batch import Sample
from grpolab.core.dist import DistContext
from grpolab.replay.format import RecordingError
from grpolab.replay.wire import decode_samples, encode_samples
from grpolab.rollout.central import builds_engine, is_central, joins_engine_of_rank_zero

HERE = Path(__file__).resolve().parent


def same(a: Sample, b: Sample) -> bool:
    """Every field equal; tensors bit for bit and of the same dtype."""
    for name in a.__dataclass_fields__:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, torch.Tensor):
            if not (x.dtype == y.dtype and x.numpy().tobytes() == y.numpy().tobytes()):
                return False
        elif name == "kept_token_ids" and x is not None:
            if (
                y is None
                or len(x) != len(y)
                or not all(torch.equal(p, q) and p.dtype == q.dtype for p, q in zip(x, y))
            ):
                return False
        elif x != y:
            return False
    return True


def test_wire_bytes_give_back_every_field_bit_for_bit() -> None:
    samples = build_samples(16, kept=True, seed=3)
    samples[2].rollout_log_probs[0] = float("-inf")  # a masked token's log-prob survives too
    back, rollout_id = decode_samples(encode_samples(samples, rollout_id=5, weight_version=7))
    assert rollout_id == 5 and len(back) == 16
    assert all(same(a, b) for a, b in zip(samples, back))
    assert back[1].kept_token_ids is not None and back[0].kept_token_ids is None
    assert back[1].metadata == {"note": 1, "nested": {"x": [1, 2]}}
    changed = build_samples(16, kept=True, seed=3)
    changed[4].rollout_log_probs[1] += 1e-6  # one ulp-scale change is seen by the comparison
    assert not same(changed[4], back[4])


def test_cut_or_corrupt_wire_bytes_are_refused_by_name() -> None:
    data = encode_samples(build_samples(4), rollout_id=0, weight_version=1)
    with pytest.raises(RecordingError, match="rollout 0 from rank 0"):
        decode_samples(data[: len(data) // 2], name="rollout 0 from rank 0")
    flipped = bytearray(data)
    flipped[-10] ^= 0xFF
    with pytest.raises(RecordingError):
        decode_samples(bytes(flipped))


def test_empty_rollout_and_bad_samples() -> None:
    assert decode_samples(encode_samples([], rollout_id=2, weight_version=0)) == ([], 2)
    bad = build_samples(2)
    bad[1].finish_reason = "abort"
    with pytest.raises(ValueError, match="sample 1: finish_reason 'abort'"):
        encode_samples(bad, rollout_id=0, weight_version=0)


def test_which_ranks_build_the_engine() -> None:
    parse = build_parser().parse_args
    servers = config_from_args(parse(["train", "--rollout-num-engines", "2"]))
    inproc = config_from_args(parse(["train"]))
    rank0, rank1 = DistContext(0, 2, "gloo"), DistContext(1, 2, "gloo")
    assert is_central(servers, 2) and not is_central(servers, 1) and not is_central(inproc, 2)
    assert builds_engine(servers, rank0) and not builds_engine(servers, rank1)
    assert builds_engine(inproc, rank1)  # in-process engines: every rank its own
    assert joins_engine_of_rank_zero(servers, rank1) and not joins_engine_of_rank_zero(servers, rank0)
    assert not joins_engine_of_rank_zero(inproc, rank1)


RANK_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {helpers!r})
    from replay_helpers import build_samples
    from grpolab.rollout.central import broadcast_samples
    from grpolab.core.dist import init_distributed, shutdown
    from test_wire import same

    ctx = init_distributed("cpu", deterministic=False)
    whole = build_samples(16, kept=True, seed=11)
    for rollout_id in (0, 1):  # two rollouts in a row: lengths differ, nothing left over
        mine = whole[: 8 + rollout_id] if ctx.rank == 0 else None
        got = broadcast_samples(mine, ctx, rollout_id=rollout_id, weight_version=3)
        assert len(got) == 8 + rollout_id and all(same(a, b) for a, b in zip(whole, got)), ctx.rank
        assert (got is mine) == (ctx.rank == 0)
    print("rank", ctx.rank, "ok")
    shutdown(ctx)
    """
)


def test_two_processes_receive_rank_zeros_rollout(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT.format(helpers=str(HERE)))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    env["OMP_NUM_THREADS"] = "1"
    procs = [
        subprocess.Popen(
            [sys.executable, str(script)],
            env={**env, "RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    for r, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and f"rank {r} ok" in out, err[-3000:]
