"""Stop a real ``patchword`` command at a chosen point, so that a test can kill it there without a race.

Killing a running command "as soon as" a file shows some progress is a race: on a fast or idle machine the
command gets past the point, or finishes, before the test looks, and the verdict then depends on the
machine's speed. Here the command runs under this wrapper instead, which patches one method so that right
after the chosen point it writes a marker file and then waits to be killed; :func:`run_until_stalled` waits
for the marker and kills it. Where the command stops is fixed by the seed and the step count alone.

    python tests/stall_support.py MARKER POINT ARG...    # ``patchword ARG...``, stalled at POINT (JSON)

Points (``{"at": ..., ...}``; ``marker`` receives a JSON record of where the command stopped):

* ``train_log``, ``step`` (and ``run``, a run directory name): after :class:`~patchword.train.trainer.Trainer`
  logged the train record of step ``step`` or later while a ``last.pt`` exists (its step is in the marker),
  in run directory ``run`` when given: the checkpoint is behind the logged metrics, as after a kill between
  two checkpoints.
* ``hash_log``, ``epoch``: after the hashing trainer appended the record of epoch ``epoch`` or later (its
  ``last.pt`` not yet written).
* ``hash_save``, ``epoch``: after the hashing trainer wrote ``last.pt`` at epoch ``epoch`` or later.
* ``index_manifest``, ``entries``: after ``index build`` wrote a manifest with ``entries`` images or more.
* ``score_blocks``, ``after``, ``report``: Ctrl-C during scoring (:func:`_score_blocks`).

The stalled process also ends by itself when the process that started it is gone (a test that crashed), so
that no stalled command outlives its test.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

#: How long :func:`run_until_stalled` waits for the stall: a hang guard, far beyond what the tiny commands
#: of the tests need on any machine; it fires only when the command never gets there.
HANG_GUARD_S = 900.0

WRAPPER = Path(__file__).resolve()


def signal_when_announced(
    argv: list[str], announced: str | Callable[[str], bool], signum: int, env: dict | None = None
) -> tuple[int, str]:
    """Run ``argv``, wait for its first stdout line, where the child waits for the signal (a point fixed
    by the code, not by the machine's speed), then send it ``signum``: ``(exit code, stderr)``.
    ``announced``: that line, or a function of it that returns once the child is ready for the signal
    (False: not the line expected). The child is killed if it still runs when this returns or fails."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        if not select.select([proc.stdout], [], [], HANG_GUARD_S)[0]:  # a hang guard, not a verdict
            raise AssertionError(f"no line on stdout within {HANG_GUARD_S:g} s: {argv}")
        line = proc.stdout.readline()  # the child is where it waits
        ready = line == announced if isinstance(announced, str) else announced(line)
        assert ready, (line, proc.communicate(timeout=HANG_GUARD_S))
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err


def stalled_command(marker: Path, point: dict, argv: list[str]) -> list[str]:
    """The command line of ``patchword ARGV`` stalled at ``point`` (see the module docstring)."""
    return [sys.executable, str(WRAPPER), str(marker), json.dumps(point), *argv]


def wait_for_marker(proc: subprocess.Popen, marker: Path, log: Path, timeout: float = HANG_GUARD_S) -> dict:
    """The marker's record once ``proc`` wrote it; fails the test if ``proc`` ends first (it never got to
    its stall point: ``log`` holds its output) or after ``timeout`` s (a hang)."""
    import pytest

    deadline = time.monotonic() + timeout
    while not marker.is_file():
        if proc.poll() is not None:
            pytest.fail(f"the command ended (exit {proc.returncode}) before its stall point: {_tail(log)}")
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            pytest.fail(
                f"hang guard: the command did not reach its stall point in {timeout:g} s: {_tail(log)}"
            )
        time.sleep(0.01)
    return json.loads(marker.read_text())


def run_until_stalled(cmd: list[str], marker: Path, log: Path, env: dict | None = None) -> dict:
    """Run ``cmd`` (a :func:`stalled_command`, output to ``log``) until it stalls, then SIGKILL it; -> the
    marker's record. Fails the test if it ends before its stall point, or hangs."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        where = wait_for_marker(proc, marker, log)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, _tail(log))
    return where


def _tail(log: Path, size: int = 3000) -> str:
    return log.read_text(errors="replace")[-size:] if log.is_file() else "(no output)"


# ------------------------------------------------------------------------------------------ in the command


def _stall(marker: Path, record: dict) -> None:
    """Write ``record`` to ``marker`` (atomically: the test reads whole records) and wait to be killed."""
    tmp = marker.with_name(marker.name + ".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, marker)
    parent = os.getppid()
    while os.getppid() == parent:  # the test kills us; if it is gone, end instead of waiting forever
        time.sleep(0.2)
    os._exit(70)


def _train_log(marker: Path, point: dict) -> None:
    from patchword.checkpoint import load_checkpoint
    from patchword.train.trainer import Trainer

    original = Trainer._log

    def log_then_stall(self, record):
        original(self, record)
        last = self.run_dir / "last.pt"
        if (
            record.get("split") == "train"
            and record["step"] >= point["step"]
            and point.get("run") in (None, self.run_dir.name)
            and last.is_file()
        ):
            _stall(marker, {"step": record["step"], "checkpoint_step": load_checkpoint(last)["step"]})

    Trainer._log = log_then_stall


def _hash_log(marker: Path, point: dict) -> None:
    from patchword.hashing import trainer

    original = trainer.append_metrics

    def append_then_stall(run_dir, record):
        original(run_dir, record)
        if record.get("split") == "train" and record["epoch"] >= point["epoch"]:
            _stall(marker, {"epoch": record["epoch"]})

    trainer.append_metrics = append_then_stall


def _hash_save(marker: Path, point: dict) -> None:
    from patchword.hashing import trainer

    original = trainer.atomic_save

    def save_then_stall(state, path, *args, **kwargs):
        original(state, path, *args, **kwargs)
        if Path(path).name == "last.pt" and state["epoch"] >= point["epoch"]:
            _stall(marker, {"epoch": state["epoch"]})

    trainer.atomic_save = save_then_stall


def _index_manifest(marker: Path, point: dict) -> None:
    from patchword.search.manifest import Manifest

    original = Manifest.write

    def write_then_stall(self, index_dir, *args, **kwargs):
        original(self, index_dir, *args, **kwargs)
        if len(self.entries) >= point["entries"]:
            _stall(marker, {"entries": len(self.entries), "state": self.state})

    Manifest.write = write_then_stall


def _score_blocks(marker: Path, point: dict) -> None:
    """Ctrl-C while the scoring engine's worker threads hold blocks.

    In the first multi-threaded scoring job, every block from the ``after``-th on waits once taken; when
    every worker holds one, the marker is written and the test sends SIGINT. The waiting blocks are
    released only when the interrupted job leaves its thread pool (``ThreadPoolExecutor.shutdown``), that
    is after it has had every chance to stop handing out blocks: ``point["report"]`` then records how many
    blocks were started after the signal (none, when the job stops taking blocks) and whether the job had
    blocks left. Deterministic: the interrupt always comes with the same blocks done and in hand.
    """
    from concurrent.futures import ThreadPoolExecutor

    from patchword.eval.engine import seps, workers

    lock, release = threading.Lock(), threading.Event()
    state = {"probed": False, "workers": 0, "started": 0, "held": 0, "after_signal": 0, "signalled": False}
    state["exhausted"] = False

    def on_sigint(signum, frame):
        state["signalled"] = True
        state["started_at_signal"] = state["started"]
        signal.default_int_handler(signum, frame)  # KeyboardInterrupt, as without the wrapper

    signal.signal(signal.SIGINT, on_sigint)

    original_shutdown = ThreadPoolExecutor.shutdown

    def shutdown(self, *args, **kwargs):
        if state["signalled"]:
            release.set()
        return original_shutdown(self, *args, **kwargs)

    ThreadPoolExecutor.shutdown = shutdown
    original = workers.in_workers

    def tracked(items):
        yield from items
        state["exhausted"] = True

    def probed_in_workers(count, items, fn):
        items = list(items)  # a range of block starts
        if state["probed"] or count < 2 or len(items) <= point["after"] + count:
            return original(count, items, fn)  # not a job that still has blocks when every worker holds one
        state["probed"], state["workers"], state["blocks"] = True, count, len(items)

        def block(item):
            with lock:
                index = state["started"]
                state["started"] += 1
                state["after_signal"] += state["signalled"]
                held = index >= point["after"]
                state["held"] += held
                if held and state["held"] == count:
                    tmp = marker.with_name(marker.name + ".tmp")
                    tmp.write_text(json.dumps({"blocks_done_or_held": state["started"], "workers": count}))
                    os.replace(tmp, marker)
            if held:
                release.wait()
            fn(item)

        return original(count, tracked(items), block)

    workers.in_workers = probed_in_workers
    seps.in_workers = probed_in_workers  # imported by name there
    atexit.register(lambda: Path(point["report"]).write_text(json.dumps(state)))


POINTS = {
    "train_log": _train_log,
    "hash_log": _hash_log,
    "hash_save": _hash_save,
    "index_manifest": _index_manifest,
    "score_blocks": _score_blocks,
}


def _main() -> int:
    marker, point, argv = Path(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3:]
    POINTS[point["at"]](marker, point)
    from patchword.cli import main

    return main(argv)


if __name__ == "__main__":
    sys.exit(_main())
