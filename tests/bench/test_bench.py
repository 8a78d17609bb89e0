"""``patchword bench``: FLOP counting, the workload, the tables, and tiny in-process CLI runs."""

from __future__ import annotations

import json
import math

import pytest
import torch

from conftest import TINY_MODEL_32
from patchword.bench import count_flops, format_duration, format_scoring, format_two_stage
from patchword.bench.inputs import SCORING_CONFIGS, VIT_DIM, VIT_PATCHES, scoring_inputs, stand_in_lengths
from patchword.cli.bench import main

# The smallest scoring run: 3 images, the 5 captions of one, 2 reference captions, stand-in lengths.
TINY_SCORING = [
    "scoring",
    "--images",
    "3",
    "--caption-images",
    "1",
    "--ref-captions",
    "2",
    "--repeats",
    "1",
    "--stand-in-lengths",
    "--bert-vocab",
    "",
    "--peak-size",
    "64",
    "--no-rss",
]
# One config per reference path: caption-tied dense rows, image-tied dense per image (paper), no dense.
CONFIGS = "seps-code-caption,seps-paper-image,laps"


def test_count_flops_of_known_matrix_products():
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    assert count_flops(lambda: a @ b) == 2 * 8 * 16 * 4
    x, y = torch.randn(3, 8, 16), torch.randn(3, 16, 4)
    assert count_flops(lambda: torch.bmm(x, y)) == 2 * 3 * 8 * 16 * 4
    w = torch.randn(5, 16)
    assert count_flops(lambda: torch.nn.functional.linear(a, w)) == 2 * 8 * 16 * 5


def test_scoring_inputs_pair_captions_with_their_images():
    cap_lens, dense_lens = stand_in_lengths()
    assert cap_lens.shape == (5000,) and dense_lens.shape == (1000,) and int(dense_lens.max()) <= 128
    img, caps, lens, dense, dlens, t2i = scoring_inputs(4, cap_lens, dense_lens, caption_images=2)
    assert img.shape == (4, VIT_PATCHES + 1, VIT_DIM) and dense.shape[:2] == (4, int(dlens.max()))
    assert caps.shape == (10, int(lens.max()), VIT_DIM)
    assert torch.equal(lens, cap_lens[:10]) and torch.equal(dlens, dense_lens[:4])
    assert t2i.tolist() == [0] * 5 + [1] * 5


def test_format_duration_units():
    assert [format_duration(s) for s in (42, 119.4, 696, 7199, 11880)] == [
        "42 s",
        "119 s",
        "11.6 min",
        "120.0 min",
        "3.3 h",
    ]


def test_format_scoring_row():
    entry = {
        "engine_us_per_pair": 12.34,
        "reference_us_per_pair": 150.6,
        "speedup": 12.2,
        "engine_gflops": 45.0,
        "reference_gflops": 15.0,
        "engine_mflop_per_pair": 7.1,
        "reference_mflop_per_pair": 35.2,
        "engine_peak_tensor_mb": 81.4,
        "f30k_engine_s": 61.7,
        "f30k_reference_s": 753.0,
        "max_abs_diff_vs_reference": 8.9e-8,
        "extrapolated_from_pairs": {"engine": 480, "reference": 40},
    }
    # the percentage is of the larger of the two peak measurements (90, not 80)
    table = format_scoring({"peak_gflops": 80.0, "peak_gflops_end": 90.0, "configs": {"seps": entry}})
    lines = table.splitlines()
    assert len(lines) == 5 and lines[0].startswith("| config | engine us/pair")
    # the Flickr30K times were never measured: the column, the cells and a line under the table say so
    assert "| F30K 1000x5000 engine / reference (extrapolated) |" in lines[0]
    assert lines[2] == (
        "| seps | 12.3 | 151 | **12.2x** | 45.0 / 15.0 (50%) | 7.1 / 35.2 | 81 | ~62 s / ~12.6 min "
        "| 8.9e-08 |"
    )
    assert lines[3:] == [
        "",
        "F30K times (~) are extrapolated to its 5,000,000 pairs from the time per pair of the pairs timed: "
        "480 (engine) and 40 (reference).",
    ]


def test_format_two_stage_rows():
    rows = [
        {"method": "exhaustive", "k": None, "alpha": 0.0, "pairs": 5000000, "seconds": 34.1}
        | {"rsum": 260.5, "i2t_r1": 19.5, "t2i_r1": 12.0},
        {"method": "two-stage", "k": 128, "alpha": 1.0, "pairs": 640001, "seconds": 6.6, "speedup": 5.17}
        | {"rsum_delta": 8.0, "rsum": 268.5, "i2t_r1": 20.5, "t2i_r1": 11.9},
    ]
    lines = format_two_stage({"rows": rows}).splitlines()
    assert lines[2] == "| exhaustive | all | 0 | 5,000,000 | 34.1 | 1.0x | 260.5 | +0.0 | 19.5 | 12.0 |"
    assert lines[3] == "| two-stage | 128 | 1 | 640,001 | 6.6 | 5.2x | 268.5 | +8.0 | 20.5 | 11.9 |"


