"""What the processes of a torchrun launch agree on, in one launch of four CPU processes (gloo): the
batches (a last batch of 2 captions leaves two processes without rows, and the run still equals a
one-process run; so does a training split of 3 captions, fewer than the processes), the signal a stop
names, the config every process runs, the checkpoint the final evaluation reads (hashed once),
BatchNorm's running statistics (averaged once a validation), and a stop that no process reports before
``last.pt`` is written. The pieces that need no launch (signals, logging, the config comparison) are tested
in this process.

The launch is :func:`test_distributed._launch` (spawned processes, each job its own process group); the
jobs are this module's functions.

Over 400 lines: every agreement is checked in the one launch of four processes, by this module's jobs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import torch
from test_distributed import _launch, _ok, _summary, _train_losses

from conftest import TINY_MODEL_32, laps_args, write_laps_dataset
from patchword.checkpoint import load_checkpoint
from patchword.config import apply_overrides
from patchword.fileio import file_sha256
from patchword.runs.config import RunConfig

pytestmark = pytest.mark.usefixtures("one_thread")

WORLD = 4
# 50 captions in batches of 16, 16, 16 and 2: an epoch of 4 steps whose last batch leaves ranks 2 and 3
# without rows (it used to be folded into the batch before it under 4 processes, not under one).
BASE = [
    "data.num_train=10",
    "data.num_dev=8",
    "data.num_test=8",
    *TINY_MODEL_32,
    "model.seps.variant=paper",
    "model.seps.gumbel=false",
    "train.batch_size=16",
    "train.lr=1e-3",
    "train.log_every=1",
    "train.max_steps=8",  # two epochs, validated at steps 4 and 8
    "train.num_threads=1",
    "eval.max_memory_mb=1",
    "precision=fp64",
]
BATCH_NORM = ["model.tiny_vit.stem=conv"]  # the tiny ViT's conv stem: three BatchNorm layers
# A training split of 3 captions (3 images of 1 caption, LAPS layout), fewer than the 4 processes: every
# batch leaves rank 3 without rows. The tiny ViT's VSE model (no random draws), in float64.
FEW = [
    "data.captions_per_image=1",
    "train.batch_size=4",
    "train.max_steps=4",
    "train.lr=1e-3",
    "train.log_every=1",
    "precision=fp64",
]


def _few_args(data: dict[str, Path], root: Path) -> list[str]:
    return laps_args(data, *FEW, f"output_dir={root}", "name=few", f"data.cache_dir={root.parent / 'cache'}")


def _write_few_captions(root: Path) -> dict[str, Path]:
    """The LAPS-layout dataset of :data:`FEW`: 3 training, 4 dev and 4 test images, one caption each."""
    paths = write_laps_dataset(root, sizes={"train": 3, "dev": 4, "test": 4})
    for name in ("train_ids", "train_caps", "dev_ids", "dev_caps", "test_ids", "test_caps"):
        file = root / f"{name}.txt"  # two lines per image: keep the first
        file.write_text("\n".join(file.read_text().splitlines()[::2]) + "\n")
    return paths


def _args(root: Path, name: str, *extra: str) -> list[str]:
    return [*BASE, f"output_dir={root}", f"name={name}", f"data.cache_dir={root.parent / 'cache'}", *extra]


@contextlib.contextmanager
def _stderr_to(path: Path):
    """This process's file descriptor 2 (PyTorch's C++ warnings, Python's) into ``path`` for the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    with path.open("w") as out:
        os.dup2(out.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


@contextlib.contextmanager
def _batch_norm_seen(seen: list, reads: list | None = None):
    """Record the BatchNorm running statistics of the model every validation evaluates; and in ``reads``,
    in order, each average of the statistics ("average"), each validation ("validate") and each file this
    process hashes (its name)."""
    from patchword.train import agreement, runner, trainer

    original, averaged = trainer.evaluate, trainer.average_batch_norm_statistics
    hashes = agreement.file_sha256
    said = reads if reads is not None else []

    def watched(model, *args, **kwargs):
        norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
        seen.append([float(x) for m in norms for x in torch.cat([m.running_mean, m.running_var])])
        said.append("validate")
        return original(model, *args, **kwargs)

    trainer.evaluate = watched
    trainer.average_batch_norm_statistics = lambda *a: said.append("average") or averaged(*a)
    agreement.file_sha256 = runner.file_sha256 = lambda path: said.append(Path(path).name) or hashes(path)
    try:
        yield
    finally:
        trainer.evaluate, trainer.average_batch_norm_statistics = original, averaged
        agreement.file_sha256 = runner.file_sha256 = hashes


# ------------------------------------------------------------------------------------- jobs (each rank)


def _job_train(args: list[str], stderr_dir: str) -> dict:
    from patchword.train.runner import train_run

    seen: list = []
    reads: list = []
    with _stderr_to(Path(stderr_dir) / f"rank{os.environ['RANK']}.txt"), _batch_norm_seen(seen, reads):
        summary = _summary(train_run(apply_overrides(RunConfig(), args)))
    return {"summary": summary, "batch_norm": seen, "reads": reads}


def _job_resume(run_dir: str, overrides: list[str]) -> dict:
    from patchword.train.runner import resume_run

    seen: list = []
    with _batch_norm_seen(seen):
        summary = _summary(resume_run(run_dir, overrides))
    return {"summary": summary, "batch_norm": seen}


def _job_lr_per_rank(args: list[str]) -> dict:
    """Rank r runs with train.lr=(r + 1)e-3."""
    from patchword.train.runner import train_run

    rank = int(os.environ["RANK"])
    try:
        train_run(apply_overrides(RunConfig(), [*args, f"train.lr={(rank + 1) / 1000}"]))
    except Exception as err:
        return {"error": f"{type(err).__name__}: {err}"}
    return {"error": None}


def _job_slow_save_stop(args: list[str]) -> dict:
    """Rank 0 writes last.pt slowly (a slow shared filesystem); SIGINT reaches rank 1 during step 3. Each
    process says which last.pt it could read when it reported the stop, and the stop's signal and message."""
    from patchword.train import trainer
    from patchword.train.runner import train_run

    rank = int(os.environ["RANK"])
    original_step, original_save = trainer.Trainer._train_step, trainer.atomic_save

    def step_then_signal(self, *a, **kw):
        original_step(self, *a, **kw)
        if rank == 1 and self.step == 2:
            os.kill(os.getpid(), signal.SIGINT)

    def slow_save(state, path, *a, **kw):
        if rank == 0 and Path(path).name == "last.pt":
            time.sleep(2.0)
        return original_save(state, path, *a, **kw)

    trainer.Trainer._train_step, trainer.atomic_save = step_then_signal, slow_save
    try:
        train_run(apply_overrides(RunConfig(), args))
    except trainer.TrainingInterrupted as err:
        last = err.checkpoint
        read = load_checkpoint(last)["step"] if last.is_file() else None
        return {"step": err.step, "last_step": read, "signum": err.signum, "message": str(err)}
    finally:
        trainer.Trainer._train_step, trainer.atomic_save = original_step, original_save
    return {"step": None}


def _job_best_unseen(args: list[str]) -> dict:
    """Ranks other than 0 cannot see best.pt (a run directory that is not shared between nodes)."""
    from patchword.train.runner import train_run

    original = Path.is_file
    if os.environ["RANK"] != "0":
        Path.is_file = lambda self: False if self.name == "best.pt" else original(self)
    try:
        train_run(apply_overrides(RunConfig(), args))
    except Exception as err:
        return {"error": f"{type(err).__name__}: {err}"}
    finally:
        Path.is_file = original
    return {"error": None}


# ------------------------------------------------------------------------------------- the launch


@pytest.fixture(scope="module")
def launch(tmp_path_factory):
    """The one-process reference here, then one launch of four processes running every job in turn."""
    from patchword.train.runner import train_run

    root = tmp_path_factory.mktemp("agree")
    runs, one = root / "runs", root / "one"
    train_run(apply_overrides(RunConfig(), _args(one, "batches")))
    few = _write_few_captions(root / "few_data")
    train_run(apply_overrides(RunConfig(), _few_args(few, one)))
    stderr = {name: root / name for name in ("batches", "bn_full", "few")}
    for folder in stderr.values():
        folder.mkdir()
    named = [
        ("batches", (_job_train, (_args(runs, "batches"), str(stderr["batches"])))),
        ("lr", (_job_lr_per_rank, (_args(runs, "lr"),))),
        ("slow_stop", (_job_slow_save_stop, (_args(runs, "slow_stop"),))),
        ("best_unseen", (_job_best_unseen, (_args(runs, "best_unseen", "train.max_steps=4"),))),
        ("bn_full", (_job_train, (_args(runs, "bn_full", *BATCH_NORM), str(stderr["bn_full"])))),
        ("bn_half", (_job_train, (_args(runs, "bn_half", *BATCH_NORM, "train.max_steps=4"), str(root)))),
        ("bn_resume", (_job_resume, (str(runs / "bn_half"), ["train.max_steps=8"]))),
        ("few", (_job_train, (_few_args(few, runs), str(stderr["few"])))),
    ]
    results = _launch([job for _, job in named], root / "results", world=WORLD, timeout=900)
    names = [name for name, _ in named]
    said = {
        name: [(folder / f"rank{rank}.txt").read_text() for rank in range(WORLD)]
        for name, folder in stderr.items()
    }
    return {"root": root, "runs": runs, "one": one, "results": results, "jobs": names, "stderr": said}


def _job(launch: dict, name: str) -> list[dict]:
    """Every rank's result of job ``name`` (each must have returned one)."""
    index = launch["jobs"].index(name)
    _ok(launch["results"], index)
    return [per_rank[index]["ok"] for per_rank in launch["results"]]


def _dev_rsums(run: Path) -> list[tuple[int, float]]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["rsum"]) for r in records if r["split"] == "dev"]


