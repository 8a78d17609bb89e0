"""Fault injection: a full disk at every write site, a kill at a random moment, an interrupt.

For each command a user runs for long (train, eval, index build, densify, hash train):

* **disk full** (``ENOSPC`` from the first write that reaches the disk at write site n, for every n the
  command has): the command prints one ``error:`` line naming the file and the errno, exits with 2, every
  file it had written before is still whole (checkpoints load, JSON parses, every JSONL line parses), and
  once space is back the same command finishes with exactly what an undisturbed run writes;
* **SIGKILL** of the real command at a random point (seeded; ``PATCHWORD_FAULT_SEED`` picks another),
  then the same command again: the result equals the undisturbed run's. The command is stalled at that
  point until it is killed (``tests/stall_support.py``), so no race with the command decides where it stops;
* **Ctrl-C**: one ``interrupted:`` line, exit code 130, no traceback.

Writes reach the disk through ``patchword.fileio`` (atomic replace, or append + fsync), so the fault is
injected at ``os.fsync``: the n-th call and every later one fail, as on a disk that stays full. The index's
shard arrays are written with ``os.write`` (:func:`patchword.search.shards.write_npy`), where a disk that
fills in the middle of a write is injected too (:func:`short_writes_from`), and a real short write is made by
a file size limit.

Over 400 lines: the five commands share one injection harness and its checks of what is left.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import TINY_HASH, TINY_MODEL_32
from patchword.checkpoint import load_checkpoint
from patchword.cli import main
from stall_support import HANG_GUARD_S, run_until_stalled, stalled_command, wait_for_marker

pytestmark = pytest.mark.usefixtures("one_thread")

SEED = int(os.environ.get("PATCHWORD_FAULT_SEED", "0"))
TINY = [
    "data.num_train=21",
    "data.num_dev=6",
    "data.num_test=6",
    *TINY_MODEL_32,
    "model.seps.variant=paper",
    "train.batch_size=16",
    "train.lr=1e-3",
    "train.log_every=3",
    "train.eval_every=4",
    "train.checkpoint_every=3",
    "train.num_threads=1",
    "eval.max_memory_mb=1",
]


@contextlib.contextmanager
def disk_full_from(n: int):
    """The n-th ``os.fsync`` of a file (1-based) and every later one fail with ENOSPC; yields the call
    counter. A directory's sync (after a rename) passes: its failure is a warning, not a failed write
    (``fileio.fsync_directory``, tests/runs/test_fileio_durability.py)."""
    real, calls = os.fsync, {"n": 0}

    def fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            return real(fd)
        calls["n"] += 1
        if calls["n"] >= n:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd)

    os.fsync = fsync
    try:
        yield calls
    finally:
        os.fsync = real


@contextlib.contextmanager
def short_writes_from(n: int, under: Path, cut: dict | None = None):
    """The n-th ``os.write`` (1-based) to a file under ``under`` writes only part of its bytes, as on a
    disk that fills up in the middle of a write, and every later one fails with ENOSPC; ``cut["file"]``
    is the file whose write was cut short. Yields the call counter (a writer that loops on ``os.write``
    counts once per call)."""
    real, calls, under = os.write, {"n": 0}, str(under.resolve())

    def write(fd, data):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if not target.startswith(under + os.sep):
            return real(fd, data)
        calls["n"] += 1
        if calls["n"] > n:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if calls["n"] == n:
            if cut is not None:
                cut["file"] = target
            data = memoryview(data)[: len(data) // 2]
        return real(fd, data)

    os.write = write
    try:
        yield calls
    finally:
        os.write = real


def count_writes(run, inject=disk_full_from) -> int:
    """How many writes reach the disk (fsync calls, or the calls ``inject`` counts) while ``run()`` runs
    undisturbed."""
    with inject(10**9) as calls:
        run()
    return calls["n"]


def fail_every_write_site_then_rerun(
    command, fresh, capsys, *, min_sites, after_failure, after_rerun, inject=disk_full_from
) -> None:
    """For every write site n of ``command(target)`` (counted on an undisturbed run): the disk fills from
    site n on (``inject(n)``, by default at ``os.fsync``), the command must exit with 2 and one error line
    (``after_failure(line, target, n)`` checks what is left), then with space back the same command must
    finish (``after_rerun(target, n)``)."""
    sites = count_writes(lambda: command(fresh("probe")), inject)
    assert sites >= min_sites, sites
    capsys.readouterr()
    for n in range(1, sites + 1):
        target = fresh(n)
        with inject(n):
            assert command(target) == 2, n
        line = one_error(capsys.readouterr().err)
        assert "No space left on device (ENOSPC)" in line, line
        after_failure(line, target, n)
        assert command(target) == 0, n  # space is back: the same command finishes the job
        capsys.readouterr()
        after_rerun(target, n)


def copies_of(run: Path, where: Path):
    """n -> a fresh copy of run directory ``run`` under ``where`` (``full_at_<n>``)."""

    def fresh(n) -> Path:
        shutil.copytree(run, where / f"full_at_{n}")
        return where / f"full_at_{n}"

    return fresh


def one_error(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, stderr
    return lines[0]


def assert_whole(directory: Path) -> None:
    """Every file a user keeps is complete: checkpoints load, JSON parses, every JSONL line parses, no
    temporary file is left behind."""
    for path in directory.rglob("*"):
        if not path.is_file():
            continue
        assert not path.name.endswith(".tmp"), path
        if path.suffix == ".pt":
            load_checkpoint(path)
        elif path.suffix == ".json":
            json.loads(path.read_text())
        elif path.suffix == ".jsonl":
            for line in path.read_text().splitlines():
                json.loads(line)


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def train_losses(run: Path) -> list[tuple[int, float]]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in records if r["split"] == "train"]


def same_weights(a: Path, b: Path) -> bool:
    wa, wb = load_checkpoint(a)["model"], load_checkpoint(b)["model"]
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


# ------------------------------------------------------------------------------------------------ train


@pytest.fixture(scope="module")
def train_root(tmp_path_factory):
    """An undisturbed 12-step run, and the same run stopped at step 6 (to be continued)."""
    root = tmp_path_factory.mktemp("faults_train")
    common = [*TINY, f"output_dir={root}", f"data.cache_dir={root / 'cache'}", "train.max_steps=12"]
    assert main(["train", *common, "name=full"]) == 0
    assert main(["train", *common, "name=half", "train.max_steps=6"]) == 0
    return root


def _continue(run: Path) -> int:
    return main(["train", "--resume", str(run), "train.max_steps=12"])


def test_train_disk_full_at_every_write_site_then_rerun_finishes_like_an_undisturbed_run(
    train_root, tmp_path, capsys
):
    before = snapshot(train_root / "half")
    fresh = copies_of(train_root / "half", tmp_path)

    def after_failure(line, run, n):
        assert str(run) in line, line
        assert_whole(run)
        assert 6 <= load_checkpoint(run / "last.pt")["step"] <= 12
        if n == 1:  # nothing reached the disk: every file as it was
            assert snapshot(run) == before

    def after_rerun(run, n):
        assert train_losses(run) == train_losses(train_root / "full"), n
        assert same_weights(run / "last.pt", train_root / "full" / "last.pt"), n

    # metrics lines, checkpoints, best.pt, the export, metrics.json, summary.json, plots
    fail_every_write_site_then_rerun(
        _continue, fresh, capsys, min_sites=8, after_failure=after_failure, after_rerun=after_rerun
    )


def test_train_into_an_unwritable_output_dir_is_one_line_before_any_work(tmp_path, capsys, monkeypatch):
    blocked = tmp_path / "ro"
    blocked.mkdir()

    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr("tempfile.mkstemp", refuse)  # what a read-only directory does to the probe
    # patched where the runner calls it: patching patchword.data.prepare's name while the runner is first
    # imported (lazily, by main) left the runner holding the stand-in for the rest of the session
    monkeypatch.setattr(
        "patchword.train.runner.load_raw_data", lambda *a, **k: pytest.fail("data loaded before the probe")
    )
    assert main(["train", *TINY, f"output_dir={blocked / 'runs'}", "name=x"]) == 2
    line = one_error(capsys.readouterr().err)
    assert str(blocked) in line and "Permission denied" in line and "EACCES" in line, line
    assert list(blocked.iterdir()) == []


# ------------------------------------------------------------------------------------------------- eval


def test_eval_disk_full_keeps_the_previous_result_and_says_so_in_one_line(train_root, tmp_path, capsys):
    run = train_root / "full"
    out = tmp_path / "eval.json"
    assert main(["eval", str(run), "--out", str(out)]) == 0
    before = out.read_bytes()
    printed = capsys.readouterr()
    # stdout is the metrics as one JSON document (| jq); "written:" goes to stderr
    assert json.loads(printed.out)["rsum"] == json.loads(before)["rsum"] and f"written: {out}" in printed.err
    with disk_full_from(1):
        assert main(["eval", str(run), "--out", str(out), "--force"]) == 2
    line = one_error(capsys.readouterr().err)
    assert str(out) in line and "ENOSPC" in line
    assert out.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["eval.json"]


def test_eval_into_an_unwritable_directory_fails_before_evaluating(train_root, tmp_path, capsys, monkeypatch):
    from patchword import runs

    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr("tempfile.mkstemp", refuse)
    monkeypatch.setattr(
        runs, "load_run", lambda *a, **k: pytest.fail("the model was loaded before the probe")
    )
    assert main(["eval", str(train_root / "full"), "--out", str(tmp_path / "e.json")]) == 2
    assert "Permission denied" in one_error(capsys.readouterr().err)


def test_ctrl_c_during_eval_is_one_line_and_exit_130(train_root, tmp_path, capsys, monkeypatch):
    from patchword.eval import protocol

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(protocol, "score_split", interrupted)
    assert main(["eval", str(train_root / "full"), "--out", str(tmp_path / "e.json")]) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("interrupted: ")
    assert not (tmp_path / "e.json").exists()


# ------------------------------------------------------------------------------------------ SIGKILL


def _kill_at(point: dict, argv: list[str], where: Path) -> dict:
    """Run ``patchword ARGV`` until it stalls at ``point`` (tests/stall_support.py), then SIGKILL it; -> the
    stall's record. Fails if the command ends first or never gets there (a hang guard)."""
    return run_until_stalled(
        stalled_command(where / "stalled.json", point, argv), where / "stalled.json", where / "killed.log"
    )


