"""Import of Miles/slime `.pt` rollout dumps: plain files convert, pickled classes are refused unexecuted."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from replay_helpers import make_dump, miles_sample

from grpolab.replay.format import RecordingError
from grpolab.replay.miles_import import convert_miles, load_miles_pt, miles_samples
from grpolab.replay.recording import load_rollout

UNPICKLED: list[str] = []


def _touch(path: str) -> None:
    """What a malicious/custom pickle would run on load."""
    Path(path).write_text("unpickled!")


class Payload:
    """Default pickling (GLOBAL test_miles_import.Payload); records when it is unpickled."""

    def __init__(self, x: int) -> None:
        self.x = x

    def __setstate__(self, state: dict) -> None:
        UNPICKLED.append("setstate")
        self.__dict__.update(state)


class Reducer:
    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple:
        return (_touch, (self.path,))


def test_convert_plain_dump(tmp_path: Path) -> None:
    torch.save(make_dump(), tmp_path / "r.pt")
    n = convert_miles(tmp_path / "r.pt", tmp_path / "r.grz", reward_key="acc")
    assert n == (tmp_path / "r.grz").stat().st_size
    rec = load_rollout(tmp_path / "r.grz")
    assert rec.rollout_id == 5 and rec.weight_version == 4 and rec.run_seed == 0
    assert rec.extra["source"] == "miles" and rec.extra["seeds_known"] is False
    assert rec.extra["miles_metadata"] == {"dynamic_global_batch_size": 4}
    s = rec.samples
    assert [x.prompt_ids for x in s] == [[1, 2, 3], [1, 2, 3], [5, 6], [5, 6], [5, 6]]
    assert [x.response_ids for x in s] == [[10, 11, 12, 13], [14, 15], [20, 21, 22], [23], []]
    assert [x.finish_reason for x in s] == ["stop", "length", "stop", "length", "stop"]
    assert [x.group_index for x in s] == [0, 0, 1, 1, 1] and [x.sample_index for x in s] == [0, 1, 0, 1, 2]
    assert [x.index for x in s] == [0, 1, 2, 3, 4] and [x.metadata["miles_index"] for x in s] == [
        1000,
        1001,
        1002,
        1003,
        1004,
    ]
    assert [x.reward for x in s] == [0.0, 1.0, 1.0, 1.0, 0.0]
    assert s[2].metadata["miles_reward"] == {"acc": 1.0, "fmt": 0.5}
    assert torch.equal(s[0].rollout_log_probs, torch.tensor([-0.125, -0.25, -0.375, -0.5]))
    assert s[0].rollout_log_probs.dtype == torch.float32 and s[0].loss_mask.dtype == torch.float32
    assert s[2].loss_mask.tolist() == [1.0, 0.0, 1.0]
    assert s[3].loss_mask.tolist() == [0.0]  # remove_sample zeroes the mask
    assert s[1].metadata["miles_status"] == "Status.TRUNCATED" and s[3].metadata["miles_status"] == "aborted"
    assert s[0].prompt_text == "prompt 0" and s[0].response_text == "response 0" and s[0].label == "0"
    assert s[4].metadata["messages"] == [{"role": "user", "content": "hi"}]
    assert all(x.seed == 0 and x.advantage == 0.0 and x.kept_token_ids is None for x in s)


def test_custom_class_is_refused_without_unpickling(tmp_path: Path) -> None:
    dump = make_dump()
    dump["samples"][0]["metadata"] = {"obj": Payload(3)}
    torch.save(dump, tmp_path / "custom.pt")
    with pytest.raises(RecordingError) as e:
        convert_miles(tmp_path / "custom.pt", tmp_path / "out.grz")
    msg = str(e.value)
    assert "custom.pt" in msg and "Payload" in msg and "refused on purpose" in msg and "plain types" in msg
    assert "weights_only=False" not in msg  # never the advice to load it unsafely
    assert UNPICKLED == [] and not (tmp_path / "out.grz").exists()
    torch.load(tmp_path / "custom.pt", weights_only=False)  # control: an unsafe load does run it
    assert UNPICKLED == ["setstate"]

    marker = tmp_path / "marker"
    torch.save({"rollout_id": 0, "samples": [Reducer(marker)]}, tmp_path / "reduce.pt")
    with pytest.raises(RecordingError, match="_touch"):
        load_miles_pt(tmp_path / "reduce.pt")
    assert not marker.exists()


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"tokens": None}, "sample 1: missing field 'tokens'"),
        ({"status": None, "reward": None}, r"sample 1: missing field 'reward' \(also \['status'\]\)"),
        ({"rollout_log_probs": [-1.0]}, "sample 1: rollout_log_probs has 1 values but response_length is 2"),
        ({"loss_mask": [1, 1, 1]}, "sample 1: loss_mask has 3 values but response_length is 2"),
        ({"response_length": 5}, r"sample 1: response_length 5 must be in \[0, 5\)"),
        ({"tokens": [1.5, 2.0]}, "sample 1: tokens must be a list of ints"),
        ({"status": "pending"}, "sample 1: status 'pending' is not one of"),
        ({"reward": {"a": 1.0}}, r"sample 1: reward is a dict \(keys \['a'\]\); set --reward-key"),
        ({"reward": [1.0, 2.0]}, r"sample 1: reward is not a number: \[1.0, 2.0\]"),
        ({"group_index": "x"}, "sample 1: group_index must be an int"),
    ],
)
def test_invalid_samples_name_index_and_field(tmp_path: Path, over: dict, message: str) -> None:
    samples = [miles_sample(0, 0, [1, 2, 3], [4, 5]), miles_sample(1, 0, [1, 2, 3], [6, 7])]
    samples[1].update(over)
    for k in [k for k, v in over.items() if v is None]:
        del samples[1][k]
    torch.save({"rollout_id": 0, "samples": samples}, tmp_path / "bad.pt")
    with pytest.raises(RecordingError, match=message) as e:
        convert_miles(tmp_path / "bad.pt", tmp_path / "bad.grz")
    assert "bad.pt" in str(e.value)


def test_not_a_dump(tmp_path: Path) -> None:
    (tmp_path / "text.pt").write_text("not a torch file")
    with pytest.raises(RecordingError, match="not a readable torch.save file"):
        load_miles_pt(tmp_path / "text.pt")
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(RecordingError, match="expected a Miles dump dict"):
        load_miles_pt(tmp_path / "list.pt")
    with pytest.raises(RecordingError, match="no such Miles recording"):
        load_miles_pt(tmp_path / "absent.pt")
    data = (tmp_path / "list.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(RecordingError):
        load_miles_pt(tmp_path / "cut.pt")
    assert miles_samples({"samples": []}) == []
