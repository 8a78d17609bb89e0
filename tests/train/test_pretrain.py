"""``patchword pretrain`` in-process (CONTRIBUTING: one smoke test per CLI verb): the shipped recipe made
tiny, trained for three steps, exported, and run again into the same folder with and without ``--force``."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from conftest import one_error_line
from patchword.cli import main
from patchword.config import apply_overrides
from patchword.recipes.pretrain import KEYS, PRETRAIN_RECIPE, global_recall, pretrain_config
from patchword.runs.claim import RunKind

STEPS = 3


def _overrides(tmp_path, **changes) -> list[str]:
    """The pretraining recipe on the smallest tiny encoders (still the clip matcher and InfoNCE), 32 training
    scenes in batches of 16, stopped after STEPS optimiser steps."""
    values = {
        "output_dir": tmp_path / "runs",
        "name": "pt",
        "data.cache_dir": tmp_path / "cache",
        "model.name": "vse-tiny-16",
        "model.matcher": "clip",
        "data.synthetic_image_size": 32,
        "data.num_train": 32,
        "data.num_dev": 8,
        "data.num_test": 8,
        "train.batch_size": 16,
        "train.epochs": 2,
        "train.max_steps": STEPS,
        "train.eval_max_images": 8,
        "train.log_every": 1,
        "train.num_threads": 1,
        **changes,
    }
    return [f"{key}={value}" for key, value in values.items()]


def _jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """One tiny pretraining run and its export: (tmp_path, overrides, out, printed meta)."""
    import contextlib
    import io

    tmp_path = tmp_path_factory.mktemp("pretrain")
    overrides, out = _overrides(tmp_path), tmp_path / "enc"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["pretrain", "--out", str(out), *overrides]) == 0
    return tmp_path, overrides, out, json.loads(printed.getvalue())


def test_pretrain_trains_the_steps_asked_and_exports_the_encoders(pretrained):
    tmp_path, overrides, out, printed = pretrained
    run_dir = tmp_path / "runs" / "pt"
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "vocab.json"]
    meta = json.loads((out / "config.json").read_text())
    # config.json is the architecture plus what the command printed
    assert {k: v for k, v in meta.items() if k != "architecture"} == printed
    assert meta["architecture"]["embed_dim"] == 16 and meta["architecture"]["tiny_vit"]["image_size"] == 32
    assert meta["recipe"] == {"config": PRETRAIN_RECIPE, "overrides": overrides}
    assert meta["seed"] == 0 and meta["run"] == str(run_dir)

    # the steps asked, each one's loss recorded and finite; the recipe's InfoNCE has no ratio term
    summary = json.loads((run_dir / "summary.json").read_text())
    assert meta["steps"] == summary["steps"] == STEPS
    records = _jsonl(run_dir / "metrics.jsonl")
    train = [r for r in records if r["split"] == "train"]
    assert [r["step"] for r in train] == list(range(1, STEPS + 1))
    assert all(math.isfinite(r["loss"]) and r["loss"] > 0 and r["loss"] == r["align"] for r in train)
    assert all(r["ratio"] == 0.0 and r["lr"] == pytest.approx(5e-4) for r in train)  # the recipe's lr
    dev = [r for r in records if r["split"] == "dev"]
    assert dev and meta["best_dev_rsum"] == max(r["rsum"] for r in dev) == summary["best_dev_rsum"]
    assert meta["oracle_rsum"] == summary["oracle_rsum"] == 600.0  # every positive found: 6 x 100
    assert meta["train_seconds"] == round(summary["train_seconds"], 1)

    # the exported weights are the run's best encoders in float16, and its vocabulary
    from patchword.runs import load_run

    model = load_run(run_dir).model
    weights = load_file(str(out / "model.safetensors"))
    want = {
        k: v.half() if v.is_floating_point() else v
        for k, v in model.state_dict().items()
        if k.startswith(("image_encoder.", "text_encoder."))
    }
    assert weights.keys() == want.keys() and all(torch.equal(weights[k], want[k]) for k in want)
    assert (out / "vocab.json").read_bytes() == (run_dir / "vocab.json").read_bytes()

    # the recorded test recall is that of the weights as shipped, computed again through the export
    from patchword.data.prepare import prepare_data

    shipped = apply_overrides(
        pretrain_config(overrides), [f"model.tiny_pretrained={out}", f"data.vocab_path={out}"]
    )
    again = global_recall(shipped, prepare_data(shipped.data, roles=["test"]))
    assert list(meta["test_global"]) == KEYS and meta["test_global"] == again
    assert meta["test_global"]["rsum"] == pytest.approx(sum(again[k] for k in KEYS[:-1]))
    # a run set up for TF32 on a GPU (eval.precision=tf32) still gets its global recall, in float32 on
    # the CPU: the recipe's helpers score another matcher on another device than the run's
    tf32_run = apply_overrides(shipped, ["eval.precision=tf32"])
    assert global_recall(tf32_run, prepare_data(shipped.data, roles=["test"])) == again


def test_a_second_pretrain_into_the_same_folder_refuses_then_re_exports_with_force(pretrained, capsys):
    tmp_path, overrides, out, _ = pretrained
    run_dir = tmp_path / "runs" / "pt"
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    log = (run_dir / "metrics.jsonl").read_bytes()
    capsys.readouterr()

    # without --force: one error line naming the folder and the flag, nothing touched
    assert main(["pretrain", "--out", str(out), *overrides]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {out} exists and is not empty; pass --force")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before

    # with --force the finished run is exported again, not trained further: the same weights and recall
    assert main(["pretrain", "--force", "--out", str(out), *overrides]) == 0
    assert (run_dir / "metrics.jsonl").read_bytes() == log
    assert (out / "model.safetensors").read_bytes() == before["model.safetensors"]
    assert (out / "vocab.json").read_bytes() == before["vocab.json"]
    old, new = json.loads(before["config.json"]), json.loads((out / "config.json").read_text())
    assert {k: v for k, v in new.items() if k != "machine"} == {
        k: v for k, v in old.items() if k != "machine"
    }
    assert new["steps"] == STEPS


def test_a_finished_run_with_another_recipe_value_is_refused_before_anything_is_written(pretrained, capsys):
    tmp_path, _, _, _ = pretrained
    out = tmp_path / "other"
    capsys.readouterr()
    # train.lr is not resumable: the run "pt" was trained with the recipe's 5e-4
    assert main(["pretrain", "--out", str(out), *_overrides(tmp_path, **{"train.lr": 1e-3})]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: train.lr") and "choose another name=" in err
    assert not out.exists()


def _pretrain(out, overrides, *flags) -> int:
    """``patchword pretrain`` in-process with its JSON output swallowed."""
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        return main(["pretrain", *flags, "--out", str(out), *overrides])


def test_a_finished_run_is_not_exported_under_another_resumable_value(tmp_path, capsys):
    """A finished 3-step run exported again with ``train.max_steps=6`` gave its 3-step weights a recipe that
    says 6; it is refused (one line, nothing written). Continued with ``patchword train --resume`` as the
    error advises, the same command then exports the 6-step weights under the recipe that says 6."""
    overrides = _overrides(tmp_path, **{"train.epochs": 10})
    assert _pretrain(tmp_path / "enc3", overrides) == 0
    run_dir = tmp_path / "runs" / "pt"
    longer = _overrides(tmp_path, **{"train.epochs": 10, "train.max_steps": 6})
    capsys.readouterr()
    assert _pretrain(tmp_path / "enc6", longer) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: train.max_steps: {run_dir} is finished, trained with 3, not 6")
    assert f"`patchword train --resume {run_dir} train.max_steps=6`" in line
    assert not (tmp_path / "enc6").exists()

    assert main(["train", "--resume", str(run_dir), "train.max_steps=6"]) == 0
    assert _pretrain(tmp_path / "enc6", longer) == 0
    meta = json.loads((tmp_path / "enc6" / "config.json").read_text())
    assert meta["steps"] == 6 and meta["recipe"]["overrides"] == longer
    # and the 3-step recipe no longer describes the run
    assert _pretrain(tmp_path / "enc3b", overrides) == 2
    assert "trained with 6, not 3" in one_error_line(capsys.readouterr().err)


def _interrupted(tmp_path, monkeypatch) -> int:
    """A pretraining run asked for 8 steps (of 20 in its epochs), stopped by SIGTERM during step 1; the
    exit code of the command."""
    import os
    import signal

    import patchword.train.trainer as trainer_module

    original = trainer_module.Trainer._train_step

    def step_then_signal(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if self.step == 0:
            os.kill(os.getpid(), signal.SIGTERM)

    with monkeypatch.context() as patched:
        patched.setattr(trainer_module.Trainer, "_train_step", step_then_signal)
        return _pretrain(tmp_path / "enc", _overrides(tmp_path, **{"train.epochs": 10, "train.max_steps": 8}))


def test_an_interrupted_pretrain_says_to_run_the_same_command_again(tmp_path, capsys, monkeypatch):
    """The runner's advice, ``patchword train --resume``, would never export the encoders."""
    run_dir = tmp_path / "runs" / "pt"
    assert _interrupted(tmp_path, monkeypatch) == 128 + 15
    err = capsys.readouterr().err
    assert "Traceback" not in err and "train --resume" not in err
    assert f"interrupted: SIGTERM received: stopped at step 1, {run_dir / 'last.pt'} written" in err
    assert "continue by running the same `patchword pretrain` command again" in err
    assert (run_dir / "last.pt").is_file() and not (tmp_path / "enc").exists()


