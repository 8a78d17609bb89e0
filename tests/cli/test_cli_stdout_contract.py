"""What a script around the CLI reads: results on stdout (one JSON document where a verb prints JSON, so
``| jq`` and ``> file`` work), ``written: FILE`` lines and tables for people on stderr, and ``-`` as an
output file meaning stdout in every verb that takes it (``eval --out``, ``hash eval|search --out``) and
refused, in one line, where the output cannot be stdout (``report``, ``export``, ``densify``): never a
file named ``-``. Also densify's ``stats --json`` shape, ``--no-merge`` outside torchrun and ``-v``
before a sub-verb."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import one_error_line
from patchword.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


def _tree(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


def _written(err: str) -> list[str]:
    """The files the one ``written:`` line of ``err`` names."""
    lines = [line for line in err.splitlines() if line.startswith("written: ")]
    assert len(lines) == 1, err
    return lines[0].removeprefix("written: ").split(", ")


# --------------------------------------------------------------------------------------------------------
# patchword eval
# --------------------------------------------------------------------------------------------------------


def test_eval_out_dash_prints_the_record_and_writes_no_file(trained_tiny_run, tmp_path, monkeypatch, capsys):
    """Old code: a file named ``-`` in the working directory, and ``written: -`` on stderr."""
    monkeypatch.chdir(tmp_path)
    before = _tree(trained_tiny_run)
    assert main(["eval", str(trained_tiny_run), "--out", "-"]) == 0
    printed = capsys.readouterr()
    record = json.loads(printed.out)  # stdout: the record alone
    assert record["split"] == "test" and record["rsum"] >= 0 and "checkpoint_sha256" in record
    assert "written:" not in printed.err
    assert _tree(tmp_path) == set() and _tree(trained_tiny_run) == before  # no file anywhere


def test_eval_out_dash_refuses_force(trained_tiny_run, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["eval", str(trained_tiny_run), "--out", "-", "--force"]) == 2
    assert one_error_line(capsys.readouterr().err).startswith("error: --force: ")
    assert _tree(tmp_path) == set()


def test_eval_suite_prints_one_json_document_and_its_table_on_stderr(trained_tiny_run, tmp_path, capsys):
    """Old code: stdout held the text table and ``written: FILE``, so ``| jq`` failed."""
    out = tmp_path / "suite.json"
    assert main(["eval", str(trained_tiny_run), "--suite", "compositional", "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert json.loads(printed.out) == json.loads(out.read_text())
    assert _written(printed.err) == [str(out)]
    assert "attribute_swap" in printed.err and "chance 50" in printed.err  # the table, for people


def test_eval_suite_out_dash_writes_no_file(trained_tiny_run, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    before = _tree(trained_tiny_run)
    assert main(["eval", str(trained_tiny_run), "--suite", "compositional", "--out", "-"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["suite"] == "compositional" and "attribute_swap" in record
    assert _tree(tmp_path) == set() and _tree(trained_tiny_run) == before


# --------------------------------------------------------------------------------------------------------
# patchword hash eval | search
# --------------------------------------------------------------------------------------------------------


def test_hash_eval_out_dash_is_stdout_every_time(hash_run, tmp_path, monkeypatch, capsys):
    """Old code: a file named ``-``; the second command said ``- exists; pass --force``."""
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        assert main(["hash", "eval", str(hash_run), "--out", "-"]) == 0
        printed = capsys.readouterr()
        assert "i2t_p@1" in json.loads(printed.out) and "written:" not in printed.err
    assert _tree(tmp_path) == set()


def test_hash_eval_out_file_says_written_on_stderr(hash_run, tmp_path, capsys):
    out = tmp_path / "m.json"
    assert main(["hash", "eval", str(hash_run), "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert json.loads(printed.out) == json.loads(out.read_text())  # stdout gets it too, as in eval
    assert _written(printed.err) == [str(out)]


SEARCH = ["--modality", "image", "--query-index", "0", "1", "--k", "3"]


def test_hash_search_out_file_prints_the_results_too(hash_run, tmp_path, capsys):
    """Old code: ``--out F`` wrote the results instead of printing them (``hash eval`` wrote and printed)."""
    out = tmp_path / "hs.json"
    assert main(["hash", "search", str(hash_run), *SEARCH, "--out", str(out)]) == 0
    printed = capsys.readouterr()
    results = json.loads(printed.out)
    assert results == json.loads(out.read_text()) and [r["query"] for r in results["results"]] == [0, 1]
    assert _written(printed.err) == [str(out)]


def test_hash_search_out_dash_is_stdout(hash_run, tmp_path, monkeypatch, capsys):
    """Old code: stdout was empty and a file named ``-`` held the results."""
    monkeypatch.chdir(tmp_path)
    assert main(["hash", "search", str(hash_run), *SEARCH, "--out", "-"]) == 0
    printed = capsys.readouterr()
    assert len(json.loads(printed.out)["results"]) == 2 and "written:" not in printed.err
    assert _tree(tmp_path) == set()


# --------------------------------------------------------------------------------------------------------
# patchword report | export
# --------------------------------------------------------------------------------------------------------


def test_report_names_every_file_it_wrote_on_stderr(trained_tiny_run, tmp_path, capsys):
    """Old code: ``written: rep.md, rep.html`` on stdout, though the two figures were written too."""
    out = tmp_path / "rep.md"
    assert main(["report", str(trained_tiny_run), "--out", str(out), "--csv", str(tmp_path / "r.csv")]) == 0
    printed = capsys.readouterr()
    assert printed.out == ""
    written = _written(printed.err)
    assert {Path(p).name for p in written} == _tree(tmp_path)
    assert {"rep.md", "rep.html", "rep_curves.png", "r.csv"} <= _tree(tmp_path)


def test_export_says_written_on_stderr(trained_tiny_run, tmp_path, capsys):
    out = tmp_path / "model"
    assert main(["export", str(trained_tiny_run), str(out)]) == 0
    printed = capsys.readouterr()
    assert printed.out == "" and printed.err.splitlines()[-1].startswith(f"written: {out} (")


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["report", "RUN", "--out", "-"], "--out"),
        (["report", "RUN", "--csv", "-"], "--csv"),
        (["export", "RUN", "-"], "OUT"),
        (["densify", "--synthetic", "test", "--model", "tiny-random", "--out", "-"], "--out"),
        (["densify", "merge", "a.jsonl", "--out", "-"], "--out"),
    ],
)
def test_a_dash_where_the_output_cannot_be_stdout_is_refused(
    argv, flag, trained_tiny_run, tmp_path, monkeypatch, capsys
):
    """Old code: a file (or directory) named ``-``."""
    monkeypatch.chdir(tmp_path)
    argv = [str(trained_tiny_run) if a == "RUN" else a for a in argv]
    assert main(argv) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {flag}: - (stdout) is not taken here"), line
    assert _tree(tmp_path) == set()


# --------------------------------------------------------------------------------------------------------
# patchword densify
# --------------------------------------------------------------------------------------------------------


def _dense_file(path: Path) -> Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in ("a red circle", "a blue square")))
    return path


def test_densify_stats_json_has_one_shape_for_one_file_and_several(tmp_path, capsys):
    """Old code: one file printed its report alone (``{"count": 2, ...}``), two a mapping by path."""
    a, b = _dense_file(tmp_path / "a.jsonl"), _dense_file(tmp_path / "b.jsonl")
    assert main(["densify", "stats", str(a), "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert list(one) == [str(a)] and one[str(a)]["count"] == 2
    assert main(["densify", "stats", str(a), str(b), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {str(a): one[str(a)], str(b): one[str(a)]}


@pytest.mark.parametrize(("extra", "why"), [([], "no torchrun launch"), (["--shard", "0/2"], "--shard job")])
def test_densify_no_merge_outside_torchrun_is_refused(extra, why, tmp_path, monkeypatch, capsys):
    """Old code: accepted and ignored (read only under torchrun): the job ran as without it."""
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    out = tmp_path / "d.jsonl"
    argv = ["--synthetic", "test", "--synthetic-num-images", "2", "--model", "tiny-random", "--no-progress"]
    assert main(["densify", *argv, "--out", str(out), "--no-merge", *extra]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: --no-merge: applies under torchrun without --shard") and why in line, line
    assert _tree(tmp_path) == set()


@pytest.mark.parametrize("flag", ["-v", "--verbose"])
def test_densify_takes_v_before_its_sub_verb(flag, tmp_path, capsys):
    """Old code: the sub-verb was read from the first argument only: `densify -v stats F` said
    ``the following arguments are required: --model, --out``."""
    dense = _dense_file(tmp_path / "d.jsonl")
    assert main(["densify", flag, "stats", str(dense), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[str(dense)]["count"] == 2
    # merge too: its own error (the shard is missing), with the traceback -v asks for
    assert main(["densify", flag, "merge", str(tmp_path / "gone.jsonl"), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.splitlines()[-1].startswith("error: shard file "), err


def test_densify_says_what_it_did_on_stderr_and_leaves_stdout_to_results(tmp_path, capsys):
    """Old code: the job's summary (``d.jsonl: 2 of 2 images (2 generated now ...``, ``nothing left to
    generate``, ``merged 2 shards into ...``) went to stdout, where every other verb prints only results."""
    argv = ["densify", "--synthetic", "test", "--synthetic-num-images", "2", "--model", "tiny-random"]
    argv += ["--max-new-tokens", "4", "--no-progress"]
    out = tmp_path / "d.jsonl"
    assert main([*argv, "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert printed.out == "" and f"{out}: 2 of 2 images (2 generated now" in printed.err
    assert main([*argv, "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert printed.out == "" and f"{out}: 2 of 2 images (nothing left to generate)" in printed.err
    shards = [tmp_path / f"s{i}.jsonl" for i in range(2)]
    for i, shard in enumerate(shards):
        assert main([*argv, "--shard", f"{i}/2", "--out", str(shard)]) == 0
    capsys.readouterr()
    merged = tmp_path / "m.jsonl"
    assert main(["densify", "merge", *map(str, shards), "--out", str(merged)]) == 0
    printed = capsys.readouterr()
    assert printed.out == "" and f"merged 2 shards into {merged} (2 lines)" in printed.err
    assert merged.read_bytes() == out.read_bytes()
