"""One spelling per concept across verbs (a CLI review): ``eval --device`` as index build, search and serve
take it (the override ``device=`` underneath), ``-k`` / ``--k`` in both searches, ``--run`` beside ``bench``'s
``--run-dir`` as search, serve and data export spell it. Before: each refused the other verbs' spelling."""

from __future__ import annotations

import json

import pytest

from conftest import one_error_line
from patchword.cli import main


def test_eval_device_is_the_device_override(trained_tiny_run, tmp_path, capsys):
    assert main(["eval", str(trained_tiny_run), "--device", "cpu", "--out", str(tmp_path / "a.json")]) == 0
    assert main(["eval", str(trained_tiny_run), "device=cpu", "--out", str(tmp_path / "b.json")]) == 0
    a, b = (json.loads((tmp_path / name).read_text()) for name in ("a.json", "b.json"))
    assert a["overrides"] == b["overrides"] == ["device=cpu"] and a["rsum"] == b["rsum"]
    capsys.readouterr()
    assert main(["eval", str(trained_tiny_run), "--device", "cpu", "device=cpu"]) == 2
    assert one_error_line(capsys.readouterr().err).startswith("error: --device: ")


@pytest.mark.parametrize("argv", [["search", "--help"], ["hash", "search", "--help"]])
def test_both_searches_take_k_and_double_dash_k(argv, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert "-k K, --k K" in capsys.readouterr().out


def test_bench_takes_run_beside_run_dir(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "two-stage", "--help"])
    assert "--run-dir RUN_DIR, --run RUN_DIR" in capsys.readouterr().out


# --------------------------------------------------------------------------------------------------------
# --threads N: torch's intra-op threads, one spelling in every verb that runs a model (a CLI review: bench
# had --threads, serve --torch-threads, eval, index build, search, hash eval / search and densify none)
# --------------------------------------------------------------------------------------------------------

#: A thread count no test process runs with by default (the fixtures use 1, torch's default the cores).
THREADS = 3


@pytest.fixture
def threads_seen(monkeypatch):
    """``watch(where, name)``: wrap that function so that each call records torch's thread count at that
    moment (inside the verb's work); yields the list of counts after the one thread the test starts with."""
    import importlib

    import torch

    seen: list[int] = []

    def watch(where: str, name: str) -> None:
        """``where``: a module, or ``module:Class``."""
        module, _, cls = where.partition(":")
        target = importlib.import_module(module)
        target = getattr(target, cls) if cls else target
        original = getattr(target, name)

        def recording(*args, **kwargs):
            seen.append(torch.get_num_threads())
            return original(*args, **kwargs)

        monkeypatch.setattr(target, name, recording)

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield watch, seen
        # the caller's count back: main() runs in-process (tests, the top-level CLI)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(previous)


def test_eval_threads_sets_the_threads_its_record_says(trained_tiny_run, tmp_path, capsys, threads_seen):
    """Old code: ``unrecognized arguments: --threads``; eval ran on every core."""
    assert main(["eval", str(trained_tiny_run), "--threads", str(THREADS), "--out", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["cost"]["threads"] == THREADS


def test_search_and_index_build_take_threads_and_decode_workers(env, tmp_path, capsys, threads_seen):
    """Old code: neither took --threads; index build's image decoding threads were --workers, serve's
    model threads too (--decode-workers now; --workers still works there, hidden)."""
    watch, seen = threads_seen
    watch("patchword.search.index", "write_build")
    watch("patchword.search.query:Searcher", "search")
    images = env.export.files["images"]
    for flag in ("--decode-workers", "--workers"):
        out = tmp_path / f"idx{flag}"
        build = ["build", str(env.run_dir), "--images", str(images), "--out", str(out), flag, "1"]
        assert main(["index", *build, "--threads", str(THREADS)]) == 0
    capsys.readouterr()
    assert main(["search", str(out), "a red circle", "-k", "2", "--threads", str(THREADS), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["results"]) == 2
    assert seen == [THREADS] * 3


def test_hash_eval_and_search_take_threads(hash_run, capsys, threads_seen):
    watch, seen = threads_seen
    watch("patchword.hashing.evaluate", "evaluate_hashing")
    watch("patchword.hashing.runner", "open_hashing_run")
    assert main(["hash", "eval", str(hash_run), "--threads", str(THREADS)]) == 0
    search = ["--modality", "image", "--query-index", "0", "--k", "2", "--threads", str(THREADS)]
    assert main(["hash", "search", str(hash_run), *search]) == 0
    assert seen == [THREADS] * 3  # eval's run opened, its evaluation; search's run opened


def test_densify_takes_threads(tmp_path, capsys, threads_seen):
    watch, seen = threads_seen
    watch("patchword.densify.runner", "densify")
    argv = ["--synthetic", "test", "--synthetic-num-images", "2", "--model", "tiny-random", "--no-progress"]
    assert (
        main(
            ["densify", *argv, "--max-new-tokens", "4", "--out", str(tmp_path / "d.jsonl"), "--threads", "3"]
        )
        == 0
    )
    assert seen == [THREADS]


def test_serve_threads_and_its_former_spelling_are_one_setting():
    """``serve --torch-threads`` (the old spelling) keeps working, hidden from --help."""
    from patchword.cli.serve import _parser

    parser = _parser()
    assert parser.parse_args(["idx", "--threads", "3"]).threads == 3
    assert parser.parse_args(["idx", "--torch-threads", "3"]).threads == 3
    assert parser.parse_args(["idx"]).threads == 0  # CPUs // --workers, as before
    assert "--torch-threads" not in parser.format_help() and "--threads N" in parser.format_help()


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["eval", "RUN", "--threads", "0"], "error: --threads: must be >= 1, got 0"),
        (["index", "build", "RUN", "--images", "I", "--out", "O", "--threads", "0"], "error: --threads: "),
        (["search", "IDX", "a dog", "--threads", "-2"], "error: --threads: must be >= 1, got -2"),
        (["hash", "eval", "RUN", "--threads", "0"], "error: --threads: must be >= 1, got 0"),
        (
            ["hash", "search", "RUN", "--modality", "text", "--query-index", "0", "--threads", "0"],
            "error: --threads: ",
        ),
        (
            ["densify", "--images", "I", "--model", "tiny-random", "--out", "O", "--threads", "0"],
            "error: --threads: ",
        ),
        (
            ["serve", "IDX", "--threads", "-1"],
            "error: --threads: must be >= 0 (0: CPUs // --workers), got -1",
        ),
        (
            ["serve", "IDX", "--torch-threads", "-1"],
            "error: --torch-threads: must be >= 0 (0: CPUs // --workers)",
        ),
        (
            ["index", "build", "RUN", "--images", "I", "--out", "O", "--decode-workers", "-1"],
            "error: --decode-workers: must be 0 (the default: min(4, CPUs)) or more, got -1",
        ),
        (
            ["index", "build", "RUN", "--images", "I", "--out", "O", "--workers", "-1"],
            "error: --workers: must be 0 (the default: min(4, CPUs)) or more, got -1",
        ),
    ],
)
def test_a_thread_count_out_of_range_is_one_line_naming_the_flag_given_before_anything_is_read(
    argv, line, tmp_path, capsys
):
    """None of the paths exists: the count is checked first."""
    argv = [str(tmp_path / a) if a in ("RUN", "IDX", "I", "O") else a for a in argv]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert one_error_line(captured.err).startswith(line) and captured.out == ""
    assert list(tmp_path.iterdir()) == []