def test_an_interrupted_run_resumes_with_the_values_of_the_command_that_continues_it(tmp_path, monkeypatch):
    """Rerun with ``train.max_steps=3``, the run asked for 8 resumed with its own 8 while the encoders'
    recipe said 3."""
    run_dir, out = tmp_path / "runs" / "pt", tmp_path / "enc"
    assert _interrupted(tmp_path, monkeypatch) == 128 + 15
    rerun = _overrides(tmp_path, **{"train.epochs": 10, "train.max_steps": 3})
    assert _pretrain(out, rerun) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    meta = json.loads((out / "config.json").read_text())
    assert summary["steps"] == meta["steps"] == 3 and meta["recipe"]["overrides"] == rerun
    assert [r["overrides"] for r in _jsonl(run_dir / "resumes.jsonl")] == [["train.max_steps=3"]]


@pytest.mark.parametrize(
    ("config", "changes", "key"),
    [
        ("scan_synthetic", {}, "model.image_encoder"),
        (None, {"model.text_encoder": "gru"}, "model.text_encoder"),
        (None, {"model.text_context.layers": 1}, "model.text_context.layers"),
        (None, {"data.tokenizer": "bert"}, "data.tokenizer"),
    ],
)
def test_a_recipe_the_export_cannot_take_is_refused_before_training(
    tmp_path, capsys, monkeypatch, config, changes, key
):
    """``--config scan_synthetic`` (region features, GRU text) trained fully, then failed to export, leaving
    model.safetensors, vocab.json and a wrong config.json in --out (and a rerun refused: not empty)."""
    import patchword.train.runner as runner

    def no_training(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(runner, "train_run", no_training)
    overrides = _overrides(tmp_path, **changes)
    if config:
        overrides = [o for o in overrides if not o.startswith(("model.", "data.synthetic_image_size"))]
    out = tmp_path / "enc"
    flags = ["--config", config] if config else []
    assert _pretrain(out, overrides, *flags) == 2
    assert one_error_line(capsys.readouterr().err).startswith(f"error: {key}: is ")
    assert not out.exists() and not (tmp_path / "runs").exists()


def test_an_export_that_fails_leaves_out_as_it_was(tmp_path, monkeypatch):
    """The encoders were written into --out before their test recall was measured: a failure there left
    model.safetensors, vocab.json and a config.json without the recall, and a rerun was refused (not
    empty). They are staged beside --out and moved in once complete."""
    import patchword.recipes.pretrain as recipe

    def recall_fails(*args, **kwargs):
        raise OSError(28, "No space left on device", str(tmp_path))

    monkeypatch.setattr(recipe, "global_recall", recall_fails)
    out = tmp_path / "enc"
    assert _pretrain(out, _overrides(tmp_path)) == 2
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["cache", "runs"]
    monkeypatch.undo()
    assert _pretrain(out, _overrides(tmp_path)) == 0  # the finished run, exported
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "vocab.json"]


