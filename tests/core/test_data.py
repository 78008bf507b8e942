from __future__ import annotations

import json

import pytest

from grpolab.core.data import read_rows, rollout_prompt_indices


def test_rollouts_walk_epochs_without_repeats() -> None:
    seen = []
    for rollout_id in range(5):
        seen += rollout_prompt_indices(
            num_rows=10, rollout_id=rollout_id, rollout_batch_size=4, seed=1, shuffle=True
        )
    assert sorted(seen[:10]) == list(range(10))  # first epoch is a permutation
    assert sorted(seen[10:20]) == list(range(10))
    assert seen[:10] != seen[10:20]  # a new order each epoch
    again = rollout_prompt_indices(num_rows=10, rollout_id=3, rollout_batch_size=4, seed=1, shuffle=True)
    assert again == seen[12:16]  # a pure function of the rollout id: resume takes the same prompts


def test_no_shuffle_is_file_order() -> None:
    assert rollout_prompt_indices(num_rows=5, rollout_id=1, rollout_batch_size=3, seed=0, shuffle=False) == [
        3,
        4,
        0,
    ]


def test_bad_files_name_the_problem(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="--prompt-data"):
        read_rows(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"q": 1}\nnot json\n')
    with pytest.raises(ValueError, match="line 2 is not valid JSON"):
        read_rows(bad)
    txt = tmp_path / "x.csv"
    txt.write_text("a,b\n")
    with pytest.raises(ValueError, match=r"\.jsonl or \.parquet"):
        read_rows(txt)


def test_parquet_and_jsonl_read_the_same(tmp_path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"question": "1+1?", "answer": "#### 2"}, {"question": "2+2?", "answer": "#### 4"}]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "p.parquet")
    assert read_rows(tmp_path / "p.jsonl") == read_rows(tmp_path / "p.parquet") == rows
