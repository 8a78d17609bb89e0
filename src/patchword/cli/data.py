"""``patchword data check``: validate a dataset layout and print what was found, without training;
``patchword data export synthetic``: write the synthetic scenes as real files in the LAPS/SEPS layout."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["add_arguments", "run", "check_dataset", "check_model"]

#: Unusable image files listed per split (the count covers them all).
SHOWN_BAD = 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from patchword.cli import verbose_after_verb

    # each level takes -v (``data check -v``, ``data export synthetic -v``) and reports an unknown option
    # with its own usage and options (parse_with_overrides: the deepest ``_parser`` set wins)
    common = [verbose_after_verb()]
    sub = parser.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    check = sub.add_parser(
        "check",
        parents=common,
        help="validate a dataset layout (counts, every image decoded completely, dense coverage) and that "
        "the model takes it (image size, text lengths, vocabulary)",
    )
    check.add_argument(
        "--config",
        help="YAML file with RunConfig fields, or a shipped recipe's name (its data section is read)",
    )
    check.add_argument(
        "--split",
        action="append",
        choices=("train", "dev", "test"),
        help="check only this split (repeat for more; default all three)",
    )
    check.add_argument("overrides", nargs="*", help="dotted overrides, e.g. data.root=data/f30k")
    check.set_defaults(_parser=check)
    export = sub.add_parser("export", parents=common, help="write a dataset as real files")
    export.set_defaults(_parser=export)
    sources = export.add_subparsers(dest="export_source", required=True, metavar="SOURCE")
    syn = sources.add_parser(
        "synthetic", parents=common, help="synthetic scenes as PNG files + the LAPS/SEPS layout"
    )
    syn.add_argument(
        "--split",
        choices=("train", "dev", "test"),
        default="test",
        help="the split whose scenes are written (default %(default)s)",
    )
    syn.add_argument("--out", type=Path, required=True, help="output directory (must not exist or be empty)")
    syn.add_argument("--run", type=Path, help="export the scenes of this run's data section")
    syn.add_argument("overrides", nargs="*", help="dotted overrides, e.g. data.num_test=200")
    syn.set_defaults(_parser=syn)


def _text_tokenizer(dc):
    """The tokenizer ``train`` reads the texts with, to find those it finds no word in; for a vocabulary
    built from the training text, an empty one with the same word split (it finds the same words)."""
    from patchword.data.prepare import build_tokenizer
    from patchword.data.tokenizers import WordVocab

    if dc.tokenizer == "word" and not dc.vocab_path:
        return WordVocab(split=dc.word_split)
    return build_tokenizer(dc, None)


def check_dataset(cfg, roles=("train", "dev", "test"), encoded=None, tokenizer=None) -> list[dict[str, Any]]:
    """One row per split role: counts, dense coverage and unusable images, or the error that stopped it
    (a file, a caption the tokenizer finds no word in, an image shared with a split it is meant to be held
    out from: loading a split compares it with the others' ids and file names, as train and eval do), and
    a ``warning`` when most of its caption words are unknown to a vocabulary read from a file.

    Args:
        encoded: a dict filled with each split tokenised (role -> EncodedSplit), for :func:`check_model`.
        tokenizer: the one :func:`_text_tokenizer` returns (made when not given).
    """
    from patchword.data.dense_gaps import images_without_dense, refuse_images_without_dense
    from patchword.data.images import find_bad_images
    from patchword.data.pipeline import FileImages, encode_split, unknown_words_warning
    from patchword.data.prepare import FILE_DATASETS, load_raw_data, reads_dense_text
    from patchword.errors import USER_ERRORS
    from patchword.model import model_reads_dense

    use_dense = reads_dense_text(cfg.data, model_reads_dense(cfg.model))  # none for region features
    # Counted below instead of raised (and reported, not left out, whatever data.skip_bad_images says).
    dc = dataclasses.replace(cfg.data, check_images=False, skip_bad_images=False)
    tokenizer = _text_tokenizer(dc) if tokenizer is None else tokenizer
    builds = dc.tokenizer == "word" and not dc.vocab_path  # train builds it: every training word known
    encoded = {} if encoded is None else encoded
    rows = []
    for role in roles:
        row: dict[str, Any] = {"role": role, "split": getattr(dc, f"{role}_split")}
        try:
            # with data.skip_bad_images a dense file may lack the unusable images' lines (checked below)
            raw = load_raw_data(dc, [role], use_dense=use_dense, dense_gaps_ok=cfg.data.skip_bad_images)
            split = raw.splits[role]
            lacking = images_without_dense(split)
            described = split.subset(np.setdiff1d(np.arange(split.num_images), lacking)) if lacking else split
            encoded[role] = (
                encode_split(  # as train and eval tokenise it (without the images train leaves out)
                    described,
                    tokenizer,
                    FileImages(described.images, dc.image_size) if lacking else raw.images[role],
                    max_caption_len=dc.max_caption_len,
                    max_dense_len=dc.max_dense_len,
                    use_dense=split.dense_captions is not None,
                )
            )
        except USER_ERRORS as err:
            row["error"] = str(err)
            rows.append(row)
            continue
        per_image = np.bincount(split.txt2img, minlength=split.num_images)
        row.update(
            split=split.name,
            images=split.num_images,
            captions=split.num_captions,
            captions_per_image=f"{per_image.min()}-{per_image.max()}" if per_image.size else "-",
            dense="not read" if not use_dense else _dense_coverage(split),
        )
        if not builds and (note := unknown_words_warning(split, tokenizer)):
            row["warning"] = note
        if cfg.data.dataset in FILE_DATASETS:
            bad = find_bad_images(split.images, f"{role} split")  # decodes every image completely
            row["bad_images"] = len(bad)
            row["bad_examples"] = [f"{path}: {why}" for path, why in bad[:SHOWN_BAD]]
            if len(bad) > SHOWN_BAD:
                row["bad_examples"].append(f"... and {len(bad) - SHOWN_BAD} more")
            try:  # an image without a dense line is accepted only when training leaves it out
                refuse_images_without_dense(split, f"{role} split", {path for path, _ in bad})
            except USER_ERRORS as err:
                row["error"] = str(err)
        rows.append(row)
    return rows


def check_model(cfg, tokenizer, encoded) -> str | None:
    """The error of what ``train`` checks of its model against the data before the first step
    (:func:`~patchword.runs.checks.check_model_data`: image size, text positions, vocabulary size, region
    features, the eval protocol against its split; the settings the model would not read), None when it fits.
    The model is built from the config on the meta device: the encoders' declared sizes (a Hugging Face
    backbone's from its config.json), no weights read or initialised.

    Args:
        tokenizer: the tokenizer of :func:`check_dataset`; encoded: role -> EncodedSplit it filled.
    """
    from patchword.data.prepare import PreparedData
    from patchword.errors import USER_ERRORS
    from patchword.factory import create_model
    from patchword.runs.checks import check_model_data
    from patchword.train.settings import check_model_settings

    mc = cfg.model
    mc = dataclasses.replace(mc, gru=dataclasses.replace(mc.gru, glove_path=""))  # no GloVe file read
    data = PreparedData(encoded, tokenizer, {}, {})
    try:
        try:
            with torch.device("meta"):
                model = create_model(mc, pretrained=False, vocab_size=data.vocab_size, device="meta")
        except (NotImplementedError, RuntimeError):  # a plug-in that reads a tensor's values as it builds
            model = create_model(mc, pretrained=False, vocab_size=data.vocab_size)
        check_model_data(cfg, model, data)
        check_model_settings(cfg, model)
    except USER_ERRORS as err:
        return str(err)
    return None


def _dense_coverage(split) -> str:
    """``described/images``, and ``(by order)`` when the lines record no image (paired by position alone,
    as the SEPS release is: nothing shows the file was made for this split), ``(K by order)`` for some."""
    from patchword.data.textfiles import read_dense_lines

    described = sum(bool(t) for t in split.dense_captions or [])
    coverage = f"{described}/{split.num_images}"
    if split.dense_origin is None:
        return coverage
    lines = read_dense_lines(split.dense_origin.file)  # read again: the split keeps only the texts
    by_order = sum(
        1
        for place in split.dense_origin.places
        if place > 0 and lines[place - 1].image_id is None and lines[place - 1].file is None
    )
    if not by_order:
        return coverage
    return f"{coverage} (by order)" if by_order == described else f"{coverage} ({by_order} by order)"


def _print(rows: list[dict[str, Any]]) -> None:
    cols = ["role", "split", "images", "captions", "captions_per_image", "dense", "bad_images"]
    table = [[str(row.get(c, "")) for c in cols] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in table)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    for row, cells in zip(rows, table, strict=True):
        if "error" in row:
            print(f"{row['role'].ljust(widths[0])}  error: {row['error']}")
            continue
        print("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)))
        for example in row.get("bad_examples", []):
            print(f"    {example}")
        if "warning" in row:
            print(f"    warning: {row['warning']}")


def run(args: argparse.Namespace) -> int:
    if args.data_command == "export":
        return _export(args)
    return _check(args)


def _export(args: argparse.Namespace) -> int:
    from patchword.config import apply_overrides
    from patchword.data.export import export_synthetic_split
    from patchword.data.prepare import SYNTHETIC_DATASETS
    from patchword.errors import ConfigError
    from patchword.runs import read_run_config
    from patchword.runs.config import RunConfig

    _refuse_other_sections(args.overrides)
    cfg = (
        read_run_config(args.run, args.overrides)
        if args.run
        else apply_overrides(RunConfig(), args.overrides)
    )
    # a run on files has no scenes: the default scenes were written as if they were its data
    dataset = cfg.data.dataset
    if dataset not in SYNTHETIC_DATASETS:
        key, what = (
            ("--run", f"{args.run} has data.dataset={dataset}")
            if args.run
            else ("data.dataset", f"is {dataset}")
        )
        raise ConfigError(
            key,
            f"{what}, not the synthetic scenes: `data export synthetic` writes those of a run on "
            f"data.dataset={' or '.join(SYNTHETIC_DATASETS)}",
        )
    cfg.data.check_values()  # as `data check` checks them: data.dev_from_train=1 is no setting of scenes
    summary = export_synthetic_split(args.out, args.split, config=cfg.data.synthetic_config())
    # a region-feature run reads no image file: the index / eval hints would fail for it
    reads_regions = args.run and cfg.model.image_encoder == "precomp"
    print(summary.describe(region_run=args.run if reads_regions else None))
    return 0


def _refuse_other_sections(overrides: list[str]) -> None:
    """``data export synthetic`` writes the scenes of a ``data`` section: an override of another section
    (``model.embed_dim=-1``, ``train.lr=5``) would be accepted and never applied. Refused; an item
    without ``=`` is left to the config loader, which names it.

    Raises:
        ConfigError: naming the key.
    """
    from patchword.errors import ConfigError

    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if "=" in item and key != "data" and not key.startswith("data."):
            raise ConfigError(
                key,
                "is not read by `data export synthetic`, which writes the scenes of the "
                "data section: give data.* keys only",
            )


def _check(args: argparse.Namespace) -> int:
    from patchword.runs.config import load_run_config
    from patchword.train.validate import check_config

    cfg = load_run_config(args.config, args.overrides)
    check_config(cfg)
    cfg.data.check_values()  # what data export checks too (data.dev_from_train=1 on the scenes: one line)
    print(f"dataset: {cfg.data.dataset}" + (f"  root: {cfg.data.root}" if cfg.data.root else ""))
    tokenizer, encoded = _text_tokenizer(cfg.data), {}
    rows = check_dataset(cfg, args.split or ("train", "dev", "test"), encoded, tokenizer)
    _print(rows)
    misfit = check_model(cfg, tokenizer, encoded)
    name = cfg.model.name or f"model.matcher={cfg.model.matcher}"
    print(f"model: {name}: " + (f"error: {misfit}" if misfit else "fits the data as train checks it"))
    problems = sum("error" in row or row.get("bad_images", 0) > 0 for row in rows)
    skipping = any(row.get("bad_images", 0) for row in rows) and cfg.data.skip_bad_images
    note = " (data.skip_bad_images=true: train and eval leave the unusable images out)" if skipping else ""
    verdict = [f"{problems} split(s) with problems{note}"] if problems else []
    if misfit:
        verdict.append("the model does not fit the data")
    print("; ".join(verdict) or "ok")
    return 2 if verdict else 0
