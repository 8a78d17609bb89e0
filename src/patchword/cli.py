"""The ``patchword`` command: ``demo``, ``train``, ``eval``, ``hash``, ``bench``.

Configuration is the :class:`~patchword.train.config.RunConfig` dataclass; ``--config run.yaml`` and
dotted overrides (``model.sparse_ratio=0.6 train.epochs=3``) apply on top of its defaults. ``main(argv)``
is importable so tests run the CLI in-process.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

__all__ = ["main"]

_logger = logging.getLogger("patchword")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="patchword", description=__doc__.split("\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_, help_text) in _DELEGATED.items():
        sub.add_parser(name, help=help_text, add_help=False)

    demo = sub.add_parser("demo", help="train and evaluate SEPS on the synthetic scenes (CPU, no download)")
    demo.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. train.time_budget_s=60")
    demo.add_argument("--no-plots", action="store_true", help="skip the PNG figures")

    train = sub.add_parser("train", help="train a model and evaluate its best dev checkpoint")
    train.add_argument("--config", type=Path, help="YAML file with RunConfig fields")
    train.add_argument("--resume", action="store_true", help="continue output_dir/name from its last.pt")
    train.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. model.sparse_ratio=0.6")

    ev = sub.add_parser("eval", help="evaluate a trained run directory")
    ev.add_argument("run_dir", type=Path, help="directory written by `patchword train`")
    ev.add_argument("--checkpoint", default="best.pt", help="checkpoint file inside run_dir")
    ev.add_argument(
        "--out", type=Path, help="where to write the metrics JSON (default run_dir/eval_<split>.json)"
    )
    ev.add_argument("--force", action="store_true", help="overwrite an existing --out file")
    ev.add_argument(
        "--ensemble",
        nargs="+",
        type=Path,
        metavar="RUN",
        help="more run directories (or checkpoint files inside them) whose similarity matrices are averaged "
        "with run_dir's, as SCAN / NAAF report their best numbers",
    )
    ev.add_argument("overrides", nargs="*", help="dotted overrides, e.g. eval.split=dev eval.coco_1k=true")
    return parser


# Sub-commands with their own argument parsers: everything after the name is handed to them.
_DELEGATED = {
    "hash": ("patchword.hashing.cli", "cross-modal hashing (UCMFH): hash train | eval | search"),
    "bench": ("patchword.bench", "benchmarks: bench scoring | ..."),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in _DELEGATED:
        import importlib

        return importlib.import_module(_DELEGATED[argv[0]][0]).main(argv[1:])
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )
    try:
        if args.command == "demo":
            from patchword.demo import run_demo

            run_demo(args.overrides, plots=not args.no_plots)
        elif args.command == "train":
            _train(args)
        else:
            _eval(args)
    except (ValueError, FileNotFoundError, FileExistsError) as err:
        _logger.error("%s", err)
        return 2
    return 0


def _train(args: argparse.Namespace) -> None:
    from patchword.config import load_config
    from patchword.train.config import RunConfig
    from patchword.train.run import train_run

    cfg = load_config(RunConfig, args.config, args.overrides)
    summary = train_run(cfg, resume=args.resume)
    print(json.dumps({k: v for k, v in summary.items() if not isinstance(v, (list, dict))}, indent=2))


def _member(path: Path, default_checkpoint: str) -> tuple[Path, Path]:
    """``RUN_DIR`` or ``RUN_DIR/ckpt.pt`` -> (run directory, checkpoint file)."""
    if path.is_file():
        return path.parent, path
    return path, path / default_checkpoint


def _eval(args: argparse.Namespace) -> None:
    import dataclasses

    import torch

    from patchword.config import load_config
    from patchword.data.vocab import WordVocab
    from patchword.eval.metrics import coco_1k_folds, retrieval_metrics
    from patchword.model import build_model
    from patchword.train.checkpoint import load_checkpoint
    from patchword.train.config import RunConfig
    from patchword.train.run import evaluate_model, prepare_data, vocab_words

    members = [(args.run_dir, args.run_dir / args.checkpoint)]
    members += [_member(path, "best.pt") for path in args.ensemble or []]
    ensemble = len(members) > 1
    prepared: dict[str, object] = {}  # identical data configs and vocabularies are tokenised once
    results, reference = [], None
    for run_dir, checkpoint in members:
        cfg = load_config(RunConfig, run_dir / "config.yaml", args.overrides)
        vocab_path = run_dir / "vocab.json"
        tokenizer = WordVocab.load(vocab_path) if vocab_path.is_file() else None
        key = json.dumps([dataclasses.asdict(cfg.data), vocab_words(tokenizer) if tokenizer else None])
        if key not in prepared:
            prepared[key] = prepare_data(cfg.data, tokenizer=tokenizer)
        data = prepared[key]
        model = build_model(cfg.model, vocab_size=data.vocab_size, vocab_words=vocab_words(data.tokenizer))
        model.load_state_dict(load_checkpoint(checkpoint)["model"])
        role = "test" if cfg.eval.split in ("test", cfg.data.test_split) else "dev"
        split = data.splits[role]
        if reference is None:
            reference = (cfg, data, role, split)
        elif split.captions != reference[3].captions or not torch.equal(split.txt2img, reference[3].txt2img):
            raise ValueError(f"{run_dir} evaluates another split than {args.run_dir}: cannot ensemble them")
        metrics = evaluate_model(
            model.to(cfg.device), split, cfg, device=cfg.device, progress=cfg.progress, return_sims=ensemble
        )
        results.append((str(checkpoint), metrics))
    cfg, data, role, split = reference
    out = args.out or args.run_dir / (f"eval_{role}_ensemble.json" if ensemble else f"eval_{role}.json")
    if out.exists() and not args.force:
        raise FileExistsError(f"{out} exists; pass --force to overwrite it or --out for another file")
    if ensemble:
        # Average the matrices (two-stage members contribute their (i2t, t2i) pair; a pair outside one
        # member's shortlist is -inf and stays out of the ensemble's).
        pairs = [m.pop("sims") for _, m in results]
        pairs = [p if isinstance(p, tuple) else (p, p) for p in pairs]
        sims_i2t = sum(p[0] for p in pairs) / len(pairs)
        sims_t2i = sum(p[1] for p in pairs) / len(pairs)
        sims = sims_i2t if all(p[0] is p[1] for p in pairs) else (sims_i2t, sims_t2i)
        metrics = retrieval_metrics(sims, split.txt2img)
        if cfg.eval.coco_1k:
            folds = coco_1k_folds(sims, split.txt2img)
            metrics.update({f"coco1k_{k}": v for k, v in folds.items() if k != "folds"})
        metrics["ensemble"] = [{"checkpoint": path, **m} for path, m in results]
    else:
        metrics = results[0][1]
    if role in data.oracle:
        metrics["oracle_rsum"] = data.oracle[role]["rsum"]
    out.write_text(json.dumps(metrics, indent=2))
    print(json.dumps(metrics, indent=2))


if __name__ == "__main__":
    raise SystemExit(main())
