"""A researcher onboarding the shipped Flickr30K recipes with their own data and local weights:

1. relative paths were recorded as typed (a run resumed and evaluated only from the directory it was made
   in; from elsewhere "data.root=f30k: no such directory", with no way out on --resume, and eval's "caption
   file not found: f30k/test_caps.txt" named neither the key nor config.yaml);
2. the TGDT recipe trained with SEPS's BERT caption augmentation (``size_augment`` unset, recorded null);
3. the recipes pinned ``data.bert_vocab: bert-base-uncased`` (offline, pointing model.hf_text at a local
   directory was not enough), and a vocabulary other than the text encoder's tokenised silently;
4. ``--config DIR/f30k_seps_vit224.yaml`` with a typo in DIR read the shipped recipe;
5. ``patchword train`` never said where the run went.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import pytest
import yaml

from conftest import TINY_VIT_VSE_16, one_error_line, tiny_hf_laps_overrides, write_laps_dataset
from patchword.cli import main
from patchword.config import apply_overrides, save_config
from patchword.errors import ConfigError
from patchword.runs.config import RunConfig, load_run_config

pytestmark = pytest.mark.usefixtures("one_thread")

#: The tiny VSE model on a LAPS dataset in ``laps/`` of the working directory, by relative paths.
RELATIVE = [*TINY_VIT_VSE_16, "data.dataset=laps", "data.root=laps", "data.image_root=laps/images"]
RELATIVE += ["data.image_size=32", "output_dir=runs"]


def _train_in(work: Path, *extra: str) -> tuple[int, str, str]:
    """``patchword train RELATIVE extra`` run from ``work``: (exit code, stdout, stderr)."""
    out, err, here = io.StringIO(), io.StringIO(), os.getcwd()
    os.chdir(work)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["train", *RELATIVE, *extra])
    finally:
        os.chdir(here)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def relative_run(tmp_path_factory):
    """A one-step run trained from ``work/`` with relative data paths: (work, run dir, stdout, stderr)."""
    work = tmp_path_factory.mktemp("work")
    write_laps_dataset(work / "laps")
    code, out, err = _train_in(work, "name=rel")
    assert code == 0, err
    return work, work / "runs" / "rel", out, err


def test_a_runs_relative_data_paths_are_recorded_absolute_so_it_resumes_and_evaluates_anywhere(
    relative_run, tmp_path, monkeypatch, capsys
):
    """Old code: config.yaml said root: laps; from another directory --resume failed with "data.root=laps: no
    such directory" and data.root=/abs/laps was refused as a change."""
    work, run, _, _ = relative_run
    data = yaml.safe_load((run / "config.yaml").read_text())["data"]
    assert (data["root"], data["image_root"]) == (str(work / "laps"), str(work / "laps" / "images"))
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--resume", str(run), "train.max_steps=2"]) == 0, capsys.readouterr().err
    assert main(["eval", str(run), "--out", str(tmp_path / "e.json")]) == 0, capsys.readouterr().err


def test_train_says_where_the_run_went(relative_run):
    """Old code: neither a run_dir in the summary on stdout nor a `written:` line on stderr."""
    _, _, out, err = relative_run
    assert json.loads(out)["run_dir"] == os.path.join("runs", "rel")
    assert f"written: {os.path.join('runs', 'rel')}" in err.splitlines()