def test_train_sigkilled_at_a_random_step_resumes_to_the_undisturbed_run(train_root, tmp_path):
    kill_after = random.Random(SEED).randint(3, 10)
    run = train_root / "killed"
    argv = ["train", *TINY, f"output_dir={train_root}", "name=killed"]
    argv += [f"data.cache_dir={train_root / 'cache'}", "train.max_steps=12"]
    # Killed right after it logged step kill_after or the next logged step (every 3rd), once it has a
    # checkpoint (a run killed before its first one has nothing to resume: it is started again instead):
    # the logged metrics run ahead of last.pt, as between two checkpoints.
    where = _kill_at({"at": "train_log", "step": kill_after}, argv, tmp_path)
    assert kill_after <= where["step"] <= 12 and where["checkpoint_step"] < where["step"], (where, SEED)
    assert load_checkpoint(run / "last.pt")["step"] == where["checkpoint_step"]
    assert _continue(run) == 0
    assert train_losses(run) == train_losses(train_root / "full")
    assert same_weights(run / "last.pt", train_root / "full" / "last.pt")


# ------------------------------------------------------------------------------------------- hash train

HASH = [*TINY_HASH, "train.save_every=1", "train.num_threads=1", "--bits", "16"]


@pytest.fixture(scope="module")
def hash_root(tmp_path_factory):
    """An undisturbed 5-epoch hashing run, and the same run stopped after 2 epochs."""
    root = tmp_path_factory.mktemp("faults_hash")
    common = ["hash", "train", *HASH, "--output-dir", str(root)]
    assert main([*common, "--name", "full", "--epochs", "5"]) == 0
    assert main([*common, "--name", "half", "--epochs", "2"]) == 0
    return root


