"""An upload to Qdrant stopped part-way, or a collection that lost points, is refused by search and serve
in one line naming the collection and the upload to rerun. Old code deleted and recreated the collection
before rewriting ``qdrant.json``: the old record's digest still matched, and searches silently answered from
the points uploaded so far."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import one_error_line
from patchword.cli import main
from patchword.errors import ConfigError, DataError
from patchword.search.query import Searcher
from search_support import caption_queries

pytestmark = pytest.mark.usefixtures("one_thread")

qdrant = pytest.importorskip("patchword.search.qdrant")
qdrant_client = pytest.importorskip("qdrant_client")


def _uploaded_copy(env, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the shared index uploaded to an embedded store: (index dir, store dir)."""
    shutil.copytree(env.index_dir, tmp_path / "idx")
    qdrant.upload_index(tmp_path / "idx", str(tmp_path / "store"), "idx", batch=5)
    return tmp_path / "idx", tmp_path / "store"


def test_an_upload_stopped_part_way_leaves_no_record_and_is_refused(env, tmp_path, monkeypatch, capsys):
    index_dir, store = _uploaded_copy(env, tmp_path)
    real, calls = qdrant_client.QdrantClient.upsert, []

    def stopped_after_one_batch(self, *args, **kwargs):
        if calls:
            raise KeyboardInterrupt
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(qdrant_client.QdrantClient, "upsert", stopped_after_one_batch)
    with pytest.raises(KeyboardInterrupt):
        qdrant.upload_index(index_dir, str(store), "idx", batch=5)
    monkeypatch.undo()
    assert not (index_dir / qdrant.QDRANT_FILE).exists()
    with pytest.raises(ConfigError, match="upload did not finish") as err:
        Searcher.open(index_dir, qdrant=True)
    assert f"--out {index_dir} --update --qdrant" in str(err.value)
    captions, _ = caption_queries(env)
    assert main(["search", str(index_dir), captions[0], "--qdrant"]) == 2
    assert "upload did not finish" in one_error_line(capsys.readouterr().err)

    # the upload the error names brings the collection back: every image is found again
    qdrant.upload_index(index_dir, str(store), "idx", batch=5)
    index = qdrant.QdrantIndex.open(index_dir)
    assert len(Searcher(index, env.run).search(captions[0], k=24).hits) == 24
    index.client.close()


def test_a_collection_holding_fewer_points_than_its_record_is_refused(env, tmp_path, capsys):
    index_dir, store = _uploaded_copy(env, tmp_path)
    client = qdrant.connect(str(store))
    client.delete("idx", points_selector=qdrant_client.models.PointIdsList(points=[0, 1]))
    client.close()
    with pytest.raises(DataError) as err:
        qdrant.QdrantIndex.open(index_dir)
    message = str(err.value)
    assert message.startswith(f"{index_dir}: Qdrant collection 'idx' holds 22 points, but the index ")
    assert f"--update --qdrant {store}" in message
    captions, _ = caption_queries(env)
    assert main(["search", str(index_dir), captions[0], "--qdrant"]) == 2
    assert "holds 22 points" in one_error_line(capsys.readouterr().err)
