"""What an export's card reads from records (review of the card, defects B, C, D).

* B: the "no row" sentence of the published section printed ``backbone `None` `` and ``(read from
  `import.json`: )`` for a checkpoint whose backbone or dataset patchword cannot name.
* C: exporting an export gave "saved at training step n/a" and "No evaluation ... is recorded" although
  its ``metrics.json`` holds the step and the evaluation of those exact weights (their sha256).
* D: the protocol label trusted an unchecked ``leaky``: ``"leaky": "false"`` (a string) exported as LEAKY.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import one_error_line
from patchword.cli import main
from patchword.runs import config_hash

pytestmark = pytest.mark.usefixtures("one_thread")


def _record(out: Path) -> dict:
    return json.loads((out / "metrics.json").read_text())


def _copy(run: Path, where: Path) -> Path:
    return Path(shutil.copytree(run, where))


# ------------------------------------------------------------------------- B: the published "no row" sentence


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (  # a family without any published row (TGDT), its importer's dataset unknown
            {"family": "tgdt", "opt": {}},
            "patchword's table of published results holds no result of the official `tgdt` code, so nothing "
            "published is shown beside the numbers measured here.",
        ),
        (  # rows for the family, but a backbone patchword cannot name
            {"family": "seps", "opt": {"dataset": "f30k"}},
            "patchword's table of published results has no row for the official `seps` code with the "
            "backbone of this checkpoint (its opt names none patchword can match) on Flickr30K 1K (read from "
            "`import.json`: opt.vit_type absent, opt.dataset `f30k`).",
        ),
        (  # and neither backbone nor dataset in the opt
            {"family": "naaf", "opt": {}},
            "patchword's table of published results has no row for the official `naaf` code with the "
            "backbone of this checkpoint (its opt names none patchword can match) on its dataset (its opt "
            "names none patchword knows) (read from `import.json`: opt.precomp_enc_text_type absent).",
        ),
    ],
)
def test_the_no_row_sentence_never_prints_none_or_an_empty_basis(
    trained_tiny_run, tmp_path, record, expected
):
    run = _copy(trained_tiny_run, tmp_path / "run")
    (run / "import.json").write_text(json.dumps(record))
    assert main(["export", str(run), str(tmp_path / "out")]) == 0
    card = (tmp_path / "out" / "README.md").read_text()
    section = card[card.index("## Published vs measured here") :]
    assert expected in section
    assert "None" not in section and ": )" not in section and "()" not in section


# ------------------------------------------------------------------------------- C: an export of an export


def test_an_export_of_an_export_carries_the_step_and_the_evaluation_of_the_same_weights(
    trained_tiny_run, tmp_path
):
    first, second = tmp_path / "first", tmp_path / "second"
    assert main(["export", str(trained_tiny_run), str(first)]) == 0
    assert main(["export", str(first), str(second)]) == 0
    before, after = _record(first), _record(second)
    assert after["weights_sha256"] == before["weights_sha256"]
    assert (after["checkpoint"], after["source_run"]) == ("model.safetensors", str(first))
    assert after["checkpoint_step"] == before["checkpoint_step"] is not None
    assert after["run_steps"] == before["run_steps"] is not None
    assert after["metrics"] == before["metrics"] and after["metrics_source"] == "metrics.json"
    assert after["origin"] == {"run": str(trained_tiny_run), "checkpoint": "best.pt"}
    assert after["metrics_origin"] == {
        "run": str(trained_tiny_run),
        "file": "summary.json",
        "config_hash": config_hash(trained_tiny_run),
    }
    card = (second / "README.md").read_text()
    origin = f"(exported by `{first}` from `best.pt` of run `{trained_tiny_run}`)"
    assert (
        f"* checkpoint `model.safetensors` {origin}: saved at training step {before['checkpoint_step']} "
        f"(the run trained {before['run_steps']} steps)" in card
    )
    assert "n/a" not in card and "No evaluation" not in card
    assert f"{before['metrics']['rsum']:.1f} |" in card
    assert (
        f"the evaluation recorded by the export it was made from (`metrics.json` of `{first}`, whose "
        "`model.safetensors` held these weights: same sha256), made in `summary.json` of run "
        f"`{trained_tiny_run}`." in card
    )
    # a third generation still names the run the weights were trained in
    assert main(["export", str(second), str(tmp_path / "third")]) == 0
    third = _record(tmp_path / "third")
    assert third["origin"] == after["origin"] and third["metrics_origin"] == after["metrics_origin"]


def test_an_export_whose_config_was_edited_carries_no_evaluation(trained_tiny_run, tmp_path):
    """The evaluation describes the config the export wrote; an edited config.yaml is no longer it."""
    first = tmp_path / "first"
    assert main(["export", str(trained_tiny_run), str(first)]) == 0
    with (first / "config.yaml").open("a") as config:
        config.write("# edited\n")
    assert main(["export", str(first), str(tmp_path / "second")]) == 0
    record = _record(tmp_path / "second")
    assert record["metrics"] == {} and "metrics_origin" not in record
    assert record["checkpoint_step"] == _record(first)["checkpoint_step"]  # the weights' step still holds
    card = (tmp_path / "second" / "README.md").read_text()
    assert "No evaluation of checkpoint `model.safetensors`" in card


# ---------------------------------------------------------------------------------------- D: the leaky flag


@pytest.mark.parametrize("value", ["false", "true", 0, None])
def test_a_leaky_flag_that_is_not_a_bool_is_one_error_line_naming_the_file(
    trained_tiny_run, tmp_path, capsys, value
):
    run = _copy(trained_tiny_run, tmp_path / "run")
    summary = json.loads((run / "summary.json").read_text())
    summary["leaky"] = value
    (run / "summary.json").write_text(json.dumps(summary))
    capsys.readouterr()
    assert main(["export", str(run), str(tmp_path / "out")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == f"error: {run / 'summary.json'}: leaky is {json.dumps(value)}, not true or false"
    assert not (tmp_path / "out").exists()


def test_a_carried_evaluation_with_a_text_leaky_flag_is_refused_too(trained_tiny_run, tmp_path, capsys):
    first = tmp_path / "first"
    assert main(["export", str(trained_tiny_run), str(first)]) == 0
    record = _record(first)
    record["metrics"]["leaky"] = "false"
    (first / "metrics.json").write_text(json.dumps(record))
    capsys.readouterr()
    assert main(["export", str(first), str(tmp_path / "second")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == f'error: {first / "metrics.json"}, metrics: leaky is "false", not true or false'
    assert not (tmp_path / "second").exists()
