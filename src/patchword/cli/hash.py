"""``patchword hash train|eval|search``: UCMFH cross-modal hashing from the command line.

``main(argv)`` takes the arguments *after* ``hash`` (``main(["train", "--bits", "64"])``) and returns an
exit code, so tests and the top-level ``patchword`` CLI call it in-process.

Configuration is :class:`~patchword.hashing.config.HashRunConfig`: defaults, then ``--config run.yaml``,
then dotted overrides (``train.epochs=100 data.format=pairs``, before or after the flags), then the
shortcut flags (``--bits``, ``--epochs``, ...); a flag and an override of its key with another value
(``--bits 32 model.bits=16``, ``hash eval --map-all eval.map_all=false``) are refused, naming both. An old
run's ``--config RUN/config.yaml`` starts a new run with its ``train.hashnet_alpha: 0.0`` read as unset, as
its resume reads it (:func:`~patchword.hashing.config.new_run_config`). ``hash train --resume RUN``
continues a run with its own saved config, as ``patchword train --resume`` does: only the keys in
:data:`~patchword.hashing.config.HASH_RESUMABLE_KEYS` may be overridden (``--epochs 100``,
``device=cuda:0``; one not given keeps the value the run's last session ran with). ``train.num_threads``
(when > 0) sets torch's thread count here, in the application,
for the duration of ``hash train``: the library's training functions never change it (``hash eval`` and
``hash search`` take ``--threads N``, as the other verbs that run a model). SIGTERM / SIGINT
stop ``hash train`` with ``last.pt`` written and exit 128 + signal, one ``interrupted:`` line naming the
resume command. ``hash eval`` reports which checkpoint (epoch, step, finished) it evaluated. A data flag
or key the chosen ``data.format`` does not read (``--data synthetic --image x.npy``) is refused, naming it, as
is a key that splits one set of pairs (``data.num_query=200``) given for pre-split files, ``data.split_seed``
for synthetic data (split in order) and a ``data.synthetic_*`` key for data read from files.

``hash search`` (its parser, queries, index cache and results) is :mod:`patchword.cli.hash_search`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from patchword.cli.hash_search import add_search_parser, run_search
from patchword.cli.threads import add_threads_argument, threads_of
from patchword.config import parse_with_overrides
from patchword.errors import ConfigError, MissingExtraError, run_command
from patchword.fileio import atomic_write_text, check_output_file
from patchword.logs import setup_logging

__all__ = ["main"]

_SHORTCUTS = {
    "bits": "model.bits",
    "fusion": "model.fusion",
    "epochs": "train.epochs",
    "loss": "train.loss",
    "seed": "train.seed",
    "batch_size": "train.batch_size",
    "data": "data.format",
    "image": "data.image",
    "text": "data.text",
    "labels": "data.labels",
    "root": "data.root",
    "output_dir": "output_dir",
    "name": "name",
    "device": "device",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="patchword hash", description="UCMFH cross-modal hashing: train, evaluate, search."
    )
    from patchword.cli import VERBOSE_HELP, verbose_after_verb

    parser.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    common = verbose_after_verb()  # -v after the command too (`patchword -v hash ...` hands it on last)
    sub = parser.add_subparsers(dest="command", required=True)

    tr = sub.add_parser(
        "train", help="train a UCMFH hashing model and evaluate it once at the end", parents=[common]
    )
    tr.add_argument("--config", type=Path, help="YAML file with HashRunConfig fields")
    tr.add_argument(
        "--resume",
        nargs="?",
        const="",
        metavar="RUN",
        help="continue a run from its last.pt with its own saved config: a run directory, or (without a "
        "value) the run --output-dir / --name point at. Only train.epochs, train.save_every, "
        "train.num_threads, device and eval options may be overridden.",
    )
    tr.add_argument("--bits", type=int, help="code length, model.bits: 16, 32, 64, 128 (default 64)")
    tr.add_argument(
        "--fusion",
        choices=["unimodal", "official_fused"],
        help="model.fusion (default unimodal); official_fused = official pair encoding with batch attention "
        "(leaky; see docs/hashing.md)",
    )
    tr.add_argument("--epochs", type=int, help="training epochs, train.epochs (default 50)")
    tr.add_argument(
        "--loss",
        choices=["infonce", "balanced", "infonce_i2t", "hashnet"],
        help="training loss, train.loss (default infonce)",
    )
    tr.add_argument("--seed", type=int, help="random seed, train.seed (default 2023)")
    tr.add_argument("--batch-size", dest="batch_size", type=int, help="train.batch_size (default 128)")
    tr.add_argument(
        "--data",
        choices=["synthetic", "pairs", "splits", "mat"],
        help="where the features come from, data.format (default synthetic)",
    )
    tr.add_argument("--image", help="image features .npy (data=pairs)")
    tr.add_argument("--text", help="text features .npy (data=pairs)")
    tr.add_argument("--labels", help="optional labels .npy (data=pairs)")
    tr.add_argument("--root", help="split directory (data=splits) or .mat file (data=mat)")
    tr.add_argument(
        "--output-dir", dest="output_dir", help="directory the run directory goes in (default runs/hash)"
    )
    tr.add_argument("--name", help="run name (default from data, bits, loss, seed)")
    tr.add_argument("--device", help="torch device, e.g. cpu or cuda:0 (default cpu)")
    tr.add_argument(
        "overrides", nargs="*", help="dotted overrides, e.g. train.lr_heads=1e-3 data.num_query=200"
    )

    ev = sub.add_parser(
        "eval", help="evaluate a run directory (mAP@K, precision / recall, PR curve)", parents=[common]
    )
    ev.add_argument(
        "run_dir", type=Path, metavar="RUN_DIR", help="directory written by `patchword hash train`"
    )
    ev.add_argument(
        "--out",
        type=Path,
        help="also write the metrics JSON here (stdout gets it either way; `written: FILE` goes to stderr; "
        "'-': stdout only)",
    )
    ev.add_argument("--force", action="store_true", help="overwrite an existing --out / --pr-plot file")
    ev.add_argument("--pr-plot", dest="pr_plot", type=Path, help="write the Hamming-radius PR curve PNG here")
    ev.add_argument(
        "--map-all", dest="map_all", action="store_true", help="also compute mAP over the full ranking"
    )
    add_threads_argument(ev)
    ev.add_argument("overrides", nargs="*", help="dotted overrides, e.g. eval.topk=100")

    add_search_parser(sub, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``patchword hash <argv>``; returns 0 on success, 2 on a user error (one ``error:`` line), 128 +
    signal when SIGTERM / SIGINT stopped training (one ``interrupted:`` line saying how to resume)."""
    from patchword.hashing.config import HashRunConfig

    # overrides may follow options, as in `patchword train`; an unknown --flag that is a key is said so
    args = parse_with_overrides(_parser(), argv, config=HashRunConfig)
    setup_logging(args.verbose)
    return run_command(lambda: _dispatch(args), args.verbose)


