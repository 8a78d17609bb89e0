"""What ``index build`` says: Ctrl-C before anything was written does not ask to "rerun the same command to
resume" (nothing exists to resume); a truncated image without a dense line is listed as the damaged file it
is, not as uncaptioned (which hid the damage); a pq codebook trained on fewer tokens than FAISS advises is
said in one line of the report (and kept for every later --update)."""

from __future__ import annotations

import shutil

import pytest

from patchword.cli.search import main_index
from patchword.eval.two_stage import faiss_available
from patchword.search import index as index_module
from patchword.search.index import build_index
from patchword.search.manifest import Manifest
from search_support import killed_after_shards

pytestmark = pytest.mark.usefixtures("one_thread")


def _interrupted(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("interrupted: ")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def test_ctrl_c_before_anything_was_written_says_so(env, tmp_path, monkeypatch, capsys):
    images = env.export.files["images"]
    out = tmp_path / "new"
    argv = ["build", str(env.run_dir), "--images", str(images), "--out", str(out), "--shard-size", "8"]

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:  # stopped while the run loads, the folder is scanned...
        patch.setattr(index_module, "plan_build", stopped)
        assert main_index(argv) == 130
        line = _interrupted(capsys.readouterr().err)
        assert (
            line == f"interrupted: SIGINT (Ctrl-C) before anything was written to {out}" and not out.exists()
        )
        shutil.copytree(env.index_dir, tmp_path / "idx")  # an update of a complete index
        update = [
            "build",
            str(env.run_dir),
            "--images",
            str(images),
            "--out",
            str(tmp_path / "idx"),
            "--update",
        ]
        assert main_index(update) == 130
        line = _interrupted(capsys.readouterr().err)
        assert line.endswith(f"before anything was written to {tmp_path / 'idx'}: the index is as it was")

    with killed_after_shards(monkeypatch, 1):  # a shard written: the same command resumes it
        assert main_index(argv) == 130
    assert _interrupted(capsys.readouterr().err).endswith(f"rerun the same command to resume {out}")
    with monkeypatch.context() as patch:  # stopped again before writing: still a build to resume
        patch.setattr(index_module, "plan_build", stopped)
        assert main_index(argv) == 130
    assert _interrupted(capsys.readouterr().err).endswith(f"rerun the same command to resume {out}")


def test_a_damaged_image_without_a_dense_caption_is_listed_as_damaged(env, tmp_path):
    folder = tmp_path / "imgs"
    shutil.copytree(env.export.files["images"], folder)
    data = (folder / sorted(p.name for p in folder.iterdir())[0]).read_bytes()
    (folder / "zz-cut.png").write_bytes(data[: int(len(data) * 0.6)])  # no line in the dense file either
    shutil.copy2(folder / sorted(p.name for p in folder.iterdir())[1], folder / "zz-sound.png")
    report = build_index(env.run, folder, tmp_path / "idx", dense=env.export.files["dense"], shard_size=10)
    reasons = {s.path: s.reason for s in report.skipped}
    assert reasons["zz-cut.png"].startswith("cannot decode: ") and "truncated" in reasons["zz-cut.png"]
    assert reasons["zz-sound.png"].startswith("no dense caption in ")
    assert "  zz-cut.png: cannot decode: " in report.summary()
    cut = next(s for s in Manifest.read(tmp_path / "idx").skipped if s.path == "zz-cut.png")
    assert cut.size == len(data[: int(len(data) * 0.6)])  # not tried again until it changes


@pytest.mark.skipif(not faiss_available(), reason="faiss is an optional extra (pip install faiss-cpu)")
def test_a_pq_codebook_trained_on_few_tokens_is_said_once(env, tmp_path):
    images, dense = env.export.files["images"], env.export.files["dense"]
    report = build_index(env.run, images, tmp_path / "idx", dense=dense, dtype="pq", shard_size=10)
    tokens, shown = report.pq_sample
    assert shown == 10 and 256 <= tokens < 9984
    lines = [line for line in report.summary().splitlines() if line.startswith("the pq codebook")]
    assert lines == [
        f"the pq codebook was trained on the {tokens} tokens of the first shard's 10 images, fewer than the "
        "9984 FAISS advises: it is coarse, and every --update keeps it (build the index anew from more "
        "images for a finer one)"
    ]
    again = build_index(env.run, images, tmp_path / "idx", dense=dense, update=True)
    assert again.pq_sample is None and "the pq codebook" not in again.summary()  # trained once, said once