def test_an_interrupted_final_evaluation_also_says_to_run_pretrain_again(tmp_path, capsys, monkeypatch):
    """The runner's other interruptions (before training resumed, during the final evaluation) name
    ``patchword train --resume`` by default; pretrain passes its own way to go on, and the rerun finishes
    the run and exports the encoders."""
    import os
    import signal

    import patchword.train.runner as runner

    original = runner.evaluate_run

    def signalled_evaluation(*args, **kwargs):
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            raise AssertionError("SIGTERM's default action here: the process dies where it stands")
        os.kill(os.getpid(), signal.SIGTERM)
        return original(*args, **kwargs)

    run_dir, out = tmp_path / "runs" / "pt", tmp_path / "enc"
    with monkeypatch.context() as patched:
        patched.setattr(runner, "evaluate_run", signalled_evaluation)
        assert _pretrain(out, _overrides(tmp_path)) == 128 + 15
    err = capsys.readouterr().err
    assert "Traceback" not in err and "train --resume" not in err
    (line,) = [line for line in err.splitlines() if line.startswith("interrupted: ")]
    assert line == (
        f"interrupted: SIGTERM received during the final evaluation: training is finished "
        f"({run_dir / 'last.pt'}); running the same `patchword pretrain` command again evaluates it"
    )
    assert _pretrain(out, _overrides(tmp_path)) == 0
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "vocab.json"]