def _dispatch(args: argparse.Namespace) -> None:
    """The sub-command; eval and search with their ``--threads`` (checked first), training with its
    ``train.num_threads``, which its run records."""
    if args.command == "train":
        return _train(args)
    with threads_of(args):
        return {"eval": _eval, "search": run_search}[args.command](args)


def _train(args: argparse.Namespace) -> None:
    from patchword.hashing.config import check_data_source, check_hash_config, new_run_config, override_keys
    from patchword.hashing.runner import resume_hashing, train_hashing
    from patchword.train.process import torch_threads

    given = {key: attr for attr, key in _SHORTCUTS.items() if getattr(args, attr) is not None}
    flags = [f"{key}={getattr(args, attr)}" for key, attr in given.items()]
    _refuse_flag_and_override(args, given)
    try:
        if args.resume is not None:
            if args.config is not None:
                raise ConfigError("--config", "a resumed run keeps its own config.yaml: drop --config")
            run_dir, overrides = _resume_target(args.resume, [*args.overrides, *flags])
            # train.num_threads: the override's, else the one the run's last session ran with
            summary = resume_hashing(run_dir, overrides, threads=torch_threads)
        else:
            # an old run's config.yaml (its hashnet_alpha 0.0 = unset) starts a run as resume reads it
            cfg = new_run_config(args.config, [*args.overrides, *flags])
            check_data_source(cfg.data, flags={key: _flag(attr) for key, attr in given.items()})
            check_hash_config(cfg)  # before torch_threads applies train.num_threads (torch refuses < 0)
            with torch_threads(cfg.train.num_threads):
                # a data key an override sets that the format would ignore is refused, default values too
                summary = train_hashing(cfg, given_keys=override_keys([*args.overrides, *flags]))
    except ConfigError as err:
        if err.key not in given:
            raise
        # the flags win over overrides: a refused value of a shortcut's key came from the flag
        raise ConfigError(err.key, f"{err.detail} (set by {_flag(given[err.key])})") from err
    print(json.dumps(summary, indent=2))


