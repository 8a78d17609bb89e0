"""The one-line errors of input that used to be reported vaguely or wrongly, each naming the flag, config
key, file or line it concerns: an unknown option before the command, a hashing data.root that is missing
or of the wrong kind, a --vocab that is not a word2idx vocabulary, a log that is not UTF-8 from some line
on, a directory where a file is expected, an output location that takes no files, and a "% of peak" of a
peak below the rate it is a percentage of."""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import pickle
from pathlib import Path

import pytest
import torch
import yaml

from conftest import TINY_RUN_32, one_error_line
from patchword.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


def _tree(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


# ------------------------------------------------------------------------------------------- patchword


@pytest.mark.parametrize("argv", [["--frob"], ["-v", "--frob"], ["--frob", "-v"]])
def test_an_unknown_option_without_a_command_is_named(argv, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("patchword: error: unknown option --frob: "), last
    assert "required" not in last


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], "the following arguments are required: COMMAND"),
        (["-v"], "the following arguments are required: COMMAND"),
        (["--verb"], "the following arguments are required: COMMAND"),  # --verbose, abbreviated
        (["--frob", "train"], "unrecognized arguments: --frob"),
    ],
)
def test_argparse_keeps_its_own_errors_where_they_name_the_problem(argv, expected, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"patchword: error: {expected}"


@pytest.mark.parametrize(
    ("argv", "usage", "expected"),
    [
        (
            ["eval", "runs/x", "--sute", "compositional"],
            "usage: patchword eval",
            "--sute compositional (did you mean --suite?)",
        ),
        (["train", "--confg", "demo"], "usage: patchword train", "--confg (did you mean --config?)"),
        (["eval", "runs/x", "--zzz"], "usage: patchword eval", "--zzz"),
    ],
)
def test_a_mistyped_option_of_a_verb_gets_the_verb_s_usage_and_the_closest_option(
    argv, usage, expected, capsys
):
    """It got the top-level usage (``patchword [-h] [-v] COMMAND ...``) and no suggestion."""
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    verb = argv[0]
    assert err.startswith(usage), err
    assert err.strip().splitlines()[-1] == f"patchword {verb}: error: unrecognized arguments: {expected}"


# ------------------------------------------------------------------------------------- hash data.root


def _hash_train(tmp_path: Path, *flags: str) -> list[str]:
    return ["hash", "train", *flags, "--output-dir", str(tmp_path / "runs"), "--name", "a"]


def test_hash_data_root_missing_or_of_the_wrong_kind_names_the_key(tmp_path, capsys, monkeypatch):
    folder, mat = tmp_path / "feats", tmp_path / "feats.mat"
    folder.mkdir()
    mat.write_bytes(b"")
    monkeypatch.chdir(tmp_path)  # an empty root read the working directory: "error: . does not exist"
    cases = [
        (["--data", "mat"], "data.root: data.format=mat needs data.root (--root): a .mat file of features"),
        (
            ["--data", "mat", "--root", "feats"],
            "data.root: feats is a directory; data.format=mat reads a .mat",
        ),
        (
            ["--data", "mat", "--root", "none.mat"],
            "data.root: none.mat does not exist; data.format=mat reads",
        ),
        (["--data", "splits"], "data.root: data.format=splits needs data.root (--root): the directory of "),
        (["--data", "splits", "--root", "feats.mat"], "data.root: feats.mat is a file; data.format=splits"),
    ]
    for flags, expected in cases:
        assert main(_hash_train(tmp_path, *flags)) == 2, flags
        line = one_error_line(capsys.readouterr().err)
        assert line.startswith(f"error: {expected}"), (flags, line)
    assert _tree(tmp_path) == ["feats", "feats.mat"]


def test_hash_search_query_that_is_a_directory_says_so(tmp_path, capsys):
    (tmp_path / "q").mkdir()
    argv = ["hash", "search", str(tmp_path / "run"), "--modality", "image", "--query", str(tmp_path / "q")]
    assert main(argv) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"{tmp_path / 'q'} is a directory, not a file" in line and "does not exist" not in line, line


# --------------------------------------------------------------------------------------- import --vocab


def _scan_helpers():
    """The official-checkpoint builders of tests/imports/test_import_scan_naaf.py."""
    path = Path(__file__).parents[1] / "imports" / "test_import_scan_naaf.py"
    spec = importlib.util.spec_from_file_location("scan_naaf_helpers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


NOT_A_VOCABULARY = {
    "a json list": (b'["<pad>", "<start>", "<end>", "<unk>", "a"]', "it is a json list"),
    "a text file of words": (b"<pad>\n<start>\n<end>\n<unk>\na\n", "it is text starting '<pad>'"),
    "not UTF-8": (
        b"\xff\xfe<\x00p\x00a\x00d\x00",
        "it is binary data that is neither UTF-8 text nor a pickle",
    ),
    "empty": (b"", "it is empty"),
}


@pytest.mark.parametrize("kind", NOT_A_VOCABULARY)
def test_a_vocab_that_is_no_word2idx_vocabulary_says_so_naming_the_flag(kind, tmp_path, capsys):
    helpers = _scan_helpers()
    ckpt = tmp_path / "scan.pth.tar"
    torch.save(helpers.official_checkpoint(helpers.scan_opt()), ckpt)
    content, found = NOT_A_VOCABULARY[kind]
    vocab = tmp_path / "vocab.bin"
    vocab.write_bytes(content)
    out = tmp_path / "run"
    assert main(["import", str(ckpt), "--out", str(out), "--vocab", str(vocab)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == (
        f"error: --vocab {vocab} is not a word2idx vocabulary (a json object or a pickle of a dict or "
        f"Vocabulary): {found}"
    )
    assert "refused to unpickle" not in line and not out.exists()


def test_a_vocab_directory_and_a_refused_pickle_keep_their_own_words(tmp_path):
    from patchword.errors import DataError, MissingFileError
    from patchword.imports.scan_naaf import read_official_vocab

    with pytest.raises(
        MissingFileError,
        match=r"^--vocab .*vocab is a directory, not a file: --vocab names the official vocabulary file",
    ):
        (tmp_path / "vocab").mkdir()
        read_official_vocab(tmp_path / "vocab")

    class Payload:
        def __reduce__(self):
            return (os.makedirs, (str(tmp_path / "pwned"),))

    (tmp_path / "vocab.pkl").write_bytes(pickle.dumps(Payload(), protocol=2))
    with pytest.raises(DataError, match=r"refused to unpickle \(class os.makedirs is not allowed\)"):
        read_official_vocab(tmp_path / "vocab.pkl")
    assert not (tmp_path / "pwned").exists()


# ------------------------------------------------------------------------------------- text not UTF-8


def _fake_run(root: Path) -> Path:
    """A run directory as `patchword report` reads it: config, summary and a metrics log of 3 records."""
    from patchword.config import config_to_dict
    from patchword.runs.config import RunConfig

    run = root / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(config_to_dict(RunConfig())))
    (run / "summary.json").write_text(json.dumps({"rsum": 1.0}))
    records = [{"split": "train", "step": step, "loss": 1.0} for step in (1, 2, 3)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def test_report_names_the_line_of_a_metrics_log_that_is_not_utf8(tmp_path, capsys):
    run = _fake_run(tmp_path)
    metrics = run / "metrics.jsonl"
    good = metrics.read_bytes()
    metrics.write_bytes(good + b"\xff\n")
    assert main(["report", str(run), "--out", str(tmp_path / "report.md")]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: {metrics}:4: not a metrics log: not UTF-8 text (byte 0xff at offset {len(good)})"
    )
    assert not (tmp_path / "report.md").exists()


def test_a_file_not_utf8_from_its_first_byte_is_binary_data(tmp_path):
    from patchword.errors import DataError
    from patchword.readers import read_json, read_json_lines

    (tmp_path / "x.json").write_bytes(b"\x89PNG\r\n")
    with pytest.raises(DataError, match=r"x.json: not a summary: binary data$"):
        read_json(tmp_path / "x.json", "summary")
    (tmp_path / "m.jsonl").write_bytes(b'{"step": 1}\n{"step": "\xe9"}\n')
    with pytest.raises(
        DataError, match=r"m.jsonl:2: not a metrics log: not UTF-8 text \(byte 0xe9 at offset 22\)"
    ):
        read_json_lines(tmp_path / "m.jsonl", "metrics log")


# ------------------------------------------------------------------------ a directory, not a file


def test_a_directory_where_a_file_is_expected_is_not_called_missing(tmp_path, capsys, monkeypatch):
    from patchword.errors import MissingFileError
    from patchword.readers import read_json, read_json_lines

    (tmp_path / "adir").mkdir()
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--config", "adir"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: config file adir is a directory, not a file: the shipped recipes are "), (
        line
    )
    for read in (read_json, read_json_lines):
        with pytest.raises(MissingFileError, match=r"^metrics log adir is a directory, not a file$"):
            read(Path("adir"), "metrics log")


@pytest.mark.parametrize("where", ["load_config", "checkpoint", "sugarcrepe", "glove"])
def test_the_other_readers_of_a_file_say_a_directory_is_one(tmp_path, where):
    """Bug: each said "... does not exist" of a directory that is there."""
    from patchword.config import load_config
    from patchword.encoders.rnn import load_glove
    from patchword.eval.compositional import _sugarcrepe_records
    from patchword.runs.config import RunConfig
    from patchword.runs.load import resolve_checkpoint

    adir = tmp_path / "adir"
    adir.mkdir()
    calls = {
        "load_config": lambda: load_config(RunConfig, adir),
        "checkpoint": lambda: resolve_checkpoint(tmp_path, adir),
        "sugarcrepe": lambda: _sugarcrepe_records(adir),
        "glove": lambda: load_glove(adir, ["a"], 1, 4),
    }
    with pytest.raises(FileNotFoundError, match=f"{adir} is a directory, not a"):  # MissingFileError too
        calls[where]()


def test_report_gallery_that_is_a_directory_says_so(tmp_path, capsys):
    (tmp_path / "adir").mkdir()
    out = tmp_path / "r.md"
    assert main(["report", str(tmp_path), "--gallery", str(tmp_path / "adir"), "--out", str(out)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == (
        f"error: --gallery {tmp_path / 'adir'} is a directory, not a file: "
        "--gallery names a gallery JSON file"
    )


def test_a_lock_in_a_folder_that_takes_no_files_is_an_error_not_a_spin(tmp_path, monkeypatch):
    """Bug: creating the lock file in a folder that exists but takes no new file (/proc answers ENOENT)
    was retried for ever (densify --out /proc/y.jsonl hung)."""
    from patchword import locks

    path = str(tmp_path / "out.lock")
    real_open, made = os.open, []

    def no_new_file(name, flags, *args):
        if name == path:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), name)
        return real_open(name, flags, *args)

    def make_folder():
        made.append(1)
        if len(made) > 1000:  # the old loop: stop it here instead of hanging the suite
            raise RuntimeError("the lock kept retrying")

    monkeypatch.setattr(os, "open", no_new_file)
    with pytest.raises(FileNotFoundError, match="cannot create the lock file"):
        locks.lock_removable_file(path, "busy", make_folder)
    assert len(made) == locks._LOCK_ATTEMPTS


# ------------------------------------------------------------------- output locations that take no files


def _refuse(monkeypatch, code: int, *names: str) -> None:
    def refuse(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    for name in names:
        monkeypatch.setattr(name, refuse)


def test_train_into_a_folder_that_takes_no_files_names_the_path_and_why(tmp_path, capsys, monkeypatch):
    """/proc answers ENOENT to a new file: this was "error: [Errno 2] cannot write here: No such file or
    directory: '/proc'", as if /proc did not exist."""
    from patchword.data import prepare

    target = tmp_path / "proc" / "x"
    (tmp_path / "proc").mkdir()
    _refuse(monkeypatch, errno.ENOENT, "tempfile.mkstemp")
    monkeypatch.setattr(prepare, "load_raw_data", lambda *a, **k: pytest.fail("data loaded before the probe"))
    assert main(["train", *TINY_RUN_32, f"output_dir={target}", "name=x"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == (
        f"error: output_dir: cannot create {target}: {tmp_path / 'proc'} takes no new files: No such file or "
        "directory (ENOENT)"
    )
    assert _tree(tmp_path) == ["proc"]


def test_probe_writable_of_an_existing_folder_keeps_its_words(tmp_path, monkeypatch):
    from patchword.errors import describe_os_error
    from patchword.fileio import probe_writable

    _refuse(monkeypatch, errno.EACCES, "tempfile.mkstemp")
    with pytest.raises(PermissionError) as refused:
        probe_writable(tmp_path)
    assert describe_os_error(refused.value) == f"{tmp_path}: cannot write here: Permission denied (EACCES)"


def test_data_export_into_a_folder_that_takes_no_files_names_out_not_a_temp_path(
    tmp_path, capsys, monkeypatch
):
    from patchword.data import export

    out = tmp_path / "exs"
    _refuse(monkeypatch, errno.EPERM, "tempfile.mkstemp", "tempfile.mkdtemp")
    monkeypatch.setattr(export, "generate_split", lambda *a, **k: pytest.fail("rendered before the check"))
    assert main(["data", "export", "synthetic", "--out", str(out)]) == 2
    line = one_error_line(capsys.readouterr().err)
    reason = "cannot write here: Operation not permitted (EPERM)"
    assert line == f"error: --out: {out} cannot be created: {tmp_path}: {reason}"
    assert ".tmp-" not in line and _tree(tmp_path) == []


# ----------------------------------------------------------------------------------------- % of peak


def _scoring_entry(engine_gflops: float) -> dict:
    return {
        "engine_us_per_pair": 12.34,
        "reference_us_per_pair": 150.6,
        "speedup": 12.2,
        "engine_gflops": engine_gflops,
        "reference_gflops": 0.3,
        "engine_mflop_per_pair": 7.1,
        "reference_mflop_per_pair": 35.2,
        "engine_peak_tensor_mb": 81.4,
        "f30k_engine_s": 61.7,
        "f30k_reference_s": 753.0,
        "max_abs_diff_vs_reference": 8.9e-8,
    }


def test_no_percentage_of_a_peak_below_the_engine_rate(capsys):
    """`bench scoring --peak-size 64` printed "2.2 / 0.3 (4936%)": a small matmul is no ceiling."""
    from patchword.bench import format_scoring

    result = {
        "peak_gflops": 0.0446,
        "peak_gflops_end": 0.04,
        "configs": {"seps": _scoring_entry(2.2), "slow": _scoring_entry(0.02)},
    }
    lines = format_scoring(result).splitlines()
    assert "(engine % of peak)" in lines[0]
    assert "| 2.2 / 0.3 (above the measured peak) |" in lines[2]
    assert "| 0.0 / 0.3 (45%) |" in lines[3]  # 0.02 of 0.0446: below the peak, a true percentage
    assert lines[4:] == [
        "",
        "The fp32 matmul peak measured (0.04 GFLOP/s) is below the engine's rate in seps: that matmul was "
        "too small to reach the machine's peak (a larger --peak-size measures it), so no % of peak is shown "
        "there.",
    ]
