"""A matcher that reads dense text on region features (which bring none) is told once, by the config
check (old code: by the data reader, once per rank, and only where the caller passed use_dense)."""

from __future__ import annotations

import logging

from conftest import TINY_REGIONS
from patchword.config import apply_overrides
from patchword.data.prepare import load_raw_data
from patchword.runs.config import RunConfig
from patchword.train.validate import check_config

_SAID = "data.dataset=synthetic_regions holds region features, no dense text"


def _config(*extra: str) -> RunConfig:
    return apply_overrides(RunConfig(), [*TINY_REGIONS, "model.matcher=seps", *extra])


def test_the_config_check_says_it(caplog):
    with caplog.at_level(logging.WARNING):
        check_config(_config())
    assert [r.getMessage().startswith(_SAID) for r in caplog.records] == [True]


def test_not_where_the_run_says_no_dense_text_or_the_matcher_reads_none(caplog):
    with caplog.at_level(logging.WARNING):
        check_config(_config("data.dense=false"))
        check_config(_config("model.matcher=scan"))
    assert not any(_SAID in r.getMessage() for r in caplog.records)


def test_the_data_reader_no_longer_says_it(caplog):
    cfg = _config("data.num_train=2", "data.num_dev=2", "data.num_test=2")
    with caplog.at_level(logging.WARNING):
        load_raw_data(cfg.data, ("test",), use_dense=True)
    assert not any(_SAID in r.getMessage() for r in caplog.records)
