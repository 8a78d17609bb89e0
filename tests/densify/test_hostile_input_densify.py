"""Hostile inputs to ``patchword densify``: a merge whose --out is a file of a shard it reads, a --bert-vocab
that does not load, and a rerun on a finished file with another explicit --precision or --model-id (or an
empty --model-id) are refused in one line naming the flag (and the file), nothing written."""

from __future__ import annotations

import pytest

from conftest import one_error_line
from densify_support import TOKENS, write_images
from patchword.cli import main
from patchword.densify.lock import lock_path
from patchword.densify.store import sidecar_path

pytestmark = pytest.mark.usefixtures("one_thread")

NAMES = [f"img{i}.png" for i in range(4)]


def _args(images, out, *extra: str) -> list[str]:
    run = ["--model", "tiny-random", "--max-new-tokens", str(TOKENS), "--device", "cpu", "--no-progress"]
    return ["densify", "--images", str(images), "--out", str(out), *run, *extra]


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    write_images(root, NAMES)
    return root


@pytest.fixture(scope="module")
def shards(images, tmp_path_factory):
    """Two finished shards (batches of 2) of the four images."""
    folder = tmp_path_factory.mktemp("shards")
    paths = [folder / f"p{i}.jsonl" for i in range(2)]
    for i, path in enumerate(paths):
        assert main(_args(images, path, "--batch-size", "2", "--shard", f"{i}/2")) == 0
    return paths


@pytest.fixture(scope="module")
def finished(images, tmp_path_factory):
    """A finished single-process output (fp32, the model's own id)."""
    out = tmp_path_factory.mktemp("done") / "dense.jsonl"
    assert main(_args(images, out, "--precision", "fp32")) == 0
    return out


def _files(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize(
    "target, said",
    [
        (sidecar_path, "is the sidecar of shard"),
        (lock_path, "is the lock of shard"),
        (lambda p: p, "is one of the shards being merged"),
    ],
    ids=["sidecar", "lock", "shard"],
)
def test_merge_refuses_an_out_that_is_a_file_of_a_shard(shards, capsys, target, said):
    """Old code: `--out p0.jsonl.densify.json --force` replaced shard p0's sidecar with the merge's."""
    before = _files(shards[0].parent)
    out = target(shards[0])
    argv = ["densify", "merge", str(shards[0]), str(shards[1]), "--out", str(out), "--force"]
    assert main(argv) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: --out: {out}") and f"{said}" in line and "choose another --out" in line
    assert _files(shards[0].parent) == before


def test_merge_refuses_an_out_whose_sidecar_is_a_shard(shards, capsys, tmp_path):
    out = tmp_path / "m.jsonl"
    shard = tmp_path / "m.jsonl.densify.json"  # a shard named like --out's sidecar
    shard.write_bytes(shards[0].read_bytes())
    sidecar_path(shard).write_bytes(sidecar_path(shards[0]).read_bytes())
    assert main(["densify", "merge", str(shard), str(shards[1]), "--out", str(out)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: --out: {out}'s sidecar {shard} is one of the shards being merged")
    assert not out.exists()


def test_stats_names_the_bert_vocab_flag_and_file(finished, tmp_path, capsys):
    """Old code: `error: vocabulary lacks the special token(s) ...`, naming neither flag nor file."""
    bad = tmp_path / "vocab.txt"
    bad.write_text("[PAD]\n[UNK]\n")
    empty_dir = tmp_path / "nothing"
    empty_dir.mkdir()
    for vocab, said in [
        (bad, f"{bad}: not a BERT vocabulary that loads: vocabulary lacks the special token(s)"),
        (empty_dir, f"{empty_dir}: not a BERT vocabulary that loads"),
        (tmp_path / "missing", f"{tmp_path / 'missing'} does not exist"),
    ]:
        assert main(["densify", "stats", str(finished), "--bert-vocab", str(vocab)]) == 2
        line = one_error_line(capsys.readouterr().err)
        assert line.startswith(f"error: --bert-vocab: {said}"), line


@pytest.mark.parametrize(
    "extra, said",
    [
        (["--precision", "bf16"], "precision differs ('fp32' before, 'bf16' now)"),
        (["--model-id", "other"], "model_id differs ('tiny-random-llava' before, 'other' now)"),
    ],
)
def test_a_finished_file_refuses_another_explicit_precision_or_model_id(
    images, finished, capsys, extra, said
):
    """Old code: "nothing left to generate", exit 0, the file's text made with other settings."""
    before = finished.read_bytes()
    assert main(_args(images, finished, *extra)) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == (
        f"error: {finished} was started with other settings: {said}; rerun with the first run's settings, "
        "or choose another --out"
    )
    assert finished.read_bytes() == before
    # its own values (and auto) are the finished run's
    assert main(_args(images, finished, "--precision", "fp32", "--model-id", "tiny-random-llava")) == 0
    assert "nothing left to generate" in capsys.readouterr().err


def test_an_empty_model_id_is_refused(images, tmp_path, capsys):
    """Old code replaced it with the default id without a word."""
    out = tmp_path / "dense.jsonl"
    assert main(_args(images, out, "--model-id", "")) == 2
    assert one_error_line(capsys.readouterr().err) == (
        "error: --model-id: is empty: give the name each line records, or leave it out"
    )
    assert list(tmp_path.iterdir()) == []