def test_a_second_pretrain_into_the_same_out_is_refused_before_it_touches_anything(tmp_path, capsys):
    """Defect: no lock beside --out; a second `patchword pretrain --out X` while the first exported into X
    took the first's staging folder for a killed export's and deleted it (the first then failed). It is
    refused now, in one line, before it writes or removes anything; the first ends as if alone."""
    import patchword.recipes.pretrain as recipe

    out, overrides = tmp_path / "enc", _overrides(tmp_path)
    original, seen = recipe.global_recall, {}

    def recall_while_another_starts(*args, **kwargs):
        if not seen:  # the first command, its encoders half-staged beside --out
            seen["started"] = True
            (stage,) = tmp_path.glob(".enc.export-*")
            staged = sorted(p.name for p in stage.iterdir())
            seen["code"] = _pretrain(out, overrides)
            seen["err"] = capsys.readouterr().err
            seen["kept"] = stage.is_dir() and sorted(p.name for p in stage.iterdir()) == staged
            seen["out"] = out.exists()
        return original(*args, **kwargs)

    recipe.global_recall = recall_while_another_starts
    try:
        first = _pretrain(out, overrides)
    finally:
        recipe.global_recall = original
    assert (seen["code"], seen["kept"], seen["out"]) == (2, True, False)
    line = one_error_line(seen["err"])
    assert line.startswith(f"error: {out} is being written by another `patchword pretrain` (lock ")
    assert first == 0
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "vocab.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "enc", "runs"]  # no lock file left


class Killed(BaseException):
    """What ``kill -9`` does to the process at the point it is raised: nothing after it runs."""


def test_a_pretrain_killed_before_its_first_checkpoint_runs_again(tmp_path, monkeypatch):
    """Defect: killed (the OOM killer) before its first checkpoint, the run left config.yaml and vocab.json,
    and the same command was refused: the run directory exists (and --resume found no last.pt)."""
    import patchword.train.trainer as trainer_module

    def killed(self):
        raise Killed

    overrides, out, run_dir = _overrides(tmp_path), tmp_path / "enc", tmp_path / "runs" / "pt"
    with monkeypatch.context() as patched:
        patched.setattr(trainer_module.Trainer, "fit", killed)
        patched.setattr(RunKind, "remove_failed_start", lambda *args: None)  # what a kill never reaches
        with pytest.raises(Killed):
            _pretrain(out, overrides)
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock", "config.yaml", "vocab.json"]
    assert _pretrain(out, overrides) == 0
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == STEPS
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "vocab.json"]


def _encoders(folder) -> dict:
    """The files of an encoders folder; config.json without its ``machine`` (the load average moves)."""
    files = {p.name: p.read_bytes() for p in folder.iterdir()}
    files["config.json"] = {k: v for k, v in json.loads(files["config.json"]).items() if k != "machine"}
    return files


def test_a_kill_while_force_replaces_the_encoders_leaves_the_old_or_the_new_set_whole(
    pretrained, monkeypatch
):
    """Defect: ``--force`` replaced the three files one at a time, so a kill between two left the new
    weights beside the earlier vocabulary and config.json (their description). Killed at the second rename
    into --out, the folder holds one whole set, or none with the earlier set whole beside it, which the
    rerun puts back before replacing it; nothing stays beside --out."""
    import os
    from pathlib import Path

    tmp_path, overrides, _, _ = pretrained
    out = tmp_path / "enc_force"
    assert _pretrain(out, overrides) == 0
    new = _encoders(out)
    meta = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**meta, "earlier": True}))  # earlier encoders, told apart
    for name in ("model.safetensors", "vocab.json"):
        (out / name).write_bytes((out / name).read_bytes() + b" ")
    old = _encoders(out)
    real, moves = os.replace, []

    def replace(src, dst, *args, **kwargs):
        if "killed" in moves:  # nothing runs after a kill
            raise Killed
        dst = Path(dst)
        if out in (dst, dst.parent) or dst.name.startswith(f".{out.name}.replaced-"):
            moves.append(dst)
            if len(moves) == 2:
                moves.append("killed")
                raise Killed
        return real(src, dst, *args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(os, "replace", replace)
        with pytest.raises(Killed):
            _pretrain(out, overrides, "--force")
    if out.exists():
        assert _encoders(out) in (old, new)
    else:  # between the two renames: the earlier set whole, aside
        (aside,) = tmp_path.glob(f".{out.name}.replaced-*")
        assert _encoders(aside) == old
    assert _pretrain(out, overrides, "--force") == 0
    assert _encoders(out) == new
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(f".{out.name}.")] == []
