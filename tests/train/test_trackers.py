"""train.report_to: what TensorBoard and Weights & Biases (offline) hold equals metrics.jsonl, and a resumed
run appends to the same tracker run."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from conftest import TINY_RUN_32
from patchword.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module", autouse=True)
def wandb_service_torn_down():
    """After this module, W&B's service process, threads, excepthook and WANDB_SERVICE are gone: run.finish()
    leaves them to the process, and the later modules of this pytest process (forking DataLoader workers,
    starting subprocesses) must not inherit them."""
    yield
    import os
    import sys

    import wandb

    wandb.teardown()
    os.environ.pop("WANDB_SERVICE", None)
    sys.excepthook = sys.__excepthook__


TINY = [
    *TINY_RUN_32,
    "train.eval_every=3",
]


def _expected(run: Path) -> dict[tuple[str, int], float]:
    """Every numeric field of metrics.jsonl as (``split/name``, step) -> value."""
    out = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        for key, value in record.items():
            if (
                key not in ("split", "step", "time")
                and isinstance(value, (int, float))
                and not isinstance(value, bool)
            ):
                out[(f"{record['split']}/{key}", record["step"])] = float(value)
    return out


def _tensorboard(run: Path) -> dict[tuple[str, int], float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return {(tag, e.step): e.value for tag in events.Tags()["scalars"] for e in events.Scalars(tag)}


def _wandb_records(path: Path):
    """The protobuf records of a W&B offline ``.wandb`` file (a LevelDB-style log of 32 KiB blocks)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # block trailer: padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        pending += chunk
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def _wandb(run: Path) -> dict[tuple[str, int], float]:
    out = {}
    for path in sorted((run / "wandb").glob("offline-run-*/run-*.wandb")):
        for record in _wandb_records(path):
            if record.WhichOneof("record_type") != "history":
                continue
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            step = record.history.step.num
            out.update({(k, step): float(v) for k, v in items.items() if not k.startswith("_")})
    return out


def test_trackers_hold_what_metrics_jsonl_holds_and_a_resume_appends(tmp_path):
    args = [*TINY, "train.report_to=[tensorboard,wandb]", f"output_dir={tmp_path}", "name=tracked"]
    assert main(["train", *args, "train.max_steps=4", f"data.cache_dir={tmp_path / 'c'}"]) == 0
    run = tmp_path / "tracked"
    run_id = (run / "wandb_id.txt").read_text()
    assert main(["train", "--resume", str(run), "train.max_steps=7"]) == 0
    assert (run / "wandb_id.txt").read_text() == run_id  # the same W&B run, resumed
    want = _expected(run)
    assert {step for (key, step) in want if key == "train/loss"} == set(range(1, 8))
    for name, got in (("tensorboard", _tensorboard(run)), ("wandb", _wandb(run))):
        assert set(got) == set(want), (name, sorted(set(want) ^ set(got))[:5])
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-6), (name, key)
    # the logged scalars include the parts of the loss, the gradient norm and the step time
    keys = {key for key, _ in want}
    assert {"train/align", "train/grad_norm", "train/step_seconds", "train/skipped_steps", "dev/rsum"} <= keys


def test_an_unknown_tracker_is_one_error(tmp_path, capsys):
    from conftest import one_error_line

    assert main(["train", *TINY, "train.report_to=[mlflow]", f"output_dir={tmp_path}"]) == 2
    assert "train.report_to: unknown tracker 'mlflow'" in one_error_line(capsys.readouterr().err)
