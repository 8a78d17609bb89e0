"""A dense-caption JSONL line that gives one key twice (two ``"text"`` fields, a hand edit or a merge gone
wrong) is refused naming the file and line, as JSON files already are (``data/json_keys.py``): Python's
``json`` kept the last value without a word, so training read the second text and the first was lost."""

from __future__ import annotations

import json

import pytest

from patchword.data.textfiles import load_dense_jsonl, read_dense_lines
from patchword.densify.stats import read_texts
from patchword.densify.store import read_records
from patchword.errors import DataError

GOOD = json.dumps({"text": "a red circle", "model_id": "m", "metadata": {"image_id": "0"}})
TWICE = '{"text": "a blue square", "model_id": "m", "text": "a green one", "metadata": {"image_id": "1"}}'
NESTED = '{"text": "a dot", "model_id": "m", "metadata": {"image_id": "2", "image_id": "3"}}'


@pytest.mark.parametrize(("line", "key"), [(TWICE, "text"), (NESTED, "image_id")])
def test_the_training_reader_refuses_a_line_giving_a_key_twice(tmp_path, line, key):
    path = tmp_path / "dense.jsonl"
    path.write_text(f"{GOOD}\n{line}\n")
    with pytest.raises(DataError) as err:
        read_dense_lines(path)
    assert str(err.value) == (
        f"{path}:2: key {key!r} appears twice in one JSON object (a JSON reader keeps only the last value): "
        "remove or rename one"
    )
    path.write_text(f"{GOOD}\n")
    assert load_dense_jsonl(path) == ["a red circle"]


def test_densify_reading_its_own_file_back_refuses_a_line_giving_a_key_twice(tmp_path):
    path = tmp_path / "dense.jsonl"
    path.write_text(f"{GOOD}\n{TWICE}\n")
    with pytest.raises(DataError, match=rf"^{path}:2: key 'text' appears twice in one JSON object"):
        read_records(path)
    path.write_text(f"{GOOD}\n")
    records, torn = read_records(path)
    assert [r.text for r in records] == ["a red circle"] and torn == 0


def test_densify_stats_refuses_a_line_giving_a_key_twice(tmp_path):
    """``patchword densify stats`` read the file with plain ``json``: the second ``text`` was counted."""
    path = tmp_path / "dense.jsonl"
    path.write_text(f"{GOOD}\n{TWICE}\n")
    with pytest.raises(DataError, match=rf"^{path}:2: key 'text' appears twice in one JSON object"):
        read_texts(path)
    path.write_text(f"{GOOD}\n")
    assert read_texts(path).texts == ["a red circle"]
