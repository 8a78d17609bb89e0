"""``patchword import CKPT --out RUN``: an official checkpoint as a patchword run directory."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from patchword.imports import list_families

    families = list_families()
    parser.description = "Import a checkpoint saved by official code. Families read: " + "; ".join(
        f"{f.name} ({f.description})" for f in families
    )
    parser.add_argument("checkpoint", type=Path, metavar="CKPT", help="the official checkpoint file")
    parser.add_argument("--out", type=Path, required=True, help="the run directory to write (must not exist)")
    parser.add_argument(
        "--family", choices=[f.name for f in families], help="the checkpoint's family (default: recognised)"
    )
    parser.add_argument(
        "--hf-vision",
        help="Hugging Face vision backbone: directory or hub id (the cache only, unless "
        "model.hf_local_files_only=false; architecture only)",
    )
    parser.add_argument(
        "--hf-text",
        help="Hugging Face text backbone: directory or hub id (the cache only, unless "
        "model.hf_local_files_only=false; architecture, tokenizer)",
    )
    parser.add_argument("--vocab", help="the official word vocabulary (SCAN / NAAF: json or pkl)")
    parser.add_argument(
        "--dense-pairing",
        choices=("image", "caption"),
        help="SEPS dense text: tied to the candidate image (leak-free, default) or to the caption's own "
        "image (the official protocol, leaky)",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        help="dotted run-config overrides of where the data lies and how it is evaluated, e.g. "
        "data.root=data/f30k (recorded in import.json); a key the checkpoint decides (model.*, the "
        "tokenizer, text length, image size, dense text) is refused, and so is one no evaluation reads "
        "(train.*, seed, name, output_dir, data.vocab_path, data.word_split...: `patchword eval` refuses "
        "them too)",
    )


def run(args: argparse.Namespace) -> None:
    from patchword.imports import ImportOptions, import_checkpoint

    options = ImportOptions(
        hf_vision=args.hf_vision,
        hf_text=args.hf_text,
        vocab=args.vocab,
        dense_pairing=args.dense_pairing,
        overrides=list(args.overrides),
    )
    record = import_checkpoint(args.checkpoint, args.out, family_name=args.family, options=options)
    summary = {k: record[k] for k in ("family", "source", "loaded") if k in record}
    summary["ignored"] = len(record.get("ignored", {}))
    if record.get("derived"):  # built from the checkpoint's options (NAAF's thresholds), not loaded
        summary["derived"] = len(record["derived"])
    if record.get("overrides"):
        summary["overrides"] = record["overrides"]
    print(json.dumps(summary, indent=2))
    print(f"written: {args.out}", file=sys.stderr)  # stdout stays one JSON document
