"""``patchword bench scoring | two-stage | gallery | all``: the benchmarks as markdown tables (and JSON).

``main(argv)`` takes the arguments after ``bench`` (``main(["scoring", "--quick"])``) and returns an exit
code; ``python -m patchword.bench`` is the same. Thread count (``--threads``) and flush-to-zero of
denormals are set here, for the duration of the command, and restored afterwards.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from patchword.bench.formatting import format_scoring, format_two_stage
from patchword.bench.inputs import DEFAULT_BERT_VOCAB, SCORING_CONFIGS
from patchword.cli import VERBOSE_HELP, verbose_after_verb
from patchword.cli.argtypes import int_at_least
from patchword.errors import ConfigError, PatchwordError, describe_os_error, run_command
from patchword.fileio import atomic_write_text, check_output_file
from patchword.logs import setup_logging

if TYPE_CHECKING:
    from patchword.bench.scoring import ScoringPlan
    from patchword.runs import LoadedRun

__all__ = ["main"]

# --quick: a smoke run at small sizes (explicit size flags still win).
_QUICK = {"images": 16, "caption_images": 8, "ref_captions": 3, "repeats": 1, "peak_size": 512}
_FULL = {"images": 256, "caption_images": 48, "ref_captions": 10, "repeats": 3, "peak_size": 2048}


def _shortlist_sizes(text: str) -> tuple[int, ...]:
    """``--ks``: comma-separated shortlist sizes, each an integer >= 1 (argparse names the flag)."""
    positive = int_at_least(1)
    sizes = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        try:
            sizes.append(positive(item))
        except argparse.ArgumentTypeError as err:
            raise argparse.ArgumentTypeError(f"{err} (in {text!r}; expected sizes like 16,64,128)") from None
    if not sizes:
        raise argparse.ArgumentTypeError(f"expected comma-separated sizes like 16,64,128, got {text!r}")
    return tuple(sizes)


def _finite_float(text: str) -> float:
    """A float that is a number: NaN or infinity would run the whole benchmark and then fail on its scores."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _positive_budget(text: str) -> float:
    """``--max-memory-mb``: a finite number > 0 (NaN reached the engine as ``cannot convert float NaN to
    integer``, for two-stage after the run and its data were loaded)."""
    value = _finite_float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    # -v of the sub-verbs; its default SUPPRESS keeps a -v given before them (bench -v scoring)
    common = argparse.ArgumentParser(add_help=False, parents=[verbose_after_verb()])
    common.add_argument("--quick", action="store_true", help="small sizes, one repeat (a smoke run)")
    common.add_argument(
        "--threads",
        type=int_at_least(0, "0: torch's default"),
        default=0,
        help="torch threads (0 = torch's default)",
    )
    common.add_argument(
        "--json", type=Path, help="write the raw results here ('-': stdout, the tables on stderr)"
    )
    common.add_argument("--force", action="store_true", help="overwrite an existing --json file")
    # Its own parent: gallery's default budget is the device's (a GPU's is not 1024 MiB).
    memory = argparse.ArgumentParser(add_help=False)
    memory.add_argument(
        "--max-memory-mb", type=_positive_budget, default=1024, help="memory budget, MiB (default 1024)"
    )

    scoring = argparse.ArgumentParser(add_help=False)
    scoring.add_argument(
        "--images",
        type=int_at_least(1),
        help="images of the timed block (default 256); the reference loops over captions against all of "
        "them, as the official evaluation does with its 256-image shards",
    )
    scoring.add_argument(
        "--caption-images", type=int_at_least(1), help="the 5 captions of this many images (48)"
    )
    scoring.add_argument(
        "--ref-captions", type=int_at_least(1), help="captions the reference loop scores (10)"
    )
    scoring.add_argument("--repeats", type=int_at_least(1), help="interleaved repeats, the best is kept (3)")
    scoring.add_argument(
        "--configs", default=",".join(SCORING_CONFIGS), help="comma-separated configs (default %(default)s)"
    )
    lengths = scoring.add_mutually_exclusive_group()
    lengths.add_argument("--data", default=None, help="the shared data folder (default ../shared/data)")
    lengths.add_argument(
        "--stand-in-lengths", action="store_true", help="seeded stand-in caption lengths, no data folder"
    )
    scoring.add_argument(
        "--bert-vocab",
        default=None,
        help="BERT vocabulary for dense lengths: a vocab.txt, a tokenizer folder or a cached hub id; one "
        f"given here must load ('' = none: word counts); default {DEFAULT_BERT_VOCAB} where it is cached "
        "offline, else word counts",
    )
    scoring.add_argument(
        "--peak-size", type=int_at_least(1), help="matrix side of the matmul peak measurement (2048)"
    )
    scoring.add_argument("--no-rss", action="store_true", help="skip the fresh-process RSS measurement")

    two_stage = argparse.ArgumentParser(add_help=False)
    two_stage.add_argument(
        "--run-dir", "--run", default=None, help="a trained run directory (`make demo` writes runs/demo)"
    )
    two_stage.add_argument("--checkpoint", default=None, help="weights file in the run (default best.pt)")
    two_stage.add_argument(
        "--ks", type=_shortlist_sizes, default="16,64,128,256", help="shortlist sizes (default %(default)s)"
    )
    two_stage.add_argument(
        "--alpha",
        type=_finite_float,
        default=1.0,
        help="also run k=128 with alpha*global + fine (0 skips it; default %(default)s)",
    )
    two_stage.add_argument(
        "--backend",
        default="exact",
        choices=["exact", "faiss_flat", "faiss_ivf", "faiss_hnsw"],
        help="the first stage's shortlist index: exact (torch), faiss_flat (exact), faiss_ivf or "
        "faiss_hnsw (approximate); faiss_* need the ann extra (default %(default)s)",
    )
    # default 2, 1 with --quick; an explicit value wins over --quick, as --repeats does
    two_stage.add_argument("--two-stage-repeats", type=int_at_least(1), help="timing repeats, best kept (2)")

    gallery = argparse.ArgumentParser(add_help=False)
    gallery.add_argument(
        "--shapes",
        default=None,
        help="comma-separated gallery shapes: 1k (1000 x 5000), 10k (10000 x 50000), 100k (100000 x 500000), "
        "quick (20 x 100); default 1k,10k,100k (quick with --quick)",
    )
    gallery.add_argument(
        "--config",
        default="seps-code-image",
        help=f"the matcher config scored (default seps-code-image; one of {', '.join(SCORING_CONFIGS)})",
    )
    gallery.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default cpu)")
    # a shape predicted to end past the budget stops after its first block and is extrapolated (marked)
    gallery.add_argument(
        "--max-seconds", type=float, default=600.0, help="wall-clock budget in seconds (default %(default)g)"
    )
    gallery.add_argument(
        "--max-memory-mb",
        type=_positive_budget,
        default=None,
        help="the scoring engine's budget (default the device's: 1024 on the CPU, half a GPU's free memory)",
    )
    gallery.add_argument(
        "--workdir", type=Path, default=None, help="folder for the matrix files (default a temporary folder)"
    )
    gallery.add_argument(
        "--keep",
        action="store_true",
        help="keep the matrices in --workdir (gallery-SHAPE-NxM.f32 once complete, with .partial added "
        "while scoring or when the shape is extrapolated; --force overwrites)",
    )
    gallery.add_argument(
        "--block-images", type=int_at_least(1), help="images per score_matrix call (100 CPU, 1000 GPU)"
    )
    gallery.add_argument("--block-captions", type=int_at_least(1), help="captions per call (5000)")

    parser = argparse.ArgumentParser(
        prog="patchword bench", description="Benchmarks of exhaustive scoring and two-stage search."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    sub = parser.add_subparsers(dest="what", required=True, metavar="{scoring,two-stage,gallery,all}")
    sub.add_parser(
        "scoring",
        parents=[common, memory, scoring],
        help="score_matrix throughput vs the per-caption reference loop",
    )
    sub.add_parser("two-stage", parents=[common, memory, two_stage], help="two-stage search vs exhaustive")
    sub.add_parser(
        "gallery",
        parents=[common, gallery],
        help="exhaustive scoring at gallery shapes (1K x 5K to 100K x 500K) into a memory-mapped matrix",
    )
    sub.add_parser("all", parents=[common, memory, scoring, two_stage], help="scoring, then two-stage")
    probe = sub.add_parser("_rss")  # internal: one scoring call in a fresh process (memory.py)
    probe.add_argument("--config", required=True, choices=list(SCORING_CONFIGS))
    probe.add_argument("--images", type=int, required=True)
    probe.add_argument("--caption-images", type=int, required=True)
    probe.add_argument("--max-memory-mb", type=float, required=True)
    probe.add_argument("--data", default=None)
    probe.add_argument("--stand-in-lengths", action="store_true")
    probe.add_argument("--bert-vocab", default=None)
    probe.add_argument("--threads", type=int, default=0)  # the timed run's: the engine's workers follow them
    return parser


def _size(args: argparse.Namespace, name: str) -> int:
    value = getattr(args, name)
    return value if value is not None else (_QUICK if args.quick else _FULL)[name]


#: What the scoring benchmark's checks call its arguments: the flags.
_SCORING_FLAGS = {
    "images": "--images",
    "caption_images": "--caption-images",
    "ref_captions": "--ref-captions",
    "configs": "--configs",
    "max_memory_mb": "--max-memory-mb",
    "bert_vocab": "--bert-vocab",
    "stand_in_lengths": "--stand-in-lengths",
}


def _scoring_plan(args: argparse.Namespace) -> ScoringPlan:
    """The sizes, configs, budget and lengths of the scoring benchmark, checked (errors name the flags) and
    read once, before any benchmark runs: what :func:`run_scoring` measures."""
    from patchword.bench.scoring import plan_scoring

    return plan_scoring(
        images=_size(args, "images"),
        caption_images=_size(args, "caption_images"),
        ref_captions=_size(args, "ref_captions"),
        configs=[c for c in args.configs.split(",") if c],
        max_memory_mb=args.max_memory_mb,
        data=args.data,
        bert_vocab=DEFAULT_BERT_VOCAB if args.bert_vocab is None else args.bert_vocab or None,
        vocab_must_load=args.bert_vocab is not None,  # one the user gave: it must load, not fall back
        stand_in_lengths=args.stand_in_lengths,
        names=_SCORING_FLAGS,
    )


def _scoring(args: argparse.Namespace, plan: ScoringPlan) -> dict[str, Any]:
    from patchword.bench.scoring import run_scoring

    return run_scoring(
        plan=plan,
        repeats=_size(args, "repeats"),
        rss=not (args.quick or args.no_rss),
        peak_size=_size(args, "peak_size"),
    )


def _two_stage(args: argparse.Namespace, run: LoadedRun) -> dict[str, Any]:
    from patchword.bench.two_stage import run_two_stage

    kw = {"ks": args.ks, "alpha": args.alpha, "max_memory_mb": args.max_memory_mb, "backend": args.backend}
    return run_two_stage(run=run, repeats=args.two_stage_repeats or (1 if args.quick else 2), **kw)


# --quick: the tiny gallery shape in blocks small enough that it takes several (explicit flags still win).
_QUICK_GALLERY = {"shapes": "quick", "block_images": 8, "block_captions": 40}


def _gallery(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    """``run_gallery`` of the flags; it checks them all before any work."""
    from patchword.bench.gallery import refuse_repeated_shapes, run_gallery

    quick = _QUICK_GALLERY if args.quick else {}
    shapes = args.shapes if args.shapes is not None else quick.get("shapes", "1k,10k,100k")
    shapes = [s.strip() for s in shapes.split(",") if s.strip()]
    refuse_repeated_shapes(shapes)
    return run_gallery(
        shapes=shapes,
        config=args.config,
        device=args.device,
        max_seconds=args.max_seconds,
        max_memory_mb=args.max_memory_mb,
        workdir=args.workdir,
        keep=args.keep,
        overwrite=args.force,
        block_images=args.block_images or quick.get("block_images"),
        block_captions=args.block_captions or quick.get("block_captions"),
        command="patchword bench " + shlex.join(argv),
        results_file=None if args.json is None or _to_stdout(args) else args.json,
        on_interrupt=lambda result: None if args.json is None else _rows_kept(args.json, result),
    )


def _to_stdout(args: argparse.Namespace) -> bool:
    """``--json -``: the results are stdout's one JSON document (| jq), so the tables go to stderr."""
    return args.json is not None and str(args.json) == "-"


def _write_json(path: Path, results: dict[str, Any]) -> None:
    if str(path) == "-":
        print(json.dumps(results, indent=2))
    else:
        atomic_write_text(path, json.dumps(results, indent=2))


def _rows_kept(path: Path, result: dict[str, Any]) -> str:
    """A gallery run stopped by a signal: its finished rows to ``--json``, and where, for its message."""
    _write_json(path, result)
    return f"their rows are {'on stdout' if str(path) == '-' else f'in {path}'}, marked interrupted"


_RUN_FLAGS = ("--run-dir", "--checkpoint")


def _check_run_dir(args: argparse.Namespace) -> None:
    """``--run-dir``, ``--checkpoint`` and ``--backend`` of the two-stage part: errors name the flag."""
    from patchword.bench.two_stage import check_backend, check_run

    if args.run_dir is None:
        raise ConfigError(
            "--run-dir",
            "the two-stage benchmark needs a trained run: run `make demo` (writes runs/demo) "
            "or pass --run-dir RUN",
        )
    check_run(args.run_dir, args.checkpoint, names=_RUN_FLAGS)
    check_backend(args.backend, "--backend")


def _check(args: argparse.Namespace) -> tuple[ScoringPlan | None, LoadedRun | None]:
    """Every flag of the verb before anything runs: a benchmark can take many minutes, and a result file
    that cannot be written, or a run that is not there or whose checkpoint does not load, must not be found
    out at its end. Returns the scoring benchmark's plan (``scoring`` and ``all``) and the run of the
    two-stage one (``two-stage`` and ``all``: loaded last, the costliest check), else None."""
    from patchword.bench.two_stage import load_checked_run

    if args.json is not None and not _to_stdout(args):
        try:
            check_output_file(args.json, args.force, flag="--json")
        except OSError as err:  # a folder that takes no files (/proc, read-only): name the flag too
            if isinstance(err, PatchwordError):
                raise
            raise ConfigError("--json", f"{args.json} cannot be written: {describe_os_error(err)}") from None
    two_stage = args.what in ("two-stage", "all")
    if two_stage:
        _check_run_dir(args)
    plan = _scoring_plan(args) if args.what in ("scoring", "all") else None
    return plan, load_checked_run(args.run_dir, args.checkpoint, _RUN_FLAGS) if two_stage else None


def _run(args: argparse.Namespace, argv: list[str]) -> int:
    plan, run = _check(args)  # the gallery's own flags: run_gallery checks them all before any work
    tables = sys.stderr if _to_stdout(args) else sys.stdout
    if args.what == "gallery":  # its own JSON shape, which `patchword report` reads
        from patchword.bench.gallery import format_gallery

        result = _gallery(args, argv)
        print(format_gallery(result), file=tables)
        if args.json is not None:
            _write_json(args.json, result)
        return 0
    results: dict[str, Any] = {"command": "patchword bench " + " ".join(argv)}
    if args.what in ("scoring", "all"):
        results["scoring"] = _scoring(args, plan)
        print(format_scoring(results["scoring"]), file=tables)
    if args.what in ("two-stage", "all"):
        results["two_stage"] = _two_stage(args, run)
        print(format_two_stage(results["two_stage"]), file=tables)
    if args.json is not None:
        _write_json(args.json, results)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``patchword bench {scoring,two-stage,gallery,all} [options]``; 0 on success, 2 on a user error."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    setup_logging(args.verbose, fmt="%(message)s")
    if args.what == "_rss":  # the fresh process of the memory probe
        from patchword.bench.memory import run_probe

        run_probe(args)
        return 0
    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)  # denormals would make timings depend on the random inputs
    try:  # user and operating-system errors (an unwritable --json) as one line, exit 2
        return run_command(lambda: _run(args, argv), args.verbose)
    finally:  # main() also runs in-process (tests, the top-level CLI): leave the caller's settings
        torch.set_num_threads(threads)
        torch.set_flush_denormal(False)  # torch's default; torch has no getter to restore from