def _refuse_flag_and_override(args: argparse.Namespace, given: dict[str, str]) -> None:
    """A shortcut flag and a dotted override of its key with another value (``--bits 32 model.bits=16``,
    ``--output-dir X output_dir=Y``, ``hash eval --map-all eval.map_all=false``): the flag won without a
    word. The same value twice is no conflict; an override the loader refuses (a wrong value) is left to it.
    ``given``: the key each flag given sets -> its attribute (``{"model.bits": "bits"}``).

    Raises:
        ConfigError: naming the flag and the override.
    """
    from patchword.config import apply_overrides, flat_config
    from patchword.hashing.config import HashRunConfig

    # `--resume train.epochs=3`: argparse took the first override as --resume's value
    resume = getattr(args, "resume", None)  # hash train's alone
    taken = [resume] if resume and "=" in resume else []
    for item in [*taken, *args.overrides]:
        key = item.partition("=")[0].strip()
        if "=" not in item or key not in given:
            continue
        value = getattr(args, given[key])
        try:
            both = [flat_config(apply_overrides(HashRunConfig(), [x]))[key] for x in (item, f"{key}={value}")]
        except ConfigError:
            continue
        if both[0] != both[1]:
            shown = "given" if value is True else value  # a switch (--map-all) has no value to show
            raise ConfigError(
                _flag(given[key]), f"{shown}, but the override {item} sets {key} too: give one of them"
            )


def _resume_target(resume: str, overrides: list[str]) -> tuple[Path, list[str]]:
    """``--resume RUN`` or ``--resume --name X [--output-dir Y]`` -> (run directory, remaining overrides)."""
    from patchword.hashing.config import HashRunConfig

    if "=" in resume:  # argparse took the first override as the value: `--resume train.epochs=9`
        overrides, resume = [resume, *overrides], ""
    if resume:
        return Path(resume), overrides
    where = {"output_dir": HashRunConfig.output_dir, "name": ""}
    rest = []
    for item in overrides:
        key, _, value = item.partition("=")
        if key.strip() in where:
            where[key.strip()] = value.strip()
        else:
            rest.append(item)
    if not where["name"]:
        raise ConfigError("name", "--resume needs a run directory (--resume runs/hash/NAME) or --name NAME")
    return Path(where["output_dir"]) / where["name"], rest


def _flag(attr: str) -> str:
    """The command-line flag of a shortcut's attribute: ``output_dir`` -> ``--output-dir``."""
    return "--" + attr.replace("_", "-")


