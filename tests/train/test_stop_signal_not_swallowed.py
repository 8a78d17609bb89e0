"""A stop signal stops the command wherever it lands, inside code that catches ``Exception`` included.

Found when the suite ran in two processes: ``patchword.bench gallery`` got SIGTERM while it wrote a log
line; the :class:`~patchword.errors.Interrupted` its stop handler raised went into logging's
``handleError``, which printed "--- Logging error ---" and went on; the handler ignored the next SIGTERM
(the first "was unwinding"), and the command scored its shapes to the end.
"""

from __future__ import annotations

import io
import logging
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from patchword.errors import DataError, Interrupted
from patchword.train.process import stop_raises


def _signal_here(signum: int) -> None:
    os.kill(os.getpid(), signum)
    for _ in range(100):  # the Python handler runs between bytecodes, at once in practice
        time.sleep(0.001)


class _SignalOnWrite(io.StringIO):
    """A log stream that receives SIGTERM while a line is being written to it."""

    def write(self, text: str) -> int:
        _signal_here(signal.SIGTERM)
        return super().write(text)


def test_a_stop_signal_landing_in_a_log_write_stops_the_block(capsys):
    logger = logging.getLogger("patchword.tests.stop_signal_in_a_log_write")
    handler = logging.StreamHandler(_SignalOnWrite())
    logger.addHandler(handler)
    went_on = False
    try:
        with pytest.raises(Interrupted) as stopped, stop_raises({"then": "while scoring shape quick"}):
            logger.warning("quick: 2000 of 2000 pairs scored")
            went_on = True
    finally:
        logger.removeHandler(handler)
    assert not went_on
    assert str(stopped.value) == "SIGTERM received while scoring shape quick"
    assert stopped.value.signum == signal.SIGTERM
    assert "Logging error" not in capsys.readouterr().err


def test_a_stop_signal_landing_in_a_reader_that_takes_any_error_for_damage_is_no_damaged_file(
    tmp_path, monkeypatch
):
    """A hashing dataset's reader turns whatever numpy raises into "not a readable file"; old code said so
    of a sound file that a SIGTERM interrupted."""
    from patchword.hashing import readers

    path = tmp_path / "labels.npy"
    np.save(path, np.zeros((2, 3), dtype=np.float32))

    def load(*args, **kwargs):
        _signal_here(signal.SIGTERM)
        raise AssertionError("the handler raises before this")

    monkeypatch.setattr(np, "load", load)
    with pytest.raises(Interrupted), stop_raises({"then": "while reading the dataset"}):
        try:
            readers.read_npy(path)
        except DataError as err:  # old code
            pytest.fail(f"a stop signal read as a damaged file: {err}")


def test_an_interruption_is_no_exception_but_one_a_command_reports():
    from patchword.errors import run_command

    def stopped():
        raise Interrupted(signal.SIGTERM, "SIGTERM received while scoring shape quick")

    assert not isinstance(Interrupted(signal.SIGTERM, ""), Exception)
    assert run_command(stopped) == 128 + signal.SIGTERM


def test_a_signal_recorded_after_the_training_loops_last_look_is_raised_when_the_loop_ends():
    """Old code: a SIGTERM that came after the loop's last check of its flag (while the run's summary was
    made) was dropped with the flag; the final evaluation ran to its end and the command exited 0."""
    from patchword.train.process import record_stop_signals

    flag: dict[str, int] = {}
    went_on = False
    with pytest.raises(Interrupted) as stopped, stop_raises({"then": "during the final evaluation"}):
        with record_stop_signals(flag):
            _signal_here(signal.SIGTERM)  # recorded, not acted on
        went_on = True
    assert not went_on and flag == {"signum": signal.SIGTERM}
    assert str(stopped.value) == "SIGTERM received during the final evaluation"


