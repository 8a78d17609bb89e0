"""The Qdrant backend's record (``qdrant.json``) and its reads: an index changed since its upload is refused,
an embedded store is found from any directory, and concurrent queries never read each other's vectors.
Embedded Qdrant (a local directory) runs in-process, as in test_codecs.py."""

from __future__ import annotations

import json
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from patchword.cli import main
from patchword.errors import DataError, MissingFileError
from patchword.search.query import Searcher
from patchword.search.store import SearchIndex
from search_support import caption_queries

pytestmark = pytest.mark.usefixtures("one_thread")

qdrant = pytest.importorskip("patchword.search.qdrant")
pytest.importorskip("qdrant_client")


def _uploaded_copy(env, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the shared index uploaded to an embedded store: (index dir, store dir)."""
    shutil.copytree(env.index_dir, tmp_path / "idx")
    qdrant.upload_index(tmp_path / "idx", str(tmp_path / "store"), "idx")
    return tmp_path / "idx", tmp_path / "store"


def _hits(searcher: Searcher, caption: str, k: int = 5) -> list[tuple[int, str, float]]:
    return [(h.id, h.path, round(h.score, 4)) for h in searcher.search(caption, k=k).hits]


def test_an_index_updated_without_qdrant_is_refused_until_it_is_uploaded_again(env, tmp_path, capsys):
    """Point ids are index ids: after `index build --update` without --qdrant they would name other images
    (old code: wrong files, or a crash). The refusal is one line naming the index and the command."""
    images = tmp_path / "images"
    shutil.copytree(env.export.files["images"], images)
    out, store = tmp_path / "idx", tmp_path / "store"
    build = ["index", "build", str(env.run_dir), "--images", str(images), "--out", str(out)]
    dense = ["--dense", str(env.export.files["dense"])]
    assert main([*build, *dense, "--shard-size", "100", "--qdrant", str(store)]) == 0
    for name in sorted(p.name for p in images.iterdir())[:3]:
        (images / name).unlink()
    assert main([*build, "--update"]) == 0
    capsys.readouterr()
    with pytest.raises(DataError, match="changed since it was uploaded") as err:
        Searcher.open(out, qdrant=True)
    assert str(out) in str(err.value) and f"--update --qdrant {store}" in str(err.value)
    captions, _ = caption_queries(env)
    assert main(["search", str(out), captions[0], "--qdrant"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {out}: the index changed"), lines
    # the command the error names uploads the updated index; the searches are the local index's again
    assert main([*build, "--update", "--qdrant", str(store)]) == 0
    index = qdrant.QdrantIndex.open(out)
    remote, local = Searcher(index, env.run), Searcher(SearchIndex.open(out), env.run)
    assert len(remote) == 21
    for caption in captions[:5]:
        assert _hits(remote, caption) == _hits(local, caption), caption
    index.client.close()


def test_an_embedded_store_given_as_a_relative_path_is_found_from_any_directory(env, tmp_path, monkeypatch):
    """`--qdrant store` is recorded as an absolute path (old code: as typed, so a search from another
    directory opened, and created, an empty store there); a recorded store that is gone is an error, and
    nothing is created in its place."""
    shutil.copytree(env.index_dir, tmp_path / "idx")
    monkeypatch.chdir(tmp_path)
    record = qdrant.upload_index("idx", "store", "idx")
    assert record["location"] == str(tmp_path / "store")
    assert json.loads((tmp_path / "idx" / qdrant.QDRANT_FILE).read_text())["location"] == record["location"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    index = qdrant.QdrantIndex.open(tmp_path / "idx")
    local = Searcher(SearchIndex.open(tmp_path / "idx"), env.run)
    captions, _ = caption_queries(env)
    assert _hits(Searcher(index, env.run), captions[0]) == _hits(local, captions[0])
    index.client.close()
    assert list(elsewhere.iterdir()) == []
    (tmp_path / "store").rename(tmp_path / "moved")
    with pytest.raises(MissingFileError, match="store .* does not exist") as err:
        qdrant.QdrantIndex.open(tmp_path / "idx")
    assert str(tmp_path / "store") in str(err.value) and "--qdrant" in str(err.value)
    assert not (tmp_path / "store").exists() and list(elsewhere.iterdir()) == []


def test_a_querys_shortlisted_vectors_survive_other_threads_queries(env, tmp_path):
    """The vectors Qdrant returns with a shortlist belong to that query: another thread's shortlist, even
    one landing while this query reads its vectors, never replaces them (old code: one shared cache,
    replaced under the reader: KeyError, 2 of 120 searches under `serve --workers 2`)."""
    index_dir, _ = _uploaded_copy(env, tmp_path)
    index, local = qdrant.QdrantIndex.open(index_dir), SearchIndex.open(index_dir)
    searcher = Searcher(index, env.run)
    captions, _ = caption_queries(env)
    query = searcher.encode_query(captions[0]).global_embedding
    _, mine = index.shortlist(query, 5)
    _, theirs = index.shortlist(-query, 5)  # the 5 least similar images: none of mine
    assert not set(mine[0].tolist()) & set(theirs[0].tolist())

    def other_thread_shortlists() -> None:
        worker = threading.Thread(target=index.shortlist, args=(-query, 5))
        worker.start()
        worker.join()

    other_thread_shortlists()  # another request's shortlist, between mine and my re-ranking
    real_retrieve = index.client.retrieve

    def retrieve_racing(*args, **kwargs):  # and another one while points are being read
        yield from real_retrieve(*args, **kwargs)
        other_thread_shortlists()

    index.client.retrieve = retrieve_racing
    ids = mine[0]
    assert torch.allclose(index.image_tokens(ids), local.image_tokens(ids), atol=1e-6)
    got, want = index.dense_tokens(ids), local.dense_tokens(ids)
    assert torch.equal(got[1], want[1])
    for row, length in enumerate(got[1].tolist()):  # past its length a row is padding, read by no matcher
        assert torch.allclose(got[0][row, :length], want[0][row, :length], atol=1e-6)
    index.client.retrieve = real_retrieve

    # and whole searches from several threads answer as one at a time does
    wanted = {caption: _hits(searcher, caption) for caption in captions[:8]}
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda c: (c, _hits(searcher, c)), captions[:8] * 3))
    assert all(got == wanted[caption] for caption, got in answers)
    index.client.close()


def test_an_explanation_with_a_global_term_reads_its_image_from_qdrant(env, tmp_path):
    """Old code: ``Searcher.explain`` with ``alpha`` read the global embedding from the whole local matrix,
    which a Qdrant index does not have (NotImplementedError): the explanation of a TGDT hybrid plan failed."""
    index_dir, _ = _uploaded_copy(env, tmp_path)
    index = qdrant.QdrantIndex.open(index_dir)
    remote, local = (
        Searcher(index, env.run, alpha=0.7),
        Searcher(SearchIndex.open(index_dir), env.run, alpha=0.7),
    )
    captions, _ = caption_queries(env)
    hit = remote.search(captions[0], k=1).hits[0]
    explained = remote.explain(captions[0], hit.id)
    assert explained.score == pytest.approx(hit.score, abs=1e-4)
    assert explained.score == pytest.approx(local.explain(captions[0], hit.id).score, abs=1e-4)
    index.client.close()
