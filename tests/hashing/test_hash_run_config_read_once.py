"""A trained run's config.yaml is read once by each function that opens it: ``open_hashing_run`` (``hash
eval`` / ``hash search``) parsed it three times (the kind check, the config with the overrides, the run's
own data section for the re-split check), ``resume_config`` twice, and ``hash eval`` / ``hash search`` with
a ``data.*`` override read it once more for the data source check. A resume parses the config its last.pt
records once. What is built from the one read is the config the old reads built, and a damaged
config.yaml is still one error line naming the file."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import one_error_line
from patchword.cli.hash import main
from patchword.config import load_config
from patchword.errors import ConfigError
from patchword.hashing import HashRunConfig
from patchword.hashing.runner import open_hashing_run, resume_config

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def config_reads(monkeypatch) -> list[Path]:
    """The config.yaml files read from now on (every YAML read goes through ``readers._read_text``)."""
    import patchword.readers as readers

    reads: list[Path] = []
    read_text = readers._read_text

    def counting(path, what):
        if Path(path).name == "config.yaml":
            reads.append(Path(path))
        return read_text(path, what)

    monkeypatch.setattr(readers, "_read_text", counting)
    return reads


def test_open_hashing_run_reads_config_yaml_once(hash_run, config_reads):
    """Defect: three reads of one file (the kind check, the config, the re-split check's own copy)."""
    run = open_hashing_run(hash_run, ["eval.topk=10"])
    assert config_reads == [hash_run / "config.yaml"]
    # the config of the one read: the file's with the overrides, as load_config builds it
    assert run.cfg == load_config(HashRunConfig, hash_run / "config.yaml", ["eval.topk=10"])
    assert run.cfg.eval.topk == 10 and run.cfg.model.bits == 16


def test_open_hashing_run_still_refuses_a_resplit_from_the_one_read(hash_run, config_reads):
    """The re-split check compares with the run's own data section, now the one read's."""
    with pytest.raises(
        ConfigError, match=r"^data\.synthetic_seed: cannot change on hash eval of a trained run"
    ):
        open_hashing_run(hash_run, ["data.synthetic_seed=3"])
    assert config_reads == [hash_run / "config.yaml"]


def test_resume_config_reads_config_yaml_once(hash_run, config_reads):
    """Defect: two reads (the kind check, then the config)."""
    cfg = resume_config(hash_run, ["train.epochs=3"])
    assert config_reads == [hash_run / "config.yaml"]
    assert cfg == load_config(HashRunConfig, hash_run / "config.yaml", ["train.epochs=3"])


@pytest.mark.parametrize("command", ["eval", "search"])
def test_hash_eval_and_search_with_a_data_override_read_config_yaml_once(
    pair_run, config_reads, capsys, command
):
    """Defect: a data source override (data.image=NEW, where the run's data lie now) had config.yaml read
    twice, once for the check that the run's format reads the key, then again to open the run. The check
    is made on the one read, and still refuses a key the format would ignore."""
    image = pair_run.parent.parent / "image.npy"
    search = ["--modality", "image", "--query-index", "0", "--k", "2"] if command == "search" else []
    assert main([command, str(pair_run), f"data.image={image}", *search]) == 0
    assert config_reads == [pair_run / "config.yaml"]
    capsys.readouterr()
    config_reads.clear()
    assert main([command, str(pair_run), "data.root=/x", *search]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: data.root: data.format=pairs reads data.image and data.text"), line
    assert config_reads == [pair_run / "config.yaml"]


def test_a_resume_parses_the_config_its_last_pt_records_once(hash_run, tmp_path, monkeypatch):
    """Defect: last.pt's config was parsed twice on a resume (for the session's resumable keys, then for
    the edited-config check), behind a guard saying it may be missing that the second parse ignored."""
    import patchword.hashing.runner as runner

    run = Path(shutil.copytree(hash_run, tmp_path / "r"))
    parsed = []
    from_dict = runner.from_dict
    monkeypatch.setattr(runner, "from_dict", lambda cls, d: parsed.append(cls) or from_dict(cls, d))
    assert main(["train", "--resume", str(run), "--epochs", "2"]) == 0
    assert parsed == [HashRunConfig]


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda text: "model: [\n", "{path}: not a run config: invalid YAML"),
        (lambda text: "- 1\n- 2\n", "{path}: not a run config: expected a mapping, found list"),
        (lambda text: text.replace("bits: 16", "bits: sixteen"), "model.bits: "),
        (lambda text: "frob: 1\n" + text, "frob: "),
    ],
    ids=["invalid-yaml", "a-list", "a-wrong-value", "an-unknown-key"],
)
@pytest.mark.parametrize("command", ["eval", "search", "resume"])
def test_a_damaged_config_yaml_is_one_line_naming_it(hash_run, tmp_path, capsys, damage, expected, command):
    run = tmp_path / "r"
    shutil.copytree(hash_run, run)
    path = run / "config.yaml"
    path.write_text(damage(path.read_text()))
    argv = {
        "eval": ["eval", str(run)],
        "search": ["search", str(run), "--modality", "image", "--query-index", "0"],
        "resume": ["train", "--resume", str(run), "--epochs", "2"],
    }[command]
    assert main(argv) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {expected.format(path=path)}"), line
    assert str(path) in line, line
