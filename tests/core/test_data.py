from __future__ import annotations

import gzip
import json

import pytest

from grpolab.core.data import check_rows, prompt_file, read_rows, read_rows_and_lines, rollout_prompt_indices


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
    with pytest.raises(ValueError, match="line 2 column 1 is not valid JSON"):
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


def test_files_that_are_not_utf8_json_lines_name_the_flag_file_and_line(tmp_path) -> None:
    good = '{"question": "1+1?", "answer": "2"}\n'
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes((good + '{"question": "caf\u00e9?", "answer": "1"}\n').encode("latin-1"))
    with pytest.raises(ValueError) as info:
        read_rows(latin1, "--eval-prompt-data held")
    message = str(info.value)
    assert message.startswith(
        f"--eval-prompt-data held: {latin1} line 2 is not UTF-8: byte 0xe9 at column 18"
    )
    assert "expected UTF-8 JSON lines" in message
    gz = tmp_path / "gz.jsonl"
    gz.write_bytes(gzip.compress(good.encode()))
    with pytest.raises(
        ValueError, match=f"--prompt-data: {gz} is gzip-compressed; expected UTF-8 JSON lines"
    ):
        read_rows(gz)
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(good.encode() + b"\x00\x01\x02\n")
    with pytest.raises(ValueError, match=f"{binary} line 2 holds binary data"):
        read_rows(binary)
    with pytest.raises(ValueError, match=f"--prompt-data: {tmp_path} is a directory"):
        read_rows(tmp_path)
    fake = tmp_path / "x.parquet"
    fake.write_text(good)
    with pytest.raises(ValueError, match="is not a parquet file"):
        prompt_file(fake)
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + good.encode())  # a UTF-8 byte-order mark is still UTF-8
    assert read_rows(bom) == [{"question": "1+1?", "answer": "2"}]


def test_a_malformed_json_line_gives_one_line_number(tmp_path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"q": 1}\n' * 5 + '{"q": 1,\n{"q": 2}\n')
    with pytest.raises(ValueError) as info:
        read_rows(path)
    message = str(info.value)
    assert message == (
        f"--prompt-data: {path} line 6 column 9 is not valid JSON (Expecting property name enclosed in "
        "double quotes); expected one JSON object per line"
    )
    assert "line 2" not in message  # json's own position counted the line's newline as a second line


def test_row_errors_name_the_file_line_counting_blank_lines(tmp_path) -> None:
    """F5: a missing or null field is named by its line in the file (blank lines counted), as the
    UTF-8/JSON errors are; a parquet file has no lines, so its rows are numbered from 0."""
    path = tmp_path / "p.jsonl"
    good = json.dumps({"question": "1+1?", "answer": "2"})
    path.write_text(good + "\n\n" + good + "\n" + json.dumps({"question": "3+3?"}) + "\n")
    rows, lines = read_rows_and_lines(path)
    assert lines == [1, 3, 4]
    with pytest.raises(ValueError, match=rf"--label-key 'answer': {path} line 4 has no such field"):
        check_rows(
            rows, path, input_key="question", label_key="answer", apply_chat_template=False, lines=lines
        )
    path.write_text(good + "\n\n\n" + json.dumps({"question": None, "answer": "4"}) + "\n")
    rows, lines = read_rows_and_lines(path)
    with pytest.raises(ValueError, match=rf"--input-key 'question': {path} line 4 is null"):
        check_rows(
            rows, path, input_key="question", label_key="answer", apply_chat_template=False, lines=lines
        )
    with pytest.raises(ValueError, match=rf"--input-key 'question': row 1 of {path} is null"):
        check_rows(rows, path, input_key="question", label_key="answer", apply_chat_template=False)