def _check_plot_file(path: Path, force: bool) -> None:
    """Before the evaluation: ``--pr-plot`` names a new file (or ``force``) in a writable directory, with a
    suffix matplotlib writes (it picks the format)."""
    check_output_file(path, force, flag="--pr-plot")
    try:
        from matplotlib.figure import Figure
    except ImportError as err:  # pragma: no cover - only without the extra
        raise MissingExtraError("--pr-plot needs matplotlib: pip install 'patchword[plots]'") from err
    formats = Figure().canvas.get_supported_filetypes()
    if path.suffix.lstrip(".").lower() not in formats:
        raise ConfigError(
            "--pr-plot", f"{path}: the suffix picks the image format, one of {', '.join(formats)}"
        )


def _refuse_one_file_twice(outputs: dict[str, Path | None]) -> None:
    """Two output flags naming one file (``--out e.png --pr-plot e.png``, or through a link or ``..``) are
    refused: the second write replaced the first (the plot was overwritten by the JSON, exit 0).

    Raises:
        ConfigError: naming both flags and the file.
    """
    seen: dict[Path, str] = {}
    for flag, path in outputs.items():
        if path is None:
            continue
        where = path.expanduser().resolve()
        if where in seen:
            raise ConfigError(flag, f"{path} is also {seen[where]}'s file: give each output its own file")
        seen[where] = flag


def _eval(args: argparse.Namespace) -> None:
    import torch

    from patchword.cli import file_or_stdout
    from patchword.hashing.config import alpha_record, check_data_source
    from patchword.hashing.evaluate import encode_hashing_split, evaluate_hashing
    from patchword.hashing.metrics import plot_pr_curves, precision_recall_curve
    from patchword.hashing.runner import open_hashing_run, refuse_run_outputs

    # '-': stdout, which gets the JSON anyway; --force may still replace a --pr-plot
    out = file_or_stdout(args.out, args.force and args.pr_plot is None, "--out / --pr-plot file")
    outputs = {"--out": out, "--pr-plot": args.pr_plot}
    _refuse_one_file_twice(outputs)
    _refuse_flag_and_override(args, {"eval.map_all": "map_all"} if args.map_all else {})
    refuse_run_outputs(args.run_dir, outputs)  # --force replaces none of the run's files
    if out is not None:
        check_output_file(out, args.force)
    if args.pr_plot is not None:
        _check_plot_file(args.pr_plot, args.force)
    # a data source key the overrides set that the run's format (with them) would ignore: once config.yaml
    # is read, before the data are
    run = open_hashing_run(
        args.run_dir, args.overrides, check=lambda c: check_data_source(c.data, args.overrides)
    )
    cfg, model, data = run.cfg, run.model, run.data
    refuse_run_outputs(args.run_dir, outputs, cfg=cfg)  # nor a feature file its data section reads
    if args.map_all:
        cfg.eval.map_all = True
    with torch.no_grad():
        metrics = evaluate_hashing(model, data, cfg.eval, cfg.device)
    if args.pr_plot is not None:
        q_img, q_txt = encode_hashing_split(model, data.query.image, data.query.text, cfg.device)
        db_img, db_txt = encode_hashing_split(model, data.retrieval.image, data.retrieval.text, cfg.device)
        ql, dbl = data.query.relevance, data.retrieval.relevance
        curves = {
            f"I->T {model.bits} bits": precision_recall_curve(q_img, db_txt, ql, dbl),
            f"T->I {model.bits} bits": precision_recall_curve(q_txt, db_img, ql, dbl),
        }
        plot_pr_curves(curves, args.pr_plot, title=f"UCMFH {model.fusion}, {args.run_dir.name}")
    # which weights these numbers describe (the checkpoint's epoch and step, whether the run finished) and
    # on which data (query / retrieval sizes, source, split seed), as hash train's summary says
    record = {**metrics, **alpha_record(cfg), "checkpoint": run.checkpoint, "data": data.summary()}
    text = json.dumps(record, indent=2)
    if out is not None:
        atomic_write_text(out, text)
    print(text)  # stdout: the JSON alone (| jq), with --out as without it, as `patchword eval` does
    written = [path for path in (out, args.pr_plot) if path is not None]
    if written:
        print("written: " + ", ".join(map(str, written)), file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