def test_tiny_scoring_run_matches_reference_and_writes_json(tmp_path, capsys):
    out = tmp_path / "scoring.json"
    threads = torch.get_num_threads()
    assert main([*TINY_SCORING, "--configs", CONFIGS, "--threads", "1", "--json", str(out)]) == 0
    assert torch.get_num_threads() == threads  # --threads is scoped to the command
    table = capsys.readouterr().out
    results = json.loads(out.read_text())
    assert results["command"].startswith("patchword bench scoring --images 3")
    scoring = results["scoring"]
    assert set(scoring) == {"machine", "lengths", "setup", "peak_gflops", "peak_gflops_end", "configs"}
    assert scoring["setup"]["images"] == 3 and scoring["setup"]["captions"] == 5
    assert list(scoring["configs"]) == CONFIGS.split(",")
    for name, entry in scoring["configs"].items():
        assert entry["max_abs_diff_vs_reference"] <= 1e-5, name
        assert entry["engine_mflop_per_pair"] > 0 and entry["reference_mflop_per_pair"] > 0
        assert entry["engine_us_per_pair"] > 0 and entry["f30k_engine_s"] > 0
        assert {"image_block", "text_block", "dense_block"} <= set(entry["plan"])
        # the peak tensor memory's own plan (one worker, the whole budget), apart from the timed engine's
        assert set(entry["peak_tensor_plan"]) == {"image_block", "text_block", "dense_block"}
        assert "engine_rss_growth_mb" not in entry  # --no-rss
        assert entry["extrapolated_from_pairs"] == {"engine": 3 * 5, "reference": 3 * 2}
        assert f"| {name} |" in table
    assert "from the time per pair of the pairs timed: 15 (engine) and 6 (reference)." in table
    assert "| peak tensor MiB (one worker, whole budget) |" in table
    # an existing result file is never overwritten silently
    assert main([*TINY_SCORING, "--configs", "laps", "--json", str(out)]) == 2
    assert "--force" in capsys.readouterr().err


