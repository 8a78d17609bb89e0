"""``patchword eval RUN key=value`` overrides that the evaluation would have applied and ignored, refused in
one line naming the key and why (exit 2, nothing written): a matcher option its registration declares
training-only (dotted, or inside a mapping given to a whole section), and a Hugging Face backbone the run's
backbones.json records."""

from __future__ import annotations

import json

import pytest

from conftest import one_error_line, tiny_hf_laps_overrides
from patchword.cli import main

SELECTION = "it only cuts the gradients of patch selection, as the official no_grad does"


@pytest.mark.parametrize(
    ("override", "why"),
    [
        ("model.seps.detach_selection=true", SELECTION),
        ("model.detach_selection=true", SELECTION),  # the legacy spelling (ModelConfig.ALIASES)
        (
            "model.seps.gumbel=true",
            "it only makes the selection's gradients straight-through; evaluation keeps the hard top-K",
        ),
        ("model.seps.ratio_mode=per_branch", "it combines the training ratio loss"),
        (
            "model.naaf.min_samples=5",
            "it fits the thresholds in training; an evaluation uses the checkpoint's",
        ),
    ],
)
@pytest.mark.parametrize("mode", [[], ["--suite", "compositional"]])
def test_eval_refuses_a_training_only_matcher_option(trained_tiny_run, tmp_path, capsys, override, why, mode):
    """`patchword eval RUN model.seps.detach_selection=true` was accepted and wrote the same numbers."""
    out = tmp_path / "e.json"
    assert main(["eval", str(trained_tiny_run), *mode, "--out", str(out), override]) == 2
    key = override.split("=", 1)[0]
    line = one_error_line(capsys.readouterr().err)
    assert line == f"error: {key}: does not apply to an evaluation (a training-only option: {why})"
    assert not out.exists()


@pytest.mark.parametrize(
    ("override", "key", "why"),
    [
        ("model.seps={detach_selection: true}", "model.seps.detach_selection", SELECTION),
        ("model={seps: {detach_selection: false}}", "model.seps.detach_selection", SELECTION),
        ("model={detach_selection: true}", "model.detach_selection", SELECTION),  # the legacy spelling
        ("model={matcher_args: {detach_selection: true}}", "model.seps.detach_selection", SELECTION),
        (
            "model.naaf={min_samples: 5, alpha: 0.1}",
            "model.naaf.min_samples",
            "it fits the thresholds in training; an evaluation uses the checkpoint's",
        ),
    ],
)
def test_eval_refuses_a_training_only_option_set_in_a_section_mapping(
    trained_tiny_run, tmp_path, capsys, override, key, why
):
    """The config loader takes a mapping as a whole section's value (``model.seps={...}``): the
    training-only option in it was applied and ignored, as the dotted one was."""
    out = tmp_path / "e.json"
    assert main(["eval", str(trained_tiny_run), "--out", str(out), override]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == (
        f"error: {key}: does not apply to an evaluation (a training-only option: {why}) "
        f"(in override {override!r})"
    )
    assert not out.exists()


def test_eval_refuses_a_key_no_evaluation_reads_set_in_a_section_mapping(trained_tiny_run, tmp_path, capsys):
    out = tmp_path / "e.json"
    override = "data={vocab_path: other.json, num_test: 8}"
    assert main(["eval", str(trained_tiny_run), "--out", str(out), override]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        "error: data.vocab_path: does not apply to an evaluation (it sets a training vocabulary; the run's "
        f"own vocab.json is used) (in override {override!r})"
    )
    assert not out.exists()


def test_eval_keeps_a_matcher_option_the_scores_depend_on(trained_tiny_run, tmp_path):
    out = tmp_path / "e.json"
    assert main(["eval", str(trained_tiny_run), "--out", str(out), "model.seps.caption_chunk=2"]) == 0
    assert json.loads(out.read_text())["overrides"] == ["model.seps.caption_chunk=2"]


def test_eval_refuses_a_backbone_override_the_runs_backbones_json_records(
    tiny_hf, laps_dataset, tmp_path, capsys
):
    """`patchword eval RUN model.hf_vision=...` was accepted and ignored: the model is rebuilt from the
    architecture backbones.json records. Where it records none, the override still builds the backbone."""
    bert, vit = tiny_hf
    runs = tmp_path / "runs"
    args = [
        *tiny_hf_laps_overrides(tiny_hf, laps_dataset, tmp_path),
        "train.max_steps=1",
        f"output_dir={runs}",
    ]
    assert main(["train", *args, "name=hf"]) == 0
    run, out = runs / "hf", tmp_path / "e.json"
    backbones = run / "backbones.json"
    for key, what, value in (("model.hf_vision", "image", vit), ("model.hf_text", "text", bert)):
        for extra in ([], ["--ensemble", str(run)]):
            assert main(["eval", str(run), *extra, "--out", str(out), f"{key}={value}"]) == 2
            member = f"in ensemble member {run}: " if extra else ""  # which run's config says so
            assert one_error_line(capsys.readouterr().err) == (
                f"error: {key}: {member}the run's backbones.json decides its {what} backbone ({backbones} "
                "records the architecture, the checkpoint holds the weights): the override would be ignored; "
                "drop it"
            )
            assert not out.exists()
    # a backbones.json that records no text backbone: the override builds it (the checkpoint's weights then
    # load into it), as before
    recorded = json.loads(backbones.read_text())
    del recorded["text"]
    backbones.write_text(json.dumps(recorded))
    assert main(["eval", str(run), "--out", str(out), f"model.hf_text={bert}"]) == 0
    assert main(["eval", str(run), "--out", str(out), "--force", "model.hf_text=not-a-user/not-a-model"]) == 2
    assert "not-a-user/not-a-model" in one_error_line(capsys.readouterr().err)