def _hash_continue(run: Path) -> int:
    return main(["hash", "train", "--resume", str(run), "train.epochs=5"])


def _hash_losses(run: Path) -> list[dict]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "elapsed_s"} for r in records]


def _hash_same(a: Path, b: Path) -> None:
    """The same epochs logged once each (a continued run also keeps the test record of its first end), the
    same final test record, weights and eval.json."""
    ra, rb = _hash_losses(a), _hash_losses(b)
    assert [r for r in ra if r["split"] == "train"] == [r for r in rb if r["split"] == "train"]
    assert ra[-1] == rb[-1] and ra[-1]["split"] == "test"
    assert same_weights(a / "last.pt", b / "last.pt")
    assert (a / "eval.json").read_text() == (b / "eval.json").read_text()


def test_hash_train_disk_full_at_every_write_site_then_rerun_finishes_like_an_undisturbed_run(
    hash_root, tmp_path, capsys
):
    fresh = copies_of(hash_root / "half", tmp_path)

    def after_failure(line, run, n):
        assert str(run) in line, line
        assert_whole(run)

    # per epoch a metrics line and last.pt; the export, eval.json, the test record
    fail_every_write_site_then_rerun(
        _hash_continue,
        fresh,
        capsys,
        min_sites=6,
        after_failure=after_failure,
        after_rerun=lambda run, n: _hash_same(run, hash_root / "full"),
    )