def test_a_stop_signal_in_a_log_line_written_above_the_progress_bar_stops_the_block(monkeypatch, capsys):
    """On a terminal, log lines are written above the training bar. Old code used tqdm's handler, which
    catches every exception but KeyboardInterrupt and SystemExit: a StopNow raised in its write printed
    "--- Logging error ---" and the validation went on."""
    import sys

    import tqdm.std

    from patchword.progress import terminal_bar
    from patchword.train.process import StopNow, stop_signals_raise

    write = tqdm.std.tqdm.write

    def signalled_write(cls, text, *args, **kwargs):
        if "validating" in text:
            _signal_here(signal.SIGTERM)
        return write(text, *args, **kwargs)

    monkeypatch.setattr(tqdm.std.tqdm, "write", classmethod(signalled_write))
    root, console = logging.getLogger(), logging.StreamHandler(sys.stderr)
    root.addHandler(console)
    before, flag, went_on = list(root.handlers), {}, False
    logger = logging.getLogger("patchword.tests.above_the_bar")
    try:
        with terminal_bar(3, "train", True):
            logger.warning("a line above the bar")
            with pytest.raises(StopNow), stop_signals_raise(flag):
                logger.warning("validating")
                went_on = True
    finally:
        root.removeHandler(console)
    assert not went_on and flag == {"signum": signal.SIGTERM}
    err = capsys.readouterr().err
    assert "a line above the bar" in err and "Logging error" not in err
    assert root.handlers == [h for h in before if h is not console]  # the console handler back in place


def test_a_second_signal_while_a_training_stop_unwinds_changes_nothing():
    """The training loop stopped on a SIGTERM (last.pt written) and its stop unwinds through a slow close
    (a tracker's) after the loop's recording handler is gone; a second SIGTERM then reached the command's
    handler, which had not seen the first: "SIGTERM received before training started: nothing was kept;
    run the same command again", although last.pt existed and the same command was then refused."""
    from patchword.train.process import TrainingInterrupted, record_stop_signals

    class SlowClose:  # what closes after the loop's handler is gone: W&B's finish, the trainer's threads
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            _signal_here(signal.SIGTERM)  # the second signal
            return False

    flag: dict[str, int] = {}
    phase = {"then": "before training started: nothing was kept; run the same command again"}
    stop = TrainingInterrupted(signal.SIGTERM, 7, Path("runs/x/last.pt"))
    with pytest.raises(Interrupted) as stopped, stop_raises(phase), SlowClose(), record_stop_signals(flag):
        _signal_here(signal.SIGTERM)  # recorded by the loop, which stops at its step
        raise stop
    assert stopped.value is stop, str(stopped.value)
    assert flag == {"signum": signal.SIGTERM}
    # the next command's handler hears a signal again
    with pytest.raises(Interrupted) as again, stop_raises({"then": "while scoring"}):
        _signal_here(signal.SIGINT)
    assert str(again.value) == "SIGINT received while scoring"


@pytest.mark.parametrize(
    "stop",
    [Interrupted(signal.SIGTERM, "SIGTERM received during the final evaluation"), KeyboardInterrupt()],
    ids=["Interrupted", "Ctrl-C"],
)
def test_a_stopped_rank_leaves_a_block_at_once_without_waiting_for_the_others(monkeypatch, stop):
    """``Distributed.fail_together`` compares the processes' outcomes after the block, a gather that waits
    for every other process's block (a whole evaluation's scoring). A stopped process stops at once; the
    others hear of it from the launcher or their next collective. Old code: it waited in the gather (up to
    dist_timeout_s, then "a collective failed", exit 2), and rank 0 said "rank 1 of 2 failed in scoring
    its image rows: Interrupted: SIGTERM received ...", exit 2."""
    from patchword.distributed import Distributed

    gathered = []
    monkeypatch.setattr(
        Distributed, "all_gather_object", lambda self, obj: gathered.append(obj) or [obj, None]
    )
    rank1 = Distributed(rank=1, world_size=2)
    with pytest.raises(type(stop)) as raised, rank1.fail_together("scoring its image rows"):
        raise stop
    assert raised.value is stop and gathered == []
    with pytest.raises(ValueError), rank1.fail_together("scoring its image rows"):  # an error is compared
        raise ValueError("rank 1's own trouble")
    assert gathered == ["ValueError: rank 1's own trouble"]
