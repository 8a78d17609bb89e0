"""``patchword hash train|eval|search`` in-process on tiny synthetic data."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import TINY_HASH, one_error_line
from patchword.cli.hash import main

pytestmark = pytest.mark.usefixtures("one_thread")


TINY = TINY_HASH


def test_cli_train_eval_search(tmp_path, capsys):
    out = tmp_path / "runs"
    assert (
        main(["train", "--bits", "16", "--epochs", "2", "--output-dir", str(out), "--name", "r", *TINY]) == 0
    )
    run = out / "r"
    summary = json.loads(capsys.readouterr().out)
    assert summary["bits"] == 16 and 0 <= summary["i2t_map@50"] <= 1 and summary["steps"] == 4
    for name in ("config.yaml", "metrics.jsonl", "last.pt", "model.safetensors", "config.json", "eval.json"):
        assert (run / name).is_file(), name
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["split"] for r in records] == ["train", "train", "test"]

    # a second train into the same run refuses to overwrite; --resume continues to more epochs
    assert (
        main(["train", "--bits", "16", "--epochs", "2", "--output-dir", str(out), "--name", "r", *TINY]) == 2
    )
    assert main(["train", "--resume", str(run), "--epochs", "3"]) == 0
    assert json.loads(capsys.readouterr().out)["epochs"] == 3

    assert (
        main(["eval", str(run), "--pr-plot", str(tmp_path / "pr.png"), "--out", str(tmp_path / "e.json")])
        == 0
    )
    metrics = json.loads(capsys.readouterr().out)
    assert metrics == json.loads((tmp_path / "e.json").read_text())
    assert metrics == json.loads((run / "eval.json").read_text())  # deterministic re-evaluation
    assert (tmp_path / "pr.png").stat().st_size > 1000

    assert main(["search", str(run), "--modality", "image", "--query-index", "0", "3", "--k", "4"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["database"] == "retrieval.text" and len(res["results"]) == 2
    first = res["results"][0]
    assert len(first["indices"]) == 4 and first["distances"] == sorted(first["distances"])
    assert (run / "index_text.npz").is_file()

    np.save(tmp_path / "q.npy", np.random.default_rng(0).standard_normal((3, 32)).astype(np.float32))
    assert (
        main(["search", str(run), "--modality", "text", "--query", str(tmp_path / "q.npy"), "--k", "2"]) == 0
    )
    assert len(json.loads(capsys.readouterr().out)["results"]) == 3


def test_cli_user_errors(tmp_path):
    assert main(["train", "--output-dir", str(tmp_path), "nope.key=1"]) == 2
    assert main(["eval", str(tmp_path / "missing")]) == 2
    # unequal feature dimensions: the feature-level term is undefined, said clearly (codes-only works)
    assert (
        main(["train", "--output-dir", str(tmp_path), "--name", "u", *TINY, "data.synthetic_text_dim=24"])
        == 2
    )
    assert (
        main(
            [
                "train",
                "--output-dir",
                str(tmp_path),
                "--name",
                "u",
                "--epochs",
                "1",
                *TINY,
                "data.synthetic_text_dim=24",
                "train.feature_weight=0",
            ]
        )
        == 0
    )
    np.save(tmp_path / "img.npy", np.ones((5, 4), dtype=np.float32))
    np.save(tmp_path / "txt.npy", np.ones((4, 4), dtype=np.float32))
    assert (
        main(
            [
                "train",
                "--data",
                "pairs",
                "--image",
                str(tmp_path / "img.npy"),
                "--text",
                str(tmp_path / "txt.npy"),
                "--output-dir",
                str(tmp_path),
            ]
        )
        == 2
    )


def test_train_hashing_leaves_the_thread_count_alone(tmp_path):
    """The library trainer used to call torch.set_num_threads(train.num_threads) and leave it changed."""
    import torch

    from patchword.config import load_config
    from patchword.hashing import HashRunConfig, train_hashing

    overrides = [*TINY, "train.epochs=1", "train.num_threads=3", f"output_dir={tmp_path}", "name=t"]
    before = torch.get_num_threads()
    train_hashing(load_config(HashRunConfig, None, overrides))
    assert torch.get_num_threads() == before != 3
    # the CLI applies train.num_threads for the run and restores the caller's count afterwards
    assert main(["train", "--output-dir", str(tmp_path), "--name", "c", *overrides[:-2]]) == 0
    assert torch.get_num_threads() == before


def test_a_negative_thread_count_is_refused_before_torch_is_given_it(hash_run, tmp_path, capsys):
    """``train.num_threads=-1`` is one line naming the key on a new run and on a resume (torch's own
    set_num_threads raises a RuntimeError for it), and the run is left as it was."""
    expected = "error: train.num_threads: must be >= 0 (0 = torch's default), got -1"
    argv = ["train", "--epochs", "1", "--output-dir", str(tmp_path), "--name", "n", *TINY]
    assert main([*argv, "train.num_threads=-1"]) == 2
    assert one_error_line(capsys.readouterr().err) == expected
    assert not (tmp_path / "n").exists()
    before = (hash_run / "last.pt").read_bytes()
    assert main(["train", "--resume", str(hash_run), "--epochs", "2", "train.num_threads=-1"]) == 2
    assert one_error_line(capsys.readouterr().err) == expected
    assert (hash_run / "last.pt").read_bytes() == before


def test_resume_keeps_the_runs_settings_and_a_missing_run_is_an_error(tmp_path, capsys):
    out = tmp_path / "runs"
    args = ["--output-dir", str(out), "--name", "r", *TINY]
    assert main(["train", "--bits", "16", "--epochs", "1", *args]) == 0
    run = out / "r"
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    capsys.readouterr()
    # another code length, learning rate or dataset on resume: refused naming the key, the run untouched
    for refused, key in [
        (["--bits", "32", "--epochs", "2"], "model.bits"),
        (["--epochs", "2", "train.lr_heads=1e-2"], "train.lr_heads"),
        (["data.num_train=32"], "data.num_train"),
        (["--config", str(run / "config.yaml")], "--config"),
    ]:
        assert main(["train", "--resume", str(run), *refused]) == 2, refused
        assert one_error_line(capsys.readouterr().err).startswith(f"error: {key}: "), refused
        assert {p.name: p.read_bytes() for p in run.iterdir()} == before, refused
    # a config.yaml edited by hand after the start disagrees with last.pt: refused, not trained
    edited = out / "edited"
    edited.mkdir()
    for name, data in before.items():
        (edited / name).write_bytes(data)
    (edited / "config.yaml").write_text(before["config.yaml"].decode().replace("bits: 16", "bits: 32"))
    assert main(["train", "--resume", str(edited), "--epochs", "2"]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(
        f"error: model.bits: {edited / 'config.yaml'} and last.pt disagree on model.bits"
    )
    assert sorted(p.name for p in edited.iterdir()) == sorted(before)
    # a typo'd run name does not start a new run
    assert main(["train", "--resume", "--output-dir", str(out), "--name", "typo"]) == 2
    assert "has no last.pt" in one_error_line(capsys.readouterr().err) and not (out / "typo").exists()
    assert main(["train", "--resume", "--epochs", "2"]) == 2
    assert one_error_line(capsys.readouterr().err).startswith("error: name: --resume needs a run directory")
    assert (
        main(["train", "--bits", "16", "--device", "cuda:7", "--output-dir", str(out), "--name", "g", *TINY])
        == 2
    )
    assert "device" in capsys.readouterr().err and not (out / "g").exists()


def _weights(run) -> dict:
    from patchword.checkpoint import load_checkpoint

    state = load_checkpoint(run / "last.pt")
    return {"model": state["model"], "optimizer": state["optimizer"]["state"], "step": state["step"]}


def test_resume_reads_the_runs_own_config_and_ends_with_the_uninterrupted_weights(tmp_path, capsys):
    """`hash train --resume RUN` demanded every original override again; now, as `train --resume`, it
    reads the run's config.yaml and takes resumable overrides only. Interrupted after 2 of 5 epochs (2
    checkpoints apart: save_every=2) and resumed, the run ends bit for bit where an uninterrupted one does
    (dropout draws included: the random generators come back from last.pt)."""
    import torch

    from patchword.cli import main as patchword_main

    out = tmp_path / "runs"
    common = ["--bits", "16", "--output-dir", str(out), *TINY, "train.save_every=2"]
    assert main(["train", *common, "--name", "whole", "--epochs", "5"]) == 0
    assert main(["train", *common, "--name", "cut", "--epochs", "2"]) == 0
    cut = out / "cut"
    config = (cut / "config.yaml").read_bytes()
    capsys.readouterr()
    # through the top-level CLI, an override after an option
    assert (
        patchword_main(["hash", "train", "--resume", str(cut), "--epochs", "4", "train.num_threads=1"]) == 0
    )
    assert json.loads(capsys.readouterr().out)["epochs"] == 4
    assert main(["train", "--resume", str(cut), "train.epochs=5"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["epochs"] == 5 and summary["steps"] == 10

    whole, resumed = _weights(out / "whole"), _weights(cut)
    assert resumed["step"] == whole["step"] == 10
    for name, tensor in whole["model"].items():
        assert torch.equal(resumed["model"][name], tensor), name
    for index, moments in whole["optimizer"].items():
        for name, tensor in moments.items():
            assert torch.equal(resumed["optimizer"][index][name], tensor), (index, name)
    assert (cut / "eval.json").read_text() == (out / "whole" / "eval.json").read_text()

    assert (cut / "config.yaml").read_bytes() == config  # never rewritten: the resumes are recorded instead
    resumes = [json.loads(line) for line in (cut / "resumes.jsonl").read_text().splitlines()]
    assert [(r["epoch"], r["step"], r["overrides"]) for r in resumes] == [
        (2, 4, ["train.num_threads=1", "train.epochs=4"]),  # overrides, then flags
        (4, 8, ["train.epochs=5"]),
    ]
    records = [json.loads(line) for line in (cut / "metrics.jsonl").read_text().splitlines()]
    splits = [("train", 1), ("train", 2), ("test", 2), ("train", 3), ("train", 4), ("test", 4)]
    assert [(r["split"], r["epoch"]) for r in records] == [*splits, ("train", 5), ("test", 5)]
    train_losses = {r["epoch"]: r["loss"] for r in records if r["split"] == "train"}
    whole_records = [json.loads(line) for line in (out / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert train_losses == {r["epoch"]: r["loss"] for r in whole_records if r["split"] == "train"}


def test_train_hashing_resume_in_code_keeps_the_runs_settings(tmp_path):
    """The library call resumes through the same path: resumable differences become the resume's
    overrides, anything else is refused naming the key."""
    from patchword.config import load_config
    from patchword.errors import ConfigError
    from patchword.hashing import HashRunConfig, train_hashing

    base = [*TINY, "model.bits=16", f"output_dir={tmp_path}", "name=lib"]
    train_hashing(load_config(HashRunConfig, None, [*base, "train.epochs=1"]))
    with pytest.raises(ConfigError) as err:
        train_hashing(
            load_config(HashRunConfig, None, [*base, "train.epochs=2", "model.bits=32"]), resume=True
        )
    assert err.value.key == "model.bits"
    summary = train_hashing(
        load_config(HashRunConfig, None, [*base, "train.epochs=2", "eval.ks=[1]"]), resume=True
    )
    assert summary["epochs"] == 2 and "i2t_p@1" in summary and "i2t_p@5" not in summary
    (record,) = [json.loads(line) for line in (tmp_path / "lib" / "resumes.jsonl").read_text().splitlines()]
    assert record["overrides"] == ["eval.ks=[1]", "train.epochs=2"]


def test_overrides_may_follow_options(tmp_path, capsys):
    """`hash train --config X --epochs 1 key=value` was rejected by argparse ("unrecognized arguments"),
    while `patchword train` accepts overrides after flags."""
    import yaml

    from patchword.cli import main as patchword_main

    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"model": {"bits": 16}, "train": {"epochs": 1}}))
    out = tmp_path / "runs"
    argv = ["train", "--config", str(config), "--output-dir", str(out), "--name", "a", *TINY, "--seed", "3"]
    assert main([*argv, "model.nhead=2", "eval.topk=7"]) == 0
    saved = yaml.safe_load((out / "a" / "config.yaml").read_text())
    assert (
        saved["model"]["bits"],
        saved["model"]["nhead"],
        saved["eval"]["topk"],
        saved["train"]["seed"],
    ) == (
        16,
        2,
        7,
        3,
    )
    assert saved["data"]["num_train"] == 64 and saved["train"]["epochs"] == 1
    capsys.readouterr()
    # the same through `patchword hash`, with -v before the verb (handed on after the rest) and after it
    assert patchword_main(["-v", "hash", "train", "--name", "b", *argv[1:5], "eval.topk=9", *TINY]) == 0
    assert yaml.safe_load((out / "b" / "config.yaml").read_text())["eval"]["topk"] == 9
    capsys.readouterr()
    assert patchword_main(["hash", "eval", str(out / "missing"), "-v"]) == 2
    err = capsys.readouterr().err  # -v taken (the traceback), not "unrecognized arguments: -v"
    assert "Traceback" in err and err.strip().endswith("is not a hashing run directory (no config.yaml)")
    # what is neither an option nor key=value is still refused
    for extra in (["--bogus"], ["epochs"]):
        with pytest.raises(SystemExit) as exit_:
            main([*argv, *extra])
        assert exit_.value.code == 2
        assert f"unrecognized arguments: {extra[0]}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--seed", "-1"], "error: train.seed: must lie in [0, 2**32 - 1]"),
        (["data.split_seed=4294967296"], "error: data.split_seed: must lie in [0, 2**32 - 1]"),
        # the config loader refuses the text 'nan' for a number (the key's own check refuses NaN in code)
        (["train.lr_heads=nan"], "error: train.lr_heads: "),
        (["train.weight_decay=nan"], "error: train.weight_decay: "),
        (["--name", "a/b"], "error: name: is the run's directory under output_dir"),
    ],
)
def test_hash_values_are_refused_before_anything_is_written(tmp_path, capsys, argv, expected):
    """f715cbc wrote the run directory, then numpy refused seed -1 ("Seed must be between ..." naming no
    key); a NaN learning rate trained."""
    out = tmp_path / "runs"
    assert main(["train", "--output-dir", str(out), "--name", "v", *TINY, *argv]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(expected)
    assert not out.exists()
