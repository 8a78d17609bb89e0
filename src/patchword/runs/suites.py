"""The compositional and patch suites of a run (``patchword eval RUN --suite compositional|patches``): each
scores the run's checkpoint and writes one JSON record with the identity a recall record carries (the run,
the checkpoint's path, step and digest, the config hash, the overrides), plus the suite files it read, so
that :func:`~patchword.runs.recorded.suite_evaluation_of` can tell which checkpoint and data it describes.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from patchword.config import apply_overrides
from patchword.eval.engine.memory import configured_budget_mb
from patchword.fileio import atomic_write_text
from patchword.runs.checks import check_eval_settings
from patchword.runs.config import RunConfig
from patchword.runs.evaluate import check_output
from patchword.runs.load import refuse_run_output
from patchword.runs.recorded import evaluation_identity, evaluation_provenance, suite_files_identity

__all__ = ["check_triple_texts", "evaluate_suite", "evaluate_patch_suite"]

_logger = logging.getLogger(__name__)


def _suite_run(suite: str, run_dir: Path, checkpoint, overrides, out: Path | None, force: bool, check, reads):
    """Both suites before scoring: one process; the config (with ``overrides``), the eval settings,
    ``check(cfg)`` (the suite's refusals) and ``out`` (default ``RUN/eval_<suite>.json``) checked; the
    files read (``reads``: suite files or None) refused as ``out``. Returns (loaded run, data config, out)."""
    from patchword.device import resolve_device
    from patchword.distributed import launch_info
    from patchword.errors import ConfigError
    from patchword.runs import load_run, read_run_config, resolve_checkpoint

    if launch_info().world_size > 1:
        raise ConfigError("--suite", "runs in one process: start it without torchrun")
    overrides = list(overrides or [])
    saved = read_run_config(run_dir)
    cfg = apply_overrides(saved, overrides)
    check_eval_settings(cfg, resolve_device(cfg.device))
    _refuse_recall_settings(suite, saved, cfg)
    out = check_output(out or run_dir / f"eval_{suite}.json", force, [run_dir])
    check(cfg)
    refuse_run_output(out, [run_dir], reads=[resolve_checkpoint(run_dir, checkpoint), *(reads or [])])
    loaded = load_run(run_dir, checkpoint, device=resolve_device(cfg.device), overrides=overrides, config=cfg)
    return loaded, loaded.config.data, out


#: Recall's settings, which no suite reads: the compositional suite scores the synthetic test split (or the
#: ``--suite-file`` triples), the patch suite the scenes' own train and test images.
SUITE_UNREAD_KEYS = ("eval.split", "eval.coco_1k", "eval.coco_extended")


def _refuse_recall_settings(suite: str, saved: RunConfig, cfg: RunConfig) -> None:
    """An override of a key of :data:`SUITE_UNREAD_KEYS` (``eval.split=dev``) to another value than what the
    suite does, which it would ignore while its record said it was given: refused (the run's own values of
    them are left alone).

    Raises:
        ConfigError: naming the key.
    """
    from patchword.config import config_diff, flat_config
    from patchword.errors import ConfigError

    scores = "the test split or the --suite-file triples" if suite == "compositional" else "its own images"
    what_it_does = {"eval.split": "test", "eval.coco_1k": False, "eval.coco_extended": False}
    values = flat_config(cfg)
    for key in config_diff(saved, cfg):
        if key in SUITE_UNREAD_KEYS and values[key] != what_it_does[key]:
            raise ConfigError(key, f"is not read by --suite {suite} (it scores {scores}): drop it")


def check_triple_texts(tokenizer, triples, max_caption_len: int | None = None) -> None:
    """Before scoring triples read from files: a caption or negative caption the tokenizer finds no word
    in is refused, naming its file, record and field (the tokenizer alone names only its position among
    every text encoded); one whose words the run's word vocabulary all lacks (scored as ``<unk>`` alone:
    the model is told nothing of it) is counted in one warning naming the first records.

    Raises:
        DataError: ``FILE: record ID: its negative_caption '!!!' has no words...``.
    """
    from patchword.data.tokenizers import NoWordsError, WordVocab
    from patchword.errors import DataError

    where = triples.origin or [f"triple {i}" for i in range(len(triples))]
    fields = (("caption", triples.positive), ("negative_caption", triples.negative))
    for field, texts in fields:
        try:
            tokenizer.batch_encode(list(texts), max_len=max_caption_len)
        except NoWordsError as err:
            raise DataError(
                f"{where[err.index]}: its {field} {err.text!r} has {err.reason}; reword or remove the record"
            ) from None
    if not isinstance(tokenizer, WordVocab):
        return
    unknown = [
        f"{where[i]} ({field})"
        for field, texts in fields
        for i, text in enumerate(texts)
        if not tokenizer.known_and_unknown_words(text)[0]
    ]
    if unknown:
        shown = "; ".join(unknown[:5]) + (f"; and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        _logger.warning(
            "%d of the %d captions of the suite files have no word the run's vocabulary knows (each is "
            "scored as <unk> alone): %s",
            len(unknown),
            2 * len(where),
            shown,
        )


def _write_suite(result: dict, loaded, run_dir: Path, overrides: list[str], files, out: Path, t0: float):
    """A suite's record: its figures and the identity a recall record carries (the run, the checkpoint's
    path, step and digest, the config hash, the overrides; :func:`~patchword.runs.recorded.
    suite_evaluation_of` reads them), plus ``suite_files`` (the ``--suite-file`` files read and their
    digests; [] for none), written to ``out``."""
    result.update(
        **evaluation_identity(run_dir, loaded.checkpoint),
        suite_files=suite_files_identity(files),
        eval_seconds=time.perf_counter() - t0,
        **evaluation_provenance(list(overrides or [])),
    )
    atomic_write_text(out, json.dumps(result, indent=2))
    return result, out


def evaluate_suite(
    run_dir: Path,
    checkpoint: Path | str | None = None,
    *,
    suite_files: list[Path] | None = None,
    image_root: Path | None = None,
    overrides: list[str] | None = None,
    out: Path | None = None,
    force: bool = False,
) -> tuple[dict[str, Any], Path]:
    """The compositional suite: every (image, caption, one-fact negative) triple, accuracy per kind
    (the true caption must score strictly higher; chance 50), and the dense text the matcher read
    (``"dense_text"``: :func:`~patchword.eval.compositional.dense_text_used`). Writes
    ``RUN/eval_compositional.json``."""
    from patchword.errors import ConfigError
    from patchword.eval.compositional import (
        FileImageSource,
        compositional_accuracy,
        dense_text_used,
        read_sugarcrepe,
        synthetic_suite,
    )

    def check(cfg: RunConfig) -> None:
        # a region-feature run scores no image, synthetic or from files: refused before the advice below,
        # whose files it could not read either
        if cfg.model.image_encoder == "precomp":
            raise ConfigError(
                "--suite",
                f"compositional scores image files; {run_dir} reads region features "
                "(model.image_encoder=precomp)",
            )
        if not suite_files and cfg.data.dataset != "synthetic":
            raise ConfigError("--suite-file", "a run on real data needs SugarCrepe-style files")

    loaded, dc, out = _suite_run(
        "compositional", run_dir, checkpoint, overrides, out, force, check, suite_files
    )
    dense = None
    if suite_files:
        paths, triples = read_sugarcrepe(suite_files, image_root)
        check_triple_texts(loaded.tokenizer, triples, dc.max_caption_len)
        images, source = FileImageSource(paths, loaded.image_transform()), [str(f) for f in suite_files]
    else:
        from patchword.data.synthetic import SyntheticScenes

        scenes = SyntheticScenes.load_or_generate(dc.synthetic_config(), cache_dir=dc.cache_dir or None)
        images, triples, dense = synthetic_suite(scenes, dc.test_split, seed=0)
        source = f"synthetic {dc.test_split} split, seed {dc.synthetic_seed}"
    dense = dense if dc.dense else None  # data.dense=false: the run's matcher scores without it
    t0 = time.perf_counter()
    result = compositional_accuracy(
        loaded.model,
        loaded.tokenizer,
        images,
        triples,
        max_caption_len=dc.max_caption_len,
        max_dense_len=dc.max_dense_len,
        dense_captions=dense,
        device=loaded.device,
        max_memory_mb=configured_budget_mb(loaded.config.eval.max_memory_mb, loaded.device),
        progress=loaded.config.progress,
    )
    root = str(image_root) if suite_files and image_root else None  # where the suite files' images are
    result.update(suite="compositional", source=source, image_root=root, matcher=loaded.config.model.matcher)
    # a dense matcher given no dense text (SugarCrepe files, data.dense=false) is scored in its sparse
    # mode: the record says so
    result["dense_text"] = dense_text_used(loaded.model.matcher, dense)
    return _write_suite(result, loaded, run_dir, overrides, suite_files, out, t0)


def evaluate_patch_suite(
    run_dir: Path,
    checkpoint: Path | str | None = None,
    *,
    overrides: list[str] | None = None,
    out: Path | None = None,
    force: bool = False,
) -> tuple[dict[str, Any], Path]:
    """Linear probes and patch-word grounding of the run's image encoder on its synthetic scenes
    (:mod:`patchword.eval.patch_probe`); writes ``RUN/eval_patches.json``."""
    from patchword.errors import ConfigError
    from patchword.eval.patch_probe import synthetic_patch_probe

    def check(cfg: RunConfig) -> None:
        if cfg.data.dataset != "synthetic" or cfg.model.image_encoder != "tiny":
            raise ConfigError("--suite", "patches probes a tiny image encoder on the synthetic scenes")

    loaded, dc, out = _suite_run("patches", run_dir, checkpoint, overrides, out, force, check, None)
    t0 = time.perf_counter()
    result = synthetic_patch_probe(
        loaded.model,
        dc.synthetic_config(),
        loaded.tokenizer,
        cache_dir=dc.cache_dir or None,
        device=loaded.device,
    )
    result.update(suite="patches", scenes=dc.synthetic_scenes)
    return _write_suite(result, loaded, run_dir, overrides, None, out, t0)