def _relative_l2(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    num = sum(float((x.double() - b[k].double()).norm() ** 2) for k, x in a.items() if x.is_floating_point())
    den = sum(float(x.double().norm() ** 2) for x in a.values() if x.is_floating_point())
    return (num / den) ** 0.5


def test_four_processes_train_the_batches_of_one_when_the_last_batch_has_two_captions(launch):
    """Old code: under 4 processes the 2-caption batch was folded into the one before (3 steps an epoch
    instead of 4), so the runs trained other batches, and a resume with another count skipped or
    repeated captions. Now ranks 2 and 3 hold a stand-in row that the step drops."""
    summary = _job(launch, "batches")[0]["summary"]
    assert summary["world_size"] == WORLD and summary["steps"] == 8 and summary["epochs_done"] == 2
    one, four = launch["one"] / "batches", launch["runs"] / "batches"
    a, b = _train_losses(one), _train_losses(four)
    assert [s for s, _ in a] == [s for s, _ in b] == list(range(1, 9))
    assert max(abs(x - y) / max(abs(x), 1e-6) for (_, x), (_, y) in zip(a, b, strict=True)) <= 1e-9, (a, b)
    assert [s for s, _ in _dev_rsums(four)] == [4, 8]  # an epoch is 4 batches under 4 processes too
    assert [r for _, r in _dev_rsums(four)] == pytest.approx([r for _, r in _dev_rsums(one)], abs=1e-6)
    weights = (load_checkpoint(one / "last.pt")["model"], load_checkpoint(four / "last.pt")["model"])
    assert _relative_l2(*weights) <= 1e-10


def test_processes_with_different_configs_are_refused_by_every_process_before_anything_is_written(launch):
    """Old code: every process trained with its own train.lr while config.yaml recorded rank 0's."""
    errors = [result["error"] for result in _job(launch, "lr")]
    expected = "ConfigError: train.lr: rank 1 of 4 runs with 0.002, rank 0 with 0.001: every process"
    assert all(error is not None and error.startswith(expected) for error in errors), errors
    assert not (launch["runs"] / "lr").exists()


def test_four_processes_train_a_split_of_fewer_captions_like_one_process(launch):
    """Old code: the Trainer refused 3 training captions for 4 processes ("data: 3 training captions for
    4 processes"), although batches do not depend on the process count: rank 3 holds a stand-in row."""
    summary = _job(launch, "few")[0]["summary"]
    assert summary["world_size"] == WORLD and summary["steps"] == 4 and summary["epochs_done"] == 4
    one, four = launch["one"] / "few", launch["runs"] / "few"
    a, b = _train_losses(one), _train_losses(four)
    assert [s for s, _ in a] == [s for s, _ in b] == [1, 2, 3, 4]
    assert sum(x > 0 for _, x in a) >= 3, a  # a loss to compare (step 1's is 0 here)
    assert max(abs(x - y) / max(abs(x), 1e-6) for (_, x), (_, y) in zip(a, b, strict=True)) <= 1e-9, (a, b)
    assert [r for _, r in _dev_rsums(four)] == pytest.approx([r for _, r in _dev_rsums(one)], abs=1e-6)
    weights = (load_checkpoint(one / "last.pt")["model"], load_checkpoint(four / "last.pt")["model"])
    assert _relative_l2(*weights) <= 1e-10


def test_no_process_warns_that_the_cls_token_gradient_is_strided(launch):
    """Old code: every process whose shard of a batch was one image (a stand-in row; the last batch of 2
    captions) printed PyTorch's "Grad strides do not match bucket view strides": the tiny ViT's CLS token
    got the concatenation's gradient slice, laid out unlike the parameter."""
    for name in ("batches", "few"):
        said = ["Grad strides do not match" in text for text in launch["stderr"][name]]
        assert said == [False] * WORLD, (name, launch["stderr"][name])


def test_every_process_names_the_signal_another_process_received(launch):
    """Old code: the processes that received no signal (rank 0 among them) said "SIGTERM received" when
    rank 1 alone got SIGINT."""
    results = _job(launch, "slow_stop")
    assert [r["signum"] for r in results] == [signal.SIGINT] * WORLD
    last = launch["runs"] / "slow_stop" / "last.pt"
    others = f"SIGINT received: stopped at step 3 (rank 1 of {WORLD} received it), {last} written; continue "
    assert results[0]["message"].startswith(f"{others}with `torchrun --standalone --nproc_per_node={WORLD}")
    own = f"SIGINT received: stopped at step 3, {last} written; continue with the command rank 0 names"
    assert results[1]["message"] == own
    assert [r["message"] for r in results[2:]] == [f"{others}with the command rank 0 names"] * (WORLD - 2)


def test_no_process_reports_a_stop_before_rank_0_has_written_last_pt(launch):
    """Old code: the processes other than rank 0 reported "last.pt written" (and exited, which has torchrun
    end rank 0) while rank 0 was still writing it."""
    results = _job(launch, "slow_stop")
    assert [r["step"] for r in results] == [3] * WORLD
    assert [r["last_step"] for r in results] == [3] * WORLD, results


def test_a_process_that_cannot_read_rank_0s_best_checkpoint_fails_the_launch_naming_it(launch):
    """Old code: ranks 1-3 found no best.pt and silently evaluated their own last weights."""
    errors = [result["error"] for result in _job(launch, "best_unseen")]
    best = launch["runs"] / "best_unseen" / "best.pt"
    assert errors[0] is not None and errors[0].startswith(
        "DistributedError: rank 1 of 4 failed in reading best.pt, the checkpoint to evaluate: "
    ), errors
    for rank, error in enumerate(errors[1:], 1):
        assert error == (
            f"DistributedError: {best}: rank {rank} of 4 cannot find the file rank 0 evaluates: the run "
            "directory must be shared by every process (a filesystem all nodes mount; docs/distributed.md)"
        )


def test_batch_norm_statistics_are_every_process_s_in_evaluation_checkpoints_and_resume(launch):
    """Old code: each process kept its own running statistics (SyncBatchNorm needs CUDA): a validation's
    processes encoded their images with different ones, rank 0's alone were saved, and a resume (every
    process starting from rank 0's) did not equal the uninterrupted run."""
    full, half, resumed = (_job(launch, name) for name in ("bn_full", "bn_half", "bn_resume"))
    for job in (full, half, resumed):
        seen = [result["batch_norm"] for result in job]
        assert seen[0] and all(stats == seen[0] for stats in seen), "processes evaluated other statistics"
    runs = launch["runs"]
    saved = load_checkpoint(runs / "bn_full" / "last.pt")["model"]
    stats = [v for k, v in saved.items() if k.endswith(("running_mean", "running_var"))]
    assert len(stats) == 6 and [float(x) for s in stats for x in s] == full[0]["batch_norm"][-1]
    # the resumed run equals the uninterrupted one: records, weights and statistics
    assert _dev_rsums(runs / "bn_half") == _dev_rsums(runs / "bn_full")
    assert _train_losses(runs / "bn_half") == _train_losses(runs / "bn_full")
    again = load_checkpoint(runs / "bn_half" / "last.pt")["model"]
    assert all(torch.equal(x, again[k]) for k, x in saved.items())
    # a warning the same in every process comes from rank 0 only
    said = ["BatchNorm layer(s) normalise per process" in text for text in launch["stderr"]["bn_full"]]
    assert said == [True] + [False] * (WORLD - 1)


def test_rank_0_hashes_best_pt_once_and_each_validation_averages_batch_norm_once(launch):
    """Old code: rank 0 hashed best.pt twice (to send its digest, then for summary.json), and every
    validation averaged the statistics twice (before its evaluation, then again in its last.pt save)."""
    full = _job(launch, "bn_full")
    # validated at steps 4 and 8 (each saved in last.pt); then every process reads best.pt once: rank 0
    # hashes it for the others to compare with, and its digest is summary.json's
    assert [r["reads"] for r in full] == [["average", "validate"] * 2 + ["best.pt"]] * WORLD
    summary = json.loads((launch["runs"] / "bn_full" / "summary.json").read_text())
    assert summary["checkpoint"] == "best.pt"
    assert summary["checkpoint_sha256"] == file_sha256(launch["runs"] / "bn_full" / "best.pt")


# ------------------------------------------------------------------------------------- in this process


def _signal_here(signum: int) -> None:
    os.kill(os.getpid(), signum)
    for _ in range(100):  # the Python handler runs between bytecodes, at once in practice
        time.sleep(0.001)


def test_the_first_stop_signal_is_the_one_a_stop_reports():
    """torchrun forwards a Ctrl-C as SIGINT, then SIGTERM; old code reported "SIGTERM received"."""
    from patchword.train.process import record_stop_signals

    flag: dict[str, int] = {}
    with pytest.raises(KeyboardInterrupt), record_stop_signals(flag):  # the first, not acted on: raised again
        _signal_here(signal.SIGINT)
        _signal_here(signal.SIGTERM)
    assert flag == {"signum": signal.SIGINT}


@pytest.mark.parametrize("failure", ["collective", "reader"])
def test_an_error_after_a_stop_signal_is_reported_as_the_interruption(failure):
    """Under torchrun every process gets the signal and stops where it is. Old code: a process whose own
    interruption was taken for a failure (a block comparing outcomes) then met a failed collective and
    said "a collective failed" while rank 0 said "interrupted"; one whose signal came inside torch.load
    said its best.pt was damaged."""
    from patchword.distributed import DistributedError
    from patchword.errors import DataError, Interrupted
    from patchword.train.process import stop_raises

    error = {
        "collective": DistributedError("rank 1 of 2: a collective failed (Connection closed by peer)"),
        "reader": DataError("runs/x/best.pt: not a readable patchword checkpoint: the archive is damaged"),
    }[failure]
    phase = {"then": "during the final evaluation: training is finished"}
    with pytest.raises(Interrupted) as stopped, stop_raises(phase):
        with contextlib.suppress(Interrupted):  # as Distributed.fail_together or a reader takes it
            _signal_here(signal.SIGTERM)
        raise error
    assert stopped.value.signum == signal.SIGTERM and stopped.value.__cause__ is error
    assert str(stopped.value) == "SIGTERM received during the final evaluation: training is finished"
    # without a signal, the failure is one
    with pytest.raises(type(error)), stop_raises({"then": "before training started"}):
        raise error


def test_other_ranks_log_errors_but_not_the_project_s_warnings(monkeypatch, caplog):
    """Old code: every process logged every warning (rank-identical: the config's, the data's)."""
    import argparse

    import patchword.distributed
    import patchword.runs.config
    import patchword.train.runner
    from patchword.cli import train as cli_train
    from patchword.distributed import LaunchInfo

    def fake_run(cfg):
        logging.getLogger("patchword.train.trainer").warning("the same in every process")
        logging.getLogger("patchword.data.images").warning("an image this process decoded")
        logging.getLogger("patchword.train.runner").error("this process's failure")
        return {}

    levels = {name: logging.getLogger(name).level for name in ("", "patchword", "patchword.data.images")}
    monkeypatch.setattr(patchword.distributed, "launch_info", lambda: LaunchInfo(1, 2, 1, "torchrun"))
    monkeypatch.setattr(patchword.runs.config, "load_run_config", lambda *a: None)
    monkeypatch.setattr(patchword.train.runner, "train_run", fake_run)
    try:
        cli_train.run(argparse.Namespace(resume=None, config=None, overrides=[]))
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said == [("WARNING", "an image this process decoded"), ("ERROR", "this process's failure")]


class _Gathered:
    """A launch of ``len(said)`` processes as :func:`refuse_differing_configs` sees it from one of them."""

    def __init__(self, said: list) -> None:
        self.said, self.world_size, self.enabled = said, len(said), True

    def all_gather_object(self, obj):
        return self.said


def test_the_config_comparison_names_the_first_differing_key_and_resume_overrides():
    from patchword.config import flat_config
    from patchword.errors import ConfigError
    from patchword.train.agreement import refuse_differing_configs

    cfg = apply_overrides(RunConfig(), ["train.batch_size=16"])
    other = apply_overrides(RunConfig(), ["train.batch_size=8", "train.lr=1"])
    with pytest.raises(ConfigError) as refused:
        refuse_differing_configs(
            cfg, _Gathered([(flat_config(cfg), None)] * 2 + [(flat_config(other), None)])
        )
    assert refused.value.key == "train.batch_size"
    assert str(refused.value).startswith("train.batch_size: rank 2 of 3 runs with 8, rank 0 with 16: ")
    same = (flat_config(cfg), ["train.max_steps=9"])
    refuse_differing_configs(cfg, _Gathered([same, same]), ["train.max_steps=9"])  # nothing to refuse
    with pytest.raises(
        ConfigError, match=r"^--resume: rank 1 of 2 resumes with the overrides \[\], rank 0 with \["
    ):
        refuse_differing_configs(cfg, _Gathered([same, (same[0], [])]), ["train.max_steps=9"])
