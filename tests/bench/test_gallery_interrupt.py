"""``patchword bench gallery`` stopped by SIGTERM / SIGINT: the temporary matrix folder is removed, the
finished shapes' rows go to ``--json`` marked as cut short (the shape stopped named), and the command ends
with one ``interrupted:`` line, exit 128 + signal. On 2e0a019 SIGTERM killed the process on the spot (the
``patchword-gallery-*`` folder and its ``.partial`` matrix left behind, nothing printed, exit 143), and either
signal lost the rows of the shapes already scored (the JSON was written at the end only).

Also: ``--keep`` refuses to overwrite a ``.partial`` matrix left by such a run without ``--force``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

from conftest import one_error_line
from patchword.bench.gallery import partial_path
from patchword.cli.bench import main

# 8 x 40 blocks: the quick shape (20 x 100) is 9 of them, the 1k shape 15,625: it is still running when
# the signal comes. No time budget: a shape predicted to end past it would stop early (extrapolated).
ARGV = ["gallery", "--quick", "--shapes", "quick,1k", "--max-seconds", "100000", "--threads", "1"]


def test_sigint_keeps_the_finished_rows_and_removes_the_temporary_folder(tmp_path, monkeypatch, capsys):
    import patchword.bench.gallery as gallery

    real, calls = gallery._score_block, []

    def interrupted_in_the_second_shape(job, images, captions, out):
        calls.append(out.shape)
        if len(calls) == 1 + 9 + 1:  # the warm-up, the quick shape's 9 blocks, the 1k shape's first
            os.kill(os.getpid(), signal.SIGINT)  # (the handler raises here, in the main thread)
        real(job, images, captions, out)

    monkeypatch.setattr(gallery, "_score_block", interrupted_in_the_second_shape)
    work = tmp_path / "work"
    work.mkdir()
    out = tmp_path / "gallery.json"
    assert main([*ARGV, "--workdir", str(work), "--json", str(out)]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"interrupted: SIGINT received while scoring shape 1k: 1 of 2 shapes finished (quick); their rows "
        f"are in {out}, marked interrupted"
    )
    assert not [line for line in err if line.startswith(("error", "Traceback"))]
    result = json.loads(out.read_text())
    assert [row["shape"] for row in result["rows"]] == ["quick"] and not result["rows"][0]["extrapolated"]
    assert result["interrupted"] == {"signal": "SIGINT", "shape": "1k", "shapes_finished": ["quick"]}
    assert list(work.iterdir()) == []  # the temporary folder and its matrices are gone
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handlers are given back
    # and the report says the file holds the finished shapes only
    from patchword.experiments.gallery_table import gallery_rows

    caption, _, rows = gallery_rows(out)
    assert len(rows) == 1 and caption.endswith(
        "; INTERRUPTED by SIGINT in shape 1k: the finished shapes only"
    )


def test_sigterm_in_a_real_process_cleans_up_and_says_so(tmp_path):
    """One fresh process: SIGTERM once the second shape is logged as begun. (Sent on the line of the
    first shape's end, it could land while that line was written: old code's logging took the stop for a
    failed write and went on, deaf to another SIGTERM; tests/train/test_stop_signal_not_swallowed.py.)"""
    temp = tmp_path / "tmp"
    temp.mkdir()
    out = tmp_path / "gallery.json"
    env = {**os.environ, "TMPDIR": str(temp)}
    cmd = [sys.executable, "-m", "patchword.bench", *ARGV, "--json", str(out)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    watchdog = threading.Timer(300, proc.kill)  # a test that hangs fails instead
    watchdog.start()
    try:
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if line.startswith("1k: scoring 1000 images x 5000 captions"):
                proc.send_signal(signal.SIGTERM)
                break
        rest = proc.communicate()[1]
    finally:
        watchdog.cancel()
    stderr = "".join(lines) + rest
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert stderr.strip().splitlines()[-1] == (
        f"interrupted: SIGTERM received while scoring shape 1k: 1 of 2 shapes finished (quick); their rows "
        f"are in {out}, marked interrupted"
    )
    assert "Traceback" not in stderr
    assert list(temp.iterdir()) == []  # no patchword-gallery-* folder, no .partial matrix
    result = json.loads(out.read_text())
    assert [row["shape"] for row in result["rows"]] == ["quick"]
    assert result["interrupted"] == {"signal": "SIGTERM", "shape": "1k", "shapes_finished": ["quick"]}


def test_keep_refuses_to_overwrite_a_partial_matrix_without_force(tmp_path, capsys, monkeypatch):
    import patchword.bench.gallery as gallery

    def no_work(*args, **kwargs):
        raise AssertionError("scoring started")

    monkeypatch.setattr(gallery, "build_bench_matcher", no_work)
    partial = partial_path(tmp_path, "quick")
    partial.write_bytes(b"an earlier run's rows")
    assert main(["gallery", "--quick", "--keep", "--workdir", str(tmp_path)]) == 2
    assert one_error_line(capsys.readouterr().err) == f"error: {partial} exists; pass --force to overwrite it"
    assert partial.read_bytes() == b"an earlier run's rows"


def test_a_signal_after_a_shapes_row_and_before_the_next_shape_says_so(tmp_path, capsys):
    """Old code said "received while scoring shape quick: 1 of 2 shapes finished (quick)" of a signal that
    came as the quick shape logged its last line."""
    import logging

    import patchword.bench.gallery as gallery

    class SignalOnTheLastLine(logging.Handler):
        def emit(self, record):
            if record.getMessage().startswith("quick: 2000 of 2000 pairs scored"):
                os.kill(os.getpid(), signal.SIGTERM)  # (the handler raises here, in the main thread)

    handler = SignalOnTheLastLine()
    logging.getLogger(gallery.__name__).addHandler(handler)
    out = tmp_path / "gallery.json"
    try:
        assert main([*ARGV, "--json", str(out)]) == 128 + signal.SIGTERM
    finally:
        logging.getLogger(gallery.__name__).removeHandler(handler)
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"interrupted: SIGTERM received after shape quick: 1 of 2 shapes finished (quick); their rows are "
        f"in {out}, marked interrupted"
    )
    result = json.loads(out.read_text())
    assert result["interrupted"] == {"signal": "SIGTERM", "shape": None, "shapes_finished": ["quick"]}
