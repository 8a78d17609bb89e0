"""Bad input to ``sweep`` (and a run's name for ``train``): a ``--name`` that is not one plain directory
name, ``--seeds`` with an empty item, out of numpy's seed range or absurdly many, ``seed=`` among the
overrides (the sweep sets it per run), a name that is not UTF-8 text. Each ends in one ``error:`` line (exit
2) naming the flag or key, before any run starts or anything is written."""

from __future__ import annotations

import os

import pytest

from conftest import TINY_RUN_32, one_error_line
from patchword.cli import main
from patchword.errors import ConfigError
from patchword.experiments import sweep as sweep_module
from patchword.experiments.sweep import parse_seeds

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = [*TINY_RUN_32, "train.max_steps=2"]
#: The most seeds a sweep runs (sweep.MAX_SEEDS).
MAX_SEEDS = 1000


@pytest.fixture
def no_training(monkeypatch):
    """Fail the test if a run starts: the checks must come first."""

    def refuse(*args, **kwargs):
        raise AssertionError("a run started before the sweep's inputs were checked")

    monkeypatch.setattr("patchword.train.runner.train_run", refuse)
    monkeypatch.setattr("patchword.data.prepare.load_raw_data", refuse)
    monkeypatch.setattr("patchword.train.runner.load_raw_data", refuse)


@pytest.mark.parametrize("name", ["..", ".", "a/b", "", " ", "\udcff", "ABSOLUTE"])
def test_a_sweep_name_that_is_not_one_plain_directory_name_is_refused(tmp_path, capsys, no_training, name):
    """f715cbc: `--name ..` wrote sweep.json and seed-0/ into output_dir's parent, `--name /abs` anywhere
    (and cleared a seed-0/ it found there), `--name a/b` nested, a name of bytes that are not UTF-8 was
    stored as a surrogate nothing could read back."""
    out, victim = tmp_path / "out", tmp_path / "victim"
    out.mkdir()
    (victim / "seed-0").mkdir(parents=True)
    (victim / "seed-0" / "notes.txt").write_text("mine")
    name = str(victim) if name == "ABSOLUTE" else name
    code = main(["sweep", "--seeds", "0", "--name", name, *TINY, f"output_dir={out}"])
    line = one_error_line(capsys.readouterr().err)
    assert code == 2 and line.startswith("error: --name: is the sweep's directory under output_dir")
    assert os.listdir(out) == [] and sorted(os.listdir(tmp_path)) == ["out", "victim"]
    assert (victim / "seed-0" / "notes.txt").read_text() == "mine"


def test_a_sweep_name_from_a_run_name_with_a_slash_is_refused(tmp_path, capsys, no_training):
    """Without --name the sweep's directory is NAME-sweep: `name=x/y` made x/y-sweep, nested."""
    code = main(["sweep", "--seeds", "0", *TINY, f"output_dir={tmp_path}", "name=x/y"])
    line = one_error_line(capsys.readouterr().err)
    assert code == 2 and line.startswith("error: name: ") and "'x/y'" in line
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("name", ["\udcff", "caf\udce9"])
def test_a_run_name_that_is_not_utf8_text_is_refused(tmp_path, capsys, name):
    """f715cbc: `train name=$'\\xff'` trained and stored "\\uDCFF" in config.yaml: report and export then
    failed on the run."""
    code = main(["train", *TINY, f"output_dir={tmp_path}", f"name={name}"])
    line = one_error_line(capsys.readouterr().err)
    assert code == 2 and line.startswith("error: name: is the run's directory under output_dir")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("seeds", "expected"),
    [
        ("1,,2", "an empty item"),
        ("1,2,", "an empty item"),
        (",1", "an empty item"),
        ("-1", "numpy's seed range"),
        ("4294967296", "numpy's seed range"),
        ("0-4294967296", "numpy's seed range"),
        ("5-2", "runs backwards"),
        (f"0-{MAX_SEEDS}", f"is {MAX_SEEDS + 1} seeds: a sweep runs at most {MAX_SEEDS}"),
        ("0-99999999", "is 100000000 seeds"),
    ],
)
def test_seeds_are_checked_before_any_range_is_built(monkeypatch, seeds, expected):
    """f715cbc built `list(range(...))` for `--seeds 0-99999999` before any check (it ran for minutes,
    printing nothing) and took `1,,2` for `1,2`."""
    real_range = range

    def small_range(*args):
        built = real_range(*args)
        assert len(built) <= MAX_SEEDS, "a range of seeds was built before its size was checked"
        return built

    monkeypatch.setattr(sweep_module, "range", small_range, raising=False)
    with pytest.raises(ConfigError, match=expected) as refused:
        parse_seeds(seeds)
    assert refused.value.key == "--seeds"


