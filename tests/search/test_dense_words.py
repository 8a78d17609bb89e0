"""A dense caption the run's tokenizer finds no word in is refused before ``index build`` writes anything.
Old code tokenised the captions shard by shard: one in the last shard stopped the build after the earlier
shards were written (a half-built index left at --out, an update's progress in ``manifest.pending.json``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import one_error_line
from patchword.cli.search import main_index
from patchword.data.tokenizers import BertCaptionTokenizer, NoWordsError, WordVocab
from patchword.errors import DataError
from patchword.search.encode import check_dense_words, read_dense_file, word_split
from patchword.search.index import build_index

pytestmark = pytest.mark.usefixtures("one_thread")

WORDLESS = "?! ..."  # punctuation only: the alnum word split finds no word in it


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _with_last_caption(env, dense: Path, text: str, keep: int | None = None) -> tuple[Path, list[str], int]:
    """A folder of the exported images (the first ``keep``, or all) at ``dense``'s side, and ``dense``: the
    exported dense captions with the caption of the last image (in path order, the last one encoded) set to
    ``text``; -> the folder, the image names and that caption's line number."""
    names = sorted(p.name for p in env.export.files["images"].iterdir())
    folder = dense.parent / "imgs"
    folder.mkdir(exist_ok=True)
    for name in names[:keep]:
        shutil.copy2(env.export.files["images"] / name, folder / name)
    lines = env.export.files["dense"].read_text().splitlines()
    records = [json.loads(line) for line in lines]
    at = next(i for i, r in enumerate(records) if r["metadata"]["file"] == names[-1])
    records[at]["text"] = text
    dense.write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder, names, at + 1


def _argv(env, folder: Path, out: Path, dense: Path, *more: str) -> list[str]:
    args = ["build", str(env.run_dir), "--images", str(folder), "--out", str(out), "--dense", str(dense)]
    return [*args, "--shard-size", "4", "--batch-size", "4", *more]


def test_a_last_caption_without_words_refuses_the_build_before_any_shard(env, tmp_path, capsys):
    dense = tmp_path / "dense.jsonl"
    folder, names, line = _with_last_caption(env, dense, WORDLESS)
    out = tmp_path / "idx"
    assert main_index(_argv(env, folder, out, dense)) == 2  # 24 images: six shards
    assert one_error_line(capsys.readouterr().err) == (
        f"error: {dense}:{line}: the dense caption of image {names[-1]} {WORDLESS!r} has no words: the alnum "
        "word split finds none; reword or remove it"
    )
    assert not out.exists()


def test_an_update_with_a_new_caption_without_words_leaves_the_index_as_it_was(env, tmp_path, capsys):
    dense = tmp_path / "dense.jsonl"
    folder, names, line = _with_last_caption(env, dense, "a red circle", keep=12)
    out = tmp_path / "idx"
    build_index(env.run, folder, out, dense=dense, shard_size=4, batch_size=4)
    before = _tree(out)
    _with_last_caption(env, dense, WORDLESS)  # the other 12 images come, the last one's caption wordless
    assert main_index(_argv(env, folder, out, dense, "--update")) == 2
    assert one_error_line(capsys.readouterr().err).startswith(
        f"error: {dense}:{line}: the dense caption of image {names[-1]} {WORDLESS!r} has no words"
    )
    assert _tree(out) == before


@pytest.fixture(scope="module")
def bert():
    pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "red", "circle", "?", "!", "."]
    return BertCaptionTokenizer({w: i for i, w in enumerate(pieces)})


@pytest.mark.parametrize(
    ("text", "word_has", "bert_has"),
    [
        ("a red circle", True, True),
        (WORDLESS, False, True),  # BERT's basic split keeps punctuation: [CLS] ? ! . . . [SEP]
        ("\ufffd \x07", False, False),  # replacement and control characters: nothing for either
        ("zebra", True, True),  # an unknown word is a word ([UNK] / <unk>)
    ],
)
def test_the_word_split_decides_no_words_as_the_tokenizer_does(bert, text, word_has, bert_has):
    vocab = WordVocab(["a", "red", "circle"])
    for tokenizer, has in ((vocab, word_has), (bert, bert_has)):
        assert bool(word_split(tokenizer)(text)) == has
        if has:
            tokenizer.batch_encode([text])
        else:
            with pytest.raises(NoWordsError):
                tokenizer.batch_encode([text])


def test_the_check_names_the_line_in_the_tokenizers_words(bert, tmp_path):
    dense = tmp_path / "dense.jsonl"
    texts = ["a red circle", "?!", "\ufffd"]
    records = [{"text": t, "metadata": {"file": f"{i}.png"}} for i, t in enumerate(texts)]
    dense.write_text("".join(json.dumps(r) + "\n" for r in records))
    captions, files = read_dense_file(dense), ["0.png", "1.png", "2.png"]
    with pytest.raises(DataError) as err:
        check_dense_words(WordVocab(["a", "red", "circle"]), captions, files)
    assert str(err.value).startswith(
        f"{dense}:2: the dense caption of image 1.png '?!' has no words: the alnum"
    )
    with pytest.raises(DataError) as err:
        check_dense_words(bert, captions, files)
    assert str(err.value) == (
        f"{dense}:3: the dense caption of image 2.png '\ufffd' has no tokens after BERT's basic "
        "tokenisation; reword or remove it"
    )
    check_dense_words(bert, captions, files[:2])  # punctuation is BERT's tokens
