"""An index build killed before its first manifest: the rerun of the same command builds the index.

Such a kill leaves ``--out`` holding an empty ``shards/`` and the manifest's temporary file (what the
reviewer found after a SIGKILL inside the first manifest write); every rerun used to refuse the directory
("exists and is not a search index"), although README says index build resumes where it stopped.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from patchword.cli.search import main_index
from patchword.errors import RunExistsError
from patchword.search.index import build_index
from patchword.search.manifest import MANIFEST_FILE, Manifest
from patchword.search.shards import SHARDS_DIR
from patchword.search.store import SearchIndex

pytestmark = pytest.mark.usefixtures("one_thread")


def _folder(env, dest: Path, count: int = 3) -> Path:
    dest.mkdir(parents=True)
    for path in sorted(env.export.files["images"].iterdir())[:count]:
        shutil.copy2(path, dest / path.name)
    return dest


def _killed_first_manifest(out: Path) -> None:
    """What a build killed inside its first manifest write leaves: ``--out``, an empty ``shards/``, and the
    manifest's half-written temporary file (``atomic_write``'s name for it)."""
    (out / SHARDS_DIR).mkdir(parents=True)
    (out / f".{MANIFEST_FILE}.k3x_9q2a.tmp").write_text('{"format": 1, "state": "buil')


def test_a_build_killed_before_its_first_manifest_is_rerun(env, tmp_path, capsys):
    folder = _folder(env, tmp_path / "imgs")
    out = tmp_path / "idx1"
    _killed_first_manifest(out)
    args = ["build", str(env.run_dir), "--images", str(folder), "--out", str(out), "--batch-size", "2"]
    assert main_index(args) == 0, capsys.readouterr().err
    assert "3 images (3 encoded, 0 kept, 0 removed)" in capsys.readouterr().out
    assert Manifest.read(out).state == "complete" and len(SearchIndex.open(out)) == 3
    assert not list(out.glob(".*.tmp"))  # the killed write's temporary file is gone


def test_an_empty_shards_folder_alone_is_a_failed_start_too(env, tmp_path):
    """Killed between creating ``shards/`` and starting the manifest (or an --out made empty by the user)."""
    folder = _folder(env, tmp_path / "imgs")
    out = tmp_path / "idx"
    (out / SHARDS_DIR).mkdir(parents=True)
    report = build_index(env.run, folder, out, batch_size=2)
    assert (report.resumed, report.added) == (False, 3)


@pytest.mark.parametrize(
    "leftover",
    [
        "a user's file",
        "a file in shards/",
        "a temporary file of another name",
    ],
)
def test_a_directory_holding_anything_else_is_still_refused(env, tmp_path, leftover):
    folder = _folder(env, tmp_path / "imgs")
    out = tmp_path / "idx"
    _killed_first_manifest(out)
    extra = {
        "a user's file": out / "notes.txt",
        "a file in shards/": out / SHARDS_DIR / "0.global.npy",
        "a temporary file of another name": out / ".config.json.abcd1234.tmp",
    }[leftover]
    extra.write_text("not the build's")
    before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    with pytest.raises(RunExistsError, match="exists and is not a search index"):
        build_index(env.run, folder, out, batch_size=2)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == before  # nothing touched