def test_a_run_recorded_with_relative_paths_says_where_to_run_it_from(tmp_path, monkeypatch, capsys):
    """A run made before config.yaml recorded absolute paths keeps working from its own directory; from
    elsewhere, eval named neither key nor config.yaml ("caption file not found: laps/test_caps.txt") and
    --resume data.root=ABS was refused with no way out."""
    import patchword.runs.config as run_config

    work = tmp_path / "work"
    write_laps_dataset(work / "laps")
    with monkeypatch.context() as m:  # as an older version recorded them: as typed
        m.setattr(run_config, "resolve_run_paths", lambda cfg: cfg, raising=False)
        code, _, err = _train_in(work, "name=old")
    assert code == 0, err
    run = work / "runs" / "old"
    assert yaml.safe_load((run / "config.yaml").read_text())["data"]["root"] == "laps"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    assert main(["eval", str(run), "--out", str(tmp_path / "e.json")]) == 2
    config = run / "config.yaml"
    where = f"data.root=laps ({config}): no such directory in {elsewhere} (run from the directory the run was"
    assert one_error_line(capsys.readouterr().err).startswith(f"error: {where}")
    assert main(["train", "--resume", str(run), "train.max_steps=2"]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(f"error: {where}")
    assert main(["train", "--resume", str(run), f"data.root={work / 'laps'}"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: data.root: cannot change on --resume: the run reads its data from 'laps'")
    assert line.endswith("resume from the directory the run was created in")
    monkeypatch.chdir(work)  # from where it was made, as before
    assert main(["train", "--resume", str(run), "train.max_steps=2"]) == 0, capsys.readouterr().err
    assert main(["eval", str(run), "--out", str(tmp_path / "e.json")]) == 0, capsys.readouterr().err


def test_a_new_runs_local_files_and_directories_are_resolved_hub_ids_and_shipped_names_kept(
    tmp_path, monkeypatch
):
    """Every path a new run records: the data's, local backbones and vocabularies, GloVe, init_from."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bert").mkdir()
    (tmp_path / "w").mkdir()
    for name in ("vocab.txt", "glove.txt", "w/last.pt"):
        (tmp_path / name).write_text("")
    cfg = load_run_config(
        None,
        [
            "data.cache_dir=cache",
            "data.bert_vocab=vocab.txt",
            "data.vocab_path=cluttered-64",
            "model.hf_text=bert",
            "model.hf_vision=google/vit-base-patch16-224-in21k",
            "model.tiny_pretrained=cluttered-64",
            "model.gru.glove_path=glove.txt",
            "train.init_from=w/last.pt",
        ],
    )
    assert cfg.data.cache_dir == str(tmp_path / "cache")
    assert (cfg.data.bert_vocab, cfg.model.hf_text) == (str(tmp_path / "vocab.txt"), str(tmp_path / "bert"))
    assert (cfg.data.vocab_path, cfg.model.tiny_pretrained) == ("cluttered-64", "cluttered-64")
    assert cfg.model.hf_vision == "google/vit-base-patch16-224-in21k"  # no such folder here: a hub id
    assert (cfg.model.gru.glove_path, cfg.train.init_from) == (
        str(tmp_path / "glove.txt"),
        str(tmp_path / "w/last.pt"),
    )
    # a file that does not exist is named as typed by the check that refuses it
    assert load_run_config(None, ["train.init_from=nowhere.pt"]).train.init_from == "nowhere.pt"


def test_a_sweep_run_again_matches_its_bert_runs_and_those_recorded_with_relative_paths(
    tiny_hf, tmp_path, monkeypatch
):
    """Old code: a sweep member of a BERT run without data.bert_vocab (as the recipes now leave it) was
    refused on the sweep's next invocation ("data.bert_vocab '.../bert' -> ''"): config.yaml records the
    text encoder's vocabulary, the planned config had none. A member recorded with relative paths (an older
    version) still matches from where it was made."""
    from patchword.experiments.sweep_members import refuse_other_settings
    from patchword.runs.checks import resolve_bert_vocab
    from patchword.train.validate import check_config

    monkeypatch.chdir(tmp_path)
    paths = write_laps_dataset(Path("laps"))
    hf = [o for o in tiny_hf_laps_overrides(tiny_hf, paths, tmp_path) if not o.startswith("data.bert_vocab")]
    overrides = [*hf, "train.max_steps=1", "output_dir=runs"]
    new = load_run_config(None, [*overrides, "name=new"])
    check_config(new)  # what the run records
    save_config(new, tmp_path / "runs" / "new" / "config.yaml")
    refuse_other_settings(tmp_path / "runs" / "new", load_run_config(None, [*overrides, "name=new"]))
    assert new.data.bert_vocab == str(tiny_hf[0]) and new.data.size_augment is True
    old = apply_overrides(RunConfig(), [*overrides, "name=old"])  # as typed, relative
    resolve_bert_vocab(old)
    assert old.data.root == "laps" and old.data.size_augment is None
    save_config(old, tmp_path / "runs" / "old" / "config.yaml")
    refuse_other_settings(tmp_path / "runs" / "old", load_run_config(None, [*overrides, "name=old"]))
    with pytest.raises(ConfigError, match="was made with other settings"):  # still compared
        refuse_other_settings(
            tmp_path / "runs" / "old", load_run_config(None, [*overrides, "name=old", "seed=1"])
        )


def test_the_galleries_of_a_relative_and_an_absolute_data_root_are_one(tmp_path, monkeypatch):
    """An older run's relative data.root and a new run's absolute one name the same files (from the
    directory the older one was made in): one gallery, not two that a report would never compare."""
    from patchword.data.config import DataConfig
    from patchword.experiments.galleries import dataset_label, gallery_keys

    monkeypatch.chdir(tmp_path)
    old, new = (DataConfig(dataset="laps", root=root) for root in ("f30k", str(tmp_path / "f30k")))
    assert gallery_keys(old) == gallery_keys(new)
    assert dataset_label(old) == dataset_label(new) == f"laps ({tmp_path / 'f30k'})"


def test_the_bert_recipes_read_the_text_encoders_vocabulary_and_tgdt_no_caption_augmentation():
    """Old recipes: data.bert_vocab: bert-base-uncased whatever model.hf_text named, and the TGDT recipe
    trained with SEPS's caption augmentation (size_augment null: on for BERT), which its official data
    pipeline does not have (its importer records size_augment false)."""
    tgdt, seps = load_run_config("tgdt_f30k"), load_run_config("f30k_seps_vit224")
    assert tgdt.data.bert_vocab == seps.data.bert_vocab == ""
    assert tgdt.data.size_augment is False
    assert seps.data.size_augment is None  # SEPS keeps the official augmentation (on for BERT)


def test_a_bert_vocabulary_other_than_the_text_encoders_is_refused_naming_both(
    tiny_hf, laps_dataset, tmp_path, capsys
):
    """Old code: data.bert_vocab with other tokens at the text encoder's ids tokenised silently (each such
    word read through another word's embedding). One cut to the ids the encoder embeds is its own."""
    bert, _ = tiny_hf
    words = (bert / "vocab.txt").read_text().splitlines()
    words[5], words[6] = words[6], words[5]
    (tmp_path / "other.txt").write_text("\n".join(words[:20]) + "\n")
    argv = ["train", *tiny_hf_laps_overrides(tiny_hf, laps_dataset, tmp_path), "train.max_steps=1"]
    argv += [f"output_dir={tmp_path / 'runs'}", f"data.bert_vocab={tmp_path / 'other.txt'}"]
    assert main(argv) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == (
        f"error: data.bert_vocab: '{tmp_path / 'other.txt'}' is another vocabulary than model.hf_text's "
        f"('{bert}'): id 5 is 'w1' there, 'w0' in model.hf_text's; a run tokenises with its text encoder's "
        "vocabulary: leave data.bert_vocab out"
    )
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("given", ["f30k_seps_vit224", "f30k_seps_vit224.yaml"])
def test_config_falls_back_to_a_shipped_recipe_only_for_a_bare_name(given, tmp_path, monkeypatch, capsys):
    """Old code: --config mycfgs/f30k_seps_vit224.yaml (a typo in the folder) read the shipped recipe."""
    from patchword.runs.config import recipe_path

    monkeypatch.chdir(tmp_path)
    assert recipe_path(given).read_text() == recipe_path("f30k_seps_vit224").read_text()
    typo = tmp_path / "mycfgs" / "f30k_seps_vit224.yaml"
    assert main(["train", "--config", str(typo)]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(f"error: config file {typo} does not exist: ")
    assert main(["train", "--config", os.path.join("mycfgs", given)]) == 2
    assert (
        "(--config f30k_seps_vit224, without a directory, reads the shipped one)" in capsys.readouterr().err
    )


def test_a_resume_of_a_run_without_the_path_is_refused_without_quoting_an_empty_one(trained_tiny_run, capsys):
    """Old code: `--resume SYNTHETIC_RUN data.root=/x` said "the run reads its data from ''"."""
    assert main(["train", "--resume", str(trained_tiny_run), "data.root=/x"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: data.root: cannot change on --resume") and "''" not in line, line


def test_eval_names_a_missing_data_directory_before_it_loads_any_weights(
    relative_run, tmp_path, monkeypatch, capsys
):
    """Old code loaded the weights (every member's, in an ensemble, one after another's evaluation) before it
    looked for the split's files."""
    import patchword.runs

    def load_run(*args, **kwargs):
        raise AssertionError("weights loaded before the data files were checked")

    monkeypatch.setattr(patchword.runs, "load_run", load_run)
    _, run, _, _ = relative_run
    moved = tmp_path / "moved"
    assert main(["eval", str(run), f"data.image_root={moved}", "--out", str(tmp_path / "e.json")]) == 2
    assert one_error_line(capsys.readouterr().err) == f"error: data.image_root={moved}: no such directory"
