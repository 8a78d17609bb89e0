"""``index build --qdrant`` checks every flag and file before it opens the Qdrant store.

Old code: the store was opened (an embedded store's directory created, a server asked) before the build
checked its flags, so a command refused for ``--batch-size 0``, a missing ``--images`` folder or a missing
run left an empty store directory behind, and with a server out of reach reported the connection instead of
the flag."""

from __future__ import annotations

import socket

import pytest

from conftest import one_error_line
from patchword.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

qdrant = pytest.importorskip("patchword.search.qdrant")
pytest.importorskip("qdrant_client")


def _refusals(env, tmp_path) -> list[tuple[list[str], str]]:
    """(build arguments with one bad flag or file, the start of the error line naming it)."""
    run, images, out = str(env.run_dir), str(env.export.files["images"]), str(tmp_path / "idx")
    missing = tmp_path / "missing"
    return [
        (
            [run, "--images", images, "--out", out, "--batch-size", "0"],
            "error: --batch-size: must be at least 1",
        ),
        (
            [run, "--images", str(missing), "--out", out],
            f"error: --images: image folder not found: {missing}",
        ),
        ([str(tmp_path / "no_run"), "--images", images, "--out", out], "error: run directory "),
        ([run, "--images", images, "--out", out, "--checkpoint", "nope.pt"], "error: "),
    ]


def test_a_refused_flag_leaves_no_embedded_store_and_names_the_flag(env, tmp_path, capsys):
    store = tmp_path / "store"
    for args, expected in _refusals(env, tmp_path):
        capsys.readouterr()
        assert main(["index", "build", *args, "--qdrant", str(store)]) == 2, args
        line = one_error_line(capsys.readouterr().err)
        assert line.startswith(expected), (args, line)
        assert not store.exists(), args  # old code: the empty store directory, created first
        assert not (tmp_path / "idx").exists(), args
    assert "nope.pt" in line  # the missing checkpoint is named


def test_a_refused_flag_is_reported_before_a_server_out_of_reach(env, tmp_path, capsys):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    for args, expected in _refusals(env, tmp_path)[:3]:
        capsys.readouterr()
        assert main(["index", "build", *args, "--qdrant", url]) == 2, args
        line = one_error_line(capsys.readouterr().err)
        assert line.startswith(expected), (args, line)  # old code: "cannot use Qdrant collection ..."
    # every check passed: the server is what refuses (and nothing of the index was written)
    run, images, out = str(env.run_dir), str(env.export.files["images"]), tmp_path / "idx"
    assert main(["index", "build", run, "--images", images, "--out", str(out), "--qdrant", url]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(
        f"error: cannot use Qdrant collection 'idx' at {url}"
    )
    assert not out.exists()


def test_plan_build_writes_nothing_and_write_build_writes_the_plan(env, tmp_path):
    from patchword.search.index import plan_build, write_build  # new in this change: imported here

    out = tmp_path / "deep" / "idx"
    plan = plan_build(
        env.run, env.export.files["images"], out, dense=env.export.files["dense"], shard_size=10
    )
    assert not (tmp_path / "deep").exists() and plan.todo
    report = write_build(plan)
    assert report.num_images == report.added == len(plan.todo) and (out / "manifest.json").is_file()
