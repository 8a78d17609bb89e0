"""The command a Qdrant refusal tells the user to run is one they can paste: the run and image folder the
index records, every path shell-quoted.

Old code: `... --out /tmp/índex/my photos? --update --qdrant ...` (a space and a glob character unquoted)
with `RUN_DIR` and `--images DIR` left as placeholders, though the manifest records both."""

from __future__ import annotations

import json
import shlex
import shutil

import pytest

from patchword.errors import ConfigError, DataError

pytestmark = pytest.mark.usefixtures("one_thread")

qdrant = pytest.importorskip("patchword.search.qdrant")
pytest.importorskip("qdrant_client")


def _command(message: str) -> list[str]:
    """The words of the one command quoted in ``message`` (between backquotes)."""
    return shlex.split(message.split("`")[1])


def test_the_upload_command_is_quoted_and_names_the_run_and_images(env, tmp_path):
    out, store = tmp_path / "índex" / "my photos?", tmp_path / "a store"
    shutil.copytree(env.index_dir, out)
    qdrant.upload_index(out, str(store), "my photos?")
    manifest = json.loads((out / "manifest.json").read_text())
    want = ["patchword", "index", "build", manifest["model"]["run_dir"], "--images", manifest["images_root"]]
    want += ["--out", str(out), "--update", "--qdrant", str(store)]

    client = qdrant.connect(str(store))
    client.delete_collection("my photos?")
    client.close()
    with pytest.raises(DataError, match="has no collection") as err:
        qdrant.QdrantIndex.open(out)
    assert _command(str(err.value)) == want

    (out / qdrant.QDRANT_FILE).unlink()
    with pytest.raises(ConfigError, match="was not uploaded to Qdrant") as err:
        qdrant.QdrantIndex.open(out)
    assert _command(str(err.value)) == [*want[:-1], "PATH_OR_URL"]  # where to: not recorded


def test_a_collection_of_another_name_is_named_in_the_command(env, tmp_path):
    out, store = tmp_path / "idx", tmp_path / "store"
    shutil.copytree(env.index_dir, out)
    qdrant.upload_index(out, str(store), "my photos")
    client = qdrant.connect(str(store))
    client.delete_collection("my photos")
    client.close()
    with pytest.raises(DataError, match="has no collection") as err:
        qdrant.QdrantIndex.open(out)
    assert _command(str(err.value))[-2:] == ["--collection", "my photos"]