def test_hash_train_sigkilled_at_a_random_epoch_resumes_to_the_undisturbed_run(hash_root, tmp_path):
    rng = random.Random(SEED + 1)
    kill_after = rng.randint(1, 3)  # epochs checkpointed before the kill
    # right after that epoch's last.pt, or after the next epoch's metrics line (its last.pt not yet written)
    point = rng.choice(
        [{"at": "hash_save", "epoch": kill_after}, {"at": "hash_log", "epoch": kill_after + 1}]
    )
    run = hash_root / "killed"
    argv = ["hash", "train", *HASH, "--output-dir", str(hash_root), "--name", "killed", "--epochs", "5"]
    assert _kill_at(point, argv, tmp_path)["epoch"] == point["epoch"], SEED
    assert load_checkpoint(run / "last.pt")["epoch"] == kill_after
    assert _hash_continue(run) == 0
    _hash_same(run, hash_root / "full")


# ------------------------------------------------------------------------------------------ index build


@pytest.fixture(scope="module")
def index_env(tmp_path_factory):
    """The shared tiny search run and its exported images, and one undisturbed build of them."""
    from search_support import search_env

    env = search_env(tmp_path_factory)
    root = tmp_path_factory.mktemp("faults_index")
    args = ["--dense", str(env.export.files["dense"]), "--shard-size", "5", "--batch-size", "4"]
    base = ["index", "build", str(env.run_dir), "--images", str(env.export.files["images"]), *args]
    assert main([*base, "--out", str(root / "whole")]) == 0
    return base, root


@pytest.fixture(scope="module")
def index_in_three_shards(index_env):
    """The build of ``index_env`` in shards of 10 (10, 10 and a last one of 4) and its undisturbed index:
    the sweeps over every write site fail each write of a first, a middle and a last shard and of the
    manifest between them; five shards of 5 repeat the middle shard's sites (at 1.6x the builds)."""
    base, root = index_env
    at = base.index("--shard-size") + 1
    base = [*base[:at], "10", *base[at + 1 :]]
    assert main([*base, "--out", str(root / "whole_in_10s")]) == 0
    return base, root / "whole_in_10s"


def _same_index(a: Path, b: Path) -> None:
    from patchword.search.manifest import Manifest

    assert Manifest.read(a) == Manifest.read(b)
    assert snapshot(a / "shards") == snapshot(b / "shards")


