"""``patchword bench scoring`` without ``--quick`` / ``--no-rss`` (what ``make bench`` runs): the RSS probe of
the first config, after every config is measured."""

from __future__ import annotations

import json

import pytest
import torch

from patchword.cli.bench import main

# The smallest scoring run with the RSS probe: 2 images, the 5 captions of one, 1 reference caption.
TINY_SCORING_RSS = [
    "scoring",
    "--images",
    "2",
    "--caption-images",
    "1",
    "--ref-captions",
    "1",
    "--repeats",
    "1",
    "--stand-in-lengths",
    "--peak-size",
    "64",
]


def _shared_data(root, images: int):
    """A shared data folder as the scoring benchmark reads it (as test_bench_checks.py makes one)."""
    (root / "f30k_1k_test").mkdir(parents=True)
    (root / "seps_dense_llava").mkdir()
    (root / "f30k_1k_test" / "test_bert_caps.txt").write_text("101,1037,2158,102\n" * 5 * images)
    (root / "seps_dense_llava" / "f30k_test.jsonl").write_text('{"text": "a red circle."}\n' * images)
    return root


def test_scoring_with_the_rss_probe_measures_every_config_and_probes_the_first(tmp_path, monkeypatch, capsys):
    """The engine's block plan once rebound the benchmark's plan: the probe of the first config read
    ``plan.data`` of a BlockPlan (AttributeError after the first config was measured)."""
    import patchword.bench.scoring
    from patchword.bench.memory import ScoringCall

    calls = []

    def probe(call):  # the fresh process is tested in test_bench.py: here, what it is asked to measure
        calls.append(call)
        return 12.5

    monkeypatch.setattr(patchword.bench.scoring, "measure_rss_in_subprocess", probe)
    out = tmp_path / "scoring.json"
    argv = [*TINY_SCORING_RSS, "--bert-vocab", "", "--configs", "laps,seps-code-caption", "--json", str(out)]
    assert main(argv) == 0
    configs = json.loads(out.read_text())["scoring"]["configs"]
    assert list(configs) == ["laps", "seps-code-caption"]
    assert configs["laps"]["engine_rss_growth_mb"] == 12.5
    assert "engine_rss_growth_mb" not in configs["seps-code-caption"]  # the first config's only
    for entry in configs.values():  # the engine's block plan, not the benchmark's
        assert {"image_block", "text_block", "dense_block"} <= set(entry["plan"])
    # with the run's torch threads (torch's default here: the session's one thread)
    assert calls == [ScoringCall("laps", 2, 1, 1024.0, None, True, None, threads=torch.get_num_threads())]
    assert "Peak RSS growth of the engine's call in a fresh process: laps: 12 MiB." in capsys.readouterr().out


def test_the_rss_probe_reads_the_lengths_with_the_runs_bert_vocabulary(tmp_path, monkeypatch, capsys):
    """The probe reads the lengths again in its process: with the timed run's vocabulary, or its dense
    text (BERT WordPiece lengths) would be another call's (word counts)."""
    import patchword.bench.memory
    import patchword.bench.scoring
    from patchword.bench.memory import ScoringCall, rss_growth_of_scoring
    from patchword.cli.bench import _parser
    from patchword.errors import ConfigError

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "red", "circle"]) + "\n")
    calls = []
    monkeypatch.setattr(
        patchword.bench.scoring, "measure_rss_in_subprocess", lambda c: calls.append(c) or 1.0
    )
    # a vocabulary counts the dense captions of a data folder (with stand-in lengths it is refused)
    data = _shared_data(tmp_path / "data", images=3)
    argv = [arg for arg in TINY_SCORING_RSS if arg != "--stand-in-lengths"] + ["--data", str(data)]
    assert main([*argv, "--bert-vocab", str(vocab), "--configs", "laps"]) == 0
    capsys.readouterr()
    assert [call.bert_vocab for call in calls] == [str(vocab)]
    # ... through the probe's command line ...
    args = _parser().parse_args(calls[0].probe_argv())
    assert args.what == "_rss" and args.bert_vocab == str(vocab) and args.data == str(data)
    assert _parser().parse_args(ScoringCall("laps", 2, 1, 64.0).probe_argv()).bert_vocab is None
    # ... to the lengths it reads
    seen = {}

    def lengths(data, bert_vocab, **kwargs):
        seen.update(data=data, bert_vocab=bert_vocab, **kwargs)
        raise ConfigError("stop", "captured")

    monkeypatch.setattr(patchword.bench.memory, "benchmark_lengths", lengths)
    with pytest.raises(ConfigError, match="captured"):
        rss_growth_of_scoring(calls[0])
    assert seen == {"data": str(data), "bert_vocab": str(vocab), "stand_in": False}


def test_the_scoring_table_shows_a_failed_probe():
    from patchword.bench import format_scoring

    entry = {
        "engine_gflops": 1.0,
        "reference_gflops": 1.0,
        "engine_us_per_pair": 1.0,
        "reference_us_per_pair": 2.0,
        "speedup": 2.0,
        "engine_mflop_per_pair": 1.0,
        "reference_mflop_per_pair": 1.0,
        "engine_peak_tensor_mb": 1.0,
        "f30k_engine_s": 5.0,
        "f30k_reference_s": 10.0,
        "max_abs_diff_vs_reference": 0.0,
        "engine_rss_growth_mb": None,
    }
    table = format_scoring({"peak_gflops": 10.0, "configs": {"laps": entry}})
    assert (
        table.splitlines()[-1]
        == "Peak RSS growth of the engine's call in a fresh process: laps: the probe failed."
    )
