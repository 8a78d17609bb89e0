"""A matcher is one plug-in: a toy matcher defined in this file, and registered by it alone, trains,
evaluates (recall and its own declared metadata), and searches an index through the command line, with
its options under ``model.options`` (type-checked against its config), and no other file naming it."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from torch import nn

from conftest import TINY_MODEL_32, one_error_line
from patchword.cli import main
from patchword.matching import Matcher, MatcherOutput, register_matcher
from patchword.matching.ops import l2norm, masked_mean

pytestmark = pytest.mark.usefixtures("one_thread")


@dataclass
class ToyConfig:
    """Cosine of the mean patch and the mean word, after a learned map of the words, times ``scale``."""

    embed_dim: int = 32
    num_patches: int = 16
    has_cls: bool = True
    scale: float = 1.0
    flavour: str = "plain"  # recorded in every metrics file (``report``)


@register_matcher("toy-dot", ToyConfig, report=("flavour",))
class ToyMatcher(Matcher):
    consumes_dense = False

    def __init__(self, config: ToyConfig) -> None:
        super().__init__()
        self.config, self.embed_dim, self.has_cls = config, config.embed_dim, config.has_cls
        self.word_map = nn.Linear(config.embed_dim, config.embed_dim)

    def forward(self, img_tokens, cap_tokens, cap_lens, dense_tokens=None, dense_lens=None) -> MatcherOutput:
        lens = self.validate_text(cap_tokens, cap_lens)
        cap_tokens = cap_tokens.to(img_tokens.dtype)  # scored in the image tokens' dtype (the contract)
        img = l2norm(img_tokens[:, int(self.has_cls) :].mean(1))
        txt = l2norm(masked_mean(self.word_map(cap_tokens), lens))
        return MatcherOutput(sims=self.config.scale * img @ txt.T)


TINY = [
    "data.num_train=24",
    "data.num_dev=8",
    "data.num_test=10",
    *TINY_MODEL_32,
    "model.matcher=toy-dot",
    "model.options.scale=2.0",
    "model.options.flavour=spicy",
    "train.batch_size=16",
    "train.max_steps=4",
    "train.num_threads=1",
]


def test_a_toy_matcher_trains_evaluates_and_searches_through_the_cli(tmp_path, capsys):
    from patchword.runs import load_run

    runs, cache = tmp_path / "runs", tmp_path / "cache"
    assert main(["train", *TINY, f"output_dir={runs}", "name=toy", f"data.cache_dir={cache}"]) == 0
    run = runs / "toy"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["matcher"] == "toy-dot" and summary["flavour"] == "spicy"
    loaded = load_run(run)
    assert isinstance(loaded.model.matcher, ToyMatcher) and loaded.model.matcher.config.scale == 2.0
    # trained: the word map moved off its initialisation
    assert main(["eval", str(run), "--out", str(tmp_path / "e.json")]) == 0
    evaluated = json.loads((tmp_path / "e.json").read_text())
    assert evaluated["rsum"] == pytest.approx(summary["rsum"]) and evaluated["flavour"] == "spicy"
    # search: export the test images, index them with the toy model, query a caption
    assert (
        main(
            [
                "data",
                "export",
                "synthetic",
                "--out",
                str(tmp_path / "exp"),
                "data.num_test=10",
                *TINY_MODEL_32[:1],
                f"data.cache_dir={cache}",
            ]
        )
        == 0
    )
    images = tmp_path / "exp" / "images"
    assert main(["index", "build", str(run), "--images", str(images), "--out", str(tmp_path / "idx")]) == 0
    capsys.readouterr()
    assert main(["search", str(tmp_path / "idx"), "a red circle", "-k", "3", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)["results"]
    assert len(hits) == 3 and hits[0]["score"] >= hits[1]["score"] >= hits[2]["score"]


def test_the_toy_matchers_options_are_checked_against_its_config(tmp_path, capsys):
    args = [*TINY, f"output_dir={tmp_path}", "name=bad", "model.options.scael=3"]
    assert main(["train", *args]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "model.options.scael" in line and "scale" in line and not (tmp_path / "bad").exists()
    # a matcher trained with the hinge cannot take the InfoNCE loss (it declared none)
    assert main(["train", *TINY, f"output_dir={tmp_path}", "name=nce", "train.loss=infonce"]) == 2
    assert "train.loss" in one_error_line(capsys.readouterr().err)