def test_index_build_disk_full_at_every_write_site_then_rerun_resumes_to_the_same_index(
    index_in_three_shards, tmp_path, capsys
):
    base, whole = index_in_three_shards

    def after_failure(line, out, n):
        assert str(out) in line and "rerun" in line, line
        assert not (out.exists() and [p for p in out.rglob("*.tmp")])

    fail_every_write_site_then_rerun(  # per shard its arrays and the manifest
        lambda out: main([*base, "--out", str(out)]),
        lambda n: tmp_path / f"full_at_{n}",
        capsys,
        min_sites=10,
        after_failure=after_failure,
        after_rerun=lambda out, n: _same_index(out, whole),
    )


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="finds the file written through /proc")
def test_index_build_disk_full_in_the_middle_of_every_shard_write_names_the_file_then_rerun_resumes(
    index_in_three_shards, tmp_path, capsys
):
    """A shard array is written with ``os.write`` until every byte is on disk: a write the full disk cuts
    short, then ENOSPC, is one line naming the shard file and the errno (``np.save``'s ``tofile`` said only
    "266240 requested and 244704 written"), and the same command then resumes to the same index."""
    from patchword.search.manifest import Manifest
    from patchword.search.store import broken_shards

    base, whole = index_in_three_shards
    cut: dict[str, str] = {}

    def after_failure(line, out, n):
        tmp = Path(cut["file"])  # atomic: the temporary file beside the shard (".NAME.XXXXXXXX.tmp")
        assert tmp.parent == (out / "shards").resolve() and tmp.name.endswith(".tmp"), tmp
        shard = out / "shards" / tmp.name[1:].removesuffix(".tmp").rsplit(".", 1)[0]
        assert line == (
            f"error: {shard}: No space left on device (ENOSPC); rerun the same command to resume {out}"
        ), n
        assert not shard.exists() and not list(out.rglob("*.tmp")), n
        manifest = Manifest.read(out)  # the shards it names are whole
        assert manifest.state == "building" and broken_shards(out, manifest) == {}, n

    # per shard: global, tokens, dense, dense_lens; each a header and the data
    fail_every_write_site_then_rerun(
        lambda out: main([*base, "--out", str(out)]),
        lambda n: tmp_path / f"short_at_{n}",
        capsys,
        min_sites=20,
        after_failure=after_failure,
        after_rerun=lambda out, n: _same_index(out, whole),
        inject=lambda n: short_writes_from(n, tmp_path, cut),
    )


def test_index_build_a_real_short_write_names_the_shard_and_the_errno(index_env, tmp_path):
    """A file size limit (``RLIMIT_FSIZE``) makes the kernel write a shard only in part and then refuse
    (EFBIG), as a full disk does with ENOSPC: the line names the shard and the errno, not numpy's
    "4352 requested and 1968 written"."""
    base, root = index_env
    out = tmp_path / "idx"
    script = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (8000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))\n"
        "from patchword.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", script, *base, "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2, done.stderr
    # the first shard's global embeddings (5 x 32 float32) fit under the limit, its tokens (5 x 17 x 32) not
    shard = out / "shards" / "00000.tokens.npy"
    assert one_error(done.stderr) == (
        f"error: {shard}: File too large (EFBIG); rerun the same command to resume {out}"
    )
    assert not shard.exists() and not list(out.rglob("*.tmp"))
    assert main([*base, "--out", str(out)]) == 0
    _same_index(out, root / "whole")


def test_index_build_sigkilled_at_a_random_shard_resumes_to_the_same_index(index_env, tmp_path):
    from patchword.search.manifest import Manifest

    base, root = index_env
    out = tmp_path / "killed"
    kill_after = random.Random(SEED + 2).randint(1, 4)  # shards finished before the kill
    # killed right after the manifest recorded shard kill_after (5 images a shard)
    where = _kill_at(
        {"at": "index_manifest", "entries": 5 * kill_after}, [*base, "--out", str(out)], tmp_path
    )
    assert where == {"entries": 5 * kill_after, "state": "building"}, (where, SEED)
    assert Manifest.read(out).state == "building"
    assert main([*base, "--out", str(out)]) == 0
    _same_index(out, root / "whole")


# ---------------------------------------------------------------------------------------------- densify


def test_densify_disk_full_at_every_write_site_then_rerun_finishes_the_same_file(tmp_path, capsys):
    from densify_support import RUN
    from densify_support import write_images as _write_images

    images = tmp_path / "images"
    _write_images(images, [f"{i:02d}.png" for i in range(20)])
    base = ["densify", "--images", str(images), *RUN]
    assert main([*base, "--out", str(tmp_path / "whole.jsonl")]) == 0
    whole = (tmp_path / "whole.jsonl").read_bytes()

    def after_failure(line, out, n):  # no torn line
        assert not out.exists() or out.read_bytes().endswith(b"\n") or out.stat().st_size == 0

    fail_every_write_site_then_rerun(  # the sidecar, one append per batch
        lambda out: main([*base, "--out", str(out)]),
        lambda n: tmp_path / f"full_at_{n}.jsonl",
        capsys,
        min_sites=3,
        after_failure=after_failure,
        after_rerun=lambda out, n: out.read_bytes() == whole or pytest.fail(f"site {n}: another file"),
    )