def test_cli_user_errors(tmp_path, capsys):
    assert main(["two-stage"]) == 2
    assert "make demo" in capsys.readouterr().err
    assert main(["two-stage", "--run-dir", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main([*TINY_SCORING, "--configs", "seps-nope"]) == 2
    assert "seps-nope" in capsys.readouterr().err
    real_lengths = [arg for arg in TINY_SCORING if arg != "--stand-in-lengths"]
    assert main([*real_lengths, "--data", str(tmp_path)]) == 2  # not the shared data folder
    assert "f30k_1k_test" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:  # argparse: usage, one error line naming the flag, exit 2
        main(["scoring", "--images", "many"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.rstrip().splitlines()[-1] == (
        "patchword bench scoring: error: argument --images: expected an integer, got 'many'"
    )


def test_scoring_configs_cover_both_variants_and_pairings():
    specs = SCORING_CONFIGS.values()
    assert {(s["variant"], s["dense_pairing"]) for s in specs if s["dense"]} == {
        ("code", "caption"),
        ("code", "image"),
        ("paper", "caption"),
        ("paper", "image"),
    }


def test_memory_probe_arguments_round_trip_through_the_cli_parser():
    from patchword.bench.memory import ScoringCall
    from patchword.cli.bench import _parser

    call = ScoringCall("seps-code-image", 7, 3, 12.5, data="/some/data")
    args = _parser().parse_args(call.probe_argv())
    parsed = ScoringCall(
        args.config, args.images, args.caption_images, args.max_memory_mb, args.data, args.stand_in_lengths
    )
    assert args.what == "_rss" and parsed == call
    stand_in = ScoringCall("laps", 2, 1, 64.0, stand_in_lengths=True)
    assert _parser().parse_args(stand_in.probe_argv()).stand_in_lengths is True


# Run in place of ``python -m patchword.bench``: the measured scoring call (the one given ``out=``) also
# allocates and fills a float32 tensor of a known size, held until the call returns.
_PROBE_WITH_KNOWN_ALLOCATION = """
import sys
import torch
import patchword.eval
from patchword.cli.bench import main

known_mb, argv = int(sys.argv[1]), sys.argv[2:]
real = patchword.eval.score_matrix

def score_matrix_holding_a_known_tensor(*args, **kwargs):
    held = torch.ones(known_mb * 2**20 // 4) if "out" in kwargs else None  # every page written: resident
    result = real(*args, **kwargs)
    del held
    return result

patchword.eval.score_matrix = score_matrix_holding_a_known_tensor
sys.exit(main(argv))
"""


def test_memory_probe_in_a_fresh_process_sees_a_known_allocation(monkeypatch):
    """The probe's verdict is a lower bound from a known allocation, not an upper bound on what the
    allocator happens to keep: a 96 MiB tensor allocated and written inside the measured scoring call must
    show as at least 96 MiB of growth (what the call itself needs varies with the allocator and the CPU
    and is not asserted; ``patchword bench scoring`` reports it)."""
    import subprocess
    import sys
    from types import SimpleNamespace

    from patchword.bench import memory
    from patchword.bench.memory import ScoringCall, measure_rss_in_subprocess

    known_mb = 96
    commands = []

    def run(cmd, **kwargs):  # the probe's own command, with the allocation added
        assert cmd[1:3] == ["-m", "patchword.bench"], cmd
        commands.append(cmd)
        return subprocess.run([cmd[0], "-c", _PROBE_WITH_KNOWN_ALLOCATION, str(known_mb), *cmd[3:]], **kwargs)

    monkeypatch.setattr(
        memory, "subprocess", SimpleNamespace(run=run, SubprocessError=subprocess.SubprocessError)
    )
    growth = measure_rss_in_subprocess(ScoringCall("laps", 2, 1, 64.0, stand_in_lengths=True))
    assert len(commands) == 1 and commands[0][0] == sys.executable
    assert growth is not None and math.isfinite(growth), growth  # None: the probe failed
    assert growth >= known_mb, growth


# A trained run small enough for a test (as tests/train/test_train.py builds them): 12 test images,
# 60 captions.
TINY_RUN = [
    "data.num_train=20",
    "data.num_dev=12",
    "data.num_test=12",
    *TINY_MODEL_32,
    "train.batch_size=16",
    "train.epochs=1",
]


def test_two_stage_on_a_trained_run(tmp_path, capsys):
    from patchword.cli import main as patchword_main

    overrides = [f"output_dir={tmp_path}", f"data.cache_dir={tmp_path / 'cache'}", "name=r", *TINY_RUN]
    assert patchword_main(["train", *overrides]) == 0
    capsys.readouterr()
    out = tmp_path / "two_stage.json"
    argv = ["two-stage", "--run-dir", str(tmp_path / "r"), "--ks", "4,60", "--alpha", "0", "--quick"]
    assert main([*argv, "--json", str(out)]) == 0
    result = json.loads(out.read_text())["two_stage"]
    assert result["model"]["checkpoint"].endswith("best.pt")
    assert (result["model"]["test_images"], result["model"]["test_captions"]) == (12, 60)
    exhaustive, short, everything = result["rows"]  # --alpha 0: no hybrid row
    assert exhaustive["method"] == "exhaustive" and exhaustive["pairs"] == 12 * 60
    assert short["k"] == 4 and short["pairs"] < 12 * 60
    # k >= every candidate count: the shortlist holds every pair, so the recall is the exhaustive one
    assert everything["k"] == 60 and everything["pairs"] == 12 * 60
    assert everything["rsum"] == exhaustive["rsum"] and everything["rsum_delta"] == 0.0
    # the k each direction used: clipped to its candidates (60 captions for i2t, 12 images for t2i)
    assert exhaustive["k_used"] is None and short["k_used"] == {"i2t": 4, "t2i": 4}
    assert everything["k_used"] == {"i2t": 60, "t2i": 12}
    table = capsys.readouterr().out
    assert "| two-stage | 60 / 12 | 0 | 720 |" in table  # k used: 60 captions (i2t), 12 images (t2i)
    assert "First stage: exact (matrix product and top-k)." in table
    # a checkpoint that is not there is an error, not a silent fall-back to last.pt
    assert main([*argv, "--checkpoint", "missing.pt"]) == 2
    assert "missing.pt" in capsys.readouterr().err


def test_the_engine_flop_count_sees_the_cpu_workers(tmp_path):
    """With 2 threads the engine scores in 2 worker threads, which a profiler of the calling thread does
    not see (f715cbc reported 0 MFLOP per pair and 0 GFLOP/s for the engine): the count runs the engine with
    one thread of control and finds the work of the single-threaded run."""
    counts = {}
    for threads in ("1", "2"):
        out = tmp_path / f"scoring{threads}.json"
        assert main([*TINY_SCORING, "--configs", "laps", "--threads", threads, "--json", str(out)]) == 0
        counts[threads] = json.loads(out.read_text())["scoring"]["configs"]["laps"]["engine_mflop_per_pair"]
    assert counts["2"] > 0
    assert counts["2"] == pytest.approx(counts["1"], rel=1e-9)


@pytest.mark.parametrize(("flag", "value"), [("--threads", "-1"), ("--images", "0"), ("--repeats", "0")])
def test_numeric_flags_out_of_range_are_argparse_errors_naming_the_flag(capsys, flag, value):
    """f715cbc: ``--threads -1`` reached torch.set_num_threads (a RuntimeError traceback)."""
    with pytest.raises(SystemExit) as exit_:
        main(["scoring", "--quick", flag, value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"error: argument {flag}: must be >= " in err.splitlines()[-1]