def test_good_seeds_still_parse():
    assert sweep_module.MAX_SEEDS == MAX_SEEDS
    assert parse_seeds("0-2,5") == [0, 1, 2, 5]
    assert parse_seeds(" 3 , 1 ") == [3, 1]
    assert parse_seeds(f"0-{MAX_SEEDS - 1}") == list(range(MAX_SEEDS))
    assert parse_seeds("4294967295") == [2**32 - 1]


def test_empty_seeds_on_the_command_line_are_refused(tmp_path, capsys, no_training):
    code = main(["sweep", "--seeds", "1,,2", *TINY, f"output_dir={tmp_path}"])
    assert code == 2 and one_error_line(capsys.readouterr().err).startswith("error: --seeds: ")
    assert os.listdir(tmp_path) == []


def test_a_seed_override_is_refused_not_dropped(tmp_path, capsys, no_training):
    """f715cbc dropped `seed=3` without a word: every run took its seed from --seeds."""
    code = main(["sweep", "--seeds", "0", *TINY, f"output_dir={tmp_path}", "seed=3"])
    line = one_error_line(capsys.readouterr().err)
    assert code == 2 and line.startswith("error: seed: ") and "--seeds" in line and "seed=3" in line
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("item", ["seed=3", "output_dir=/tmp/elsewhere", "name=other"])
def test_a_variant_overriding_what_the_sweep_sets_is_refused(tmp_path, capsys, no_training, item):
    code = main(["sweep", "--seeds", "0", "--variant", f"v: {item}", *TINY, f"output_dir={tmp_path}"])
    line = one_error_line(capsys.readouterr().err)
    assert code == 2 and line.startswith("error: --variant: v: ") and repr(item) in line
    assert os.listdir(tmp_path) == []


def test_a_variant_named_runs_is_refused(tmp_path, capsys, no_training):
    """sweep.json keeps a sweep without variants under "runs": a variant of that name shared its key."""
    code = main(
        ["sweep", "--seeds", "0", "--variant", "runs: train.lr=1e-4", *TINY, f"output_dir={tmp_path}"]
    )
    line = one_error_line(capsys.readouterr().err)
    assert code == 2 and line.startswith("error: --variant: 'runs' is the name of a sweep without variants")
    assert os.listdir(tmp_path) == []


@pytest.fixture
def sweep_call(monkeypatch, tmp_path):
    """The ``(seeds, overrides)`` the sweep would run (nothing runs)."""
    called: list[tuple[list[int], list[str]]] = []

    def fake_run_sweep(config, seeds, overrides, **kwargs):
        called.append((seeds, overrides))
        return {"directory": str(tmp_path / "sweep"), "summary": {}, "variants": {}}

    monkeypatch.setattr(sweep_module, "run_sweep", fake_run_sweep)
    return called


@pytest.mark.parametrize(
    ("argv", "seeds", "overrides"),
    [
        (["--seeds", "0", "1", "2"], [0, 1, 2], []),
        (["--seeds", "0,1,2"], [0, 1, 2], []),
        (["--seeds", "0-1", "5,7", "9"], [0, 1, 5, 7, 9], []),
        (
            ["--seeds", "3", "1", "train.max_steps=2", "train.lr=1e-3"],
            [3, 1],
            ["train.max_steps=2", "train.lr=1e-3"],
        ),
        (
            ["seed_x=1", "--seeds", "0", "1", "train.lr=1e-3", "--name", "n"],
            [0, 1],
            ["seed_x=1", "train.lr=1e-3"],
        ),
        (["--seeds", "0", "1", "--name", "n", "train.lr=1e-3"], [0, 1], ["train.lr=1e-3"]),
    ],
)
def test_seeds_take_space_separated_parts_as_the_other_verbs_list_options(
    sweep_call, capsys, argv, seeds, overrides
):
    """Old code: `--seeds 0 1 2` swept seed 0 alone and handed `1`, `2` on as overrides (the other verbs'
    lists, `eval --ensemble A B`, are space-separated). The overrides after the seeds stay overrides."""
    assert main(["sweep", *argv]) == 0
    assert sweep_call == [(seeds, overrides)]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["0,1", "1"], "error: --seeds: expected distinct seeds, got '0,1 1'"),
        (["0-2", "2-3"], "error: --seeds: expected distinct seeds, got '0-2 2-3'"),
        (["0", "1,,2"], "error: --seeds: an empty item in '1,,2'"),
        (["0", "5-2"], "error: --seeds: the range 5-2 runs backwards"),
        (
            [f"0-{MAX_SEEDS - 1}", f"{MAX_SEEDS}"],
            f"error: --seeds: '0-{MAX_SEEDS - 1} {MAX_SEEDS}' is 1001 seeds",
        ),
        (["train.lr=1e-3"], "error: --seeds: names no seed: 'train.lr=1e-3' is an override"),
    ],
)
def test_space_separated_seeds_are_checked_as_one_list(sweep_call, capsys, argv, expected):
    """A seed in two parts is refused as a seed twice in one part is."""
    assert main(["sweep", "--seeds", *argv]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(expected)
    assert sweep_call == []