# ------------------------------------------------------------------------------------------------ Ctrl-C


def test_ctrl_c_of_a_real_eval_takes_no_block_after_the_signal_and_is_one_line(tmp_path):
    """SIGINT while the scoring engine's worker threads hold blocks: the job stops taking blocks, the command
    prints one ``interrupted:`` line and exits 130 (it used to score every remaining block, then print a
    70-line traceback).

    The interrupt comes at a fixed point (tests/stall_support.py, ``score_blocks``): two blocks done and one
    held by each of the two workers, which go on only once the interrupted job leaves its thread pool. The
    verdict is a count: no block is started after the signal, and blocks were left. How long the stop takes
    on a machine is measured by ``benchmarks/interrupt_latency.py``, not asserted here.
    """
    runs = tmp_path / "runs"
    args = [*TINY, "train.max_steps=1", "train.num_threads=2"]
    assert main(["train", *args, f"output_dir={runs}", "name=r", f"data.cache_dir={tmp_path / 'c'}"]) == 0
    marker, report, log = tmp_path / "stalled.json", tmp_path / "blocks.json", tmp_path / "eval.log"
    point = {"at": "score_blocks", "after": 2, "report": str(report)}
    # a test split of 600 images in blocks of 4 MiB: many more blocks than the four taken at the signal
    evaluate = ["eval", str(runs / "r"), "data.num_test=600", "eval.max_memory_mb=4"]
    cmd = stalled_command(marker, point, [*evaluate, "--out", str(tmp_path / "e.json")])
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=out, env=env)
    try:
        wait_for_marker(proc, marker, log)
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=HANG_GUARD_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"hang guard: the eval did not exit within {HANG_GUARD_S:g} s of SIGINT")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = log.read_text()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("interrupted: "), err
    blocks = json.loads(report.read_text())
    assert blocks["signalled"] and blocks["workers"] == 2, blocks
    assert blocks["started_at_signal"] == 2 + 2, blocks  # two done, one held by each worker
    assert blocks["after_signal"] == 0, blocks  # the job took no block after the interrupt
    assert not blocks["exhausted"] and blocks["started"] < blocks["blocks"], blocks  # and had blocks left
    assert not (tmp_path / "e.json").exists()


# ------------------------------------------------------------------------- a failure inside a writer


class _FillingFile:
    """A file on a disk that fills after ``room`` bytes: ``write`` raises ENOSPC from then on (as the
    buffered file object does once its flush reaches the full disk)."""

    def __init__(self, fh, room: int) -> None:
        self._fh, self._room = fh, room

    def write(self, data) -> int:
        size = len(memoryview(data).cast("B"))
        if size > self._room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._room -= size
        return self._fh.write(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._fh.close()

    def __getattr__(self, name):
        return getattr(self._fh, name)


@pytest.mark.parametrize("room", [0, 100, 4000])
def test_disk_full_inside_torchs_zip_writer_is_the_enospc_line_naming_the_checkpoint(
    train_root, tmp_path, capsys, monkeypatch, room
):
    """torch's zip writer catches the failed write and raises ``RuntimeError: [enforce fail at
    inline_container.cc:672] unexpected pos`` (f715cbc: a traceback, exit 1); the disk's own error is what
    the user must read, naming the file, and the checkpoint before it stays whole."""
    import patchword.fileio

    run = tmp_path / "half"
    shutil.copytree(train_root / "half", run)
    before = (run / "last.pt").read_bytes()
    real_fdopen = os.fdopen

    def fdopen(fd, mode="r", *args, **kwargs):
        fh = real_fdopen(fd, mode, *args, **kwargs)
        return _FillingFile(fh, room) if "w" in mode else fh

    monkeypatch.setattr(patchword.fileio.os, "fdopen", fdopen)
    assert _continue(run) == 2
    line = one_error(capsys.readouterr().err)
    assert line.startswith(f"error: {run}/") and ".pt: No space left on device (ENOSPC)" in line, line
    monkeypatch.undo()
    assert (run / "last.pt").read_bytes() == before
    assert_whole(run)
    assert _continue(run) == 0  # space is back: the run goes on
    assert same_weights(run / "last.pt", train_root / "full" / "last.pt")
