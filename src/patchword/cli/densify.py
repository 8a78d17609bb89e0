"""``patchword densify``: SEPS dense captions from a local vision-language model; ``merge``; ``stats``.

``main(argv)`` takes the arguments *after* ``densify``::

    patchword densify --images DIR --model llava-hf/llava-1.5-7b-hf --out dense.jsonl
    patchword densify --data-root data/f30k --split train --image-root data/flickr30k-images \\
        --model tiny-random --out f30k_train_dense.jsonl --shard 0/4
    patchword densify --karpathy dataset_flickr30k.json --split test --image-root data/flickr30k-images \\
        --model tiny-random --out f30k_test_dense.jsonl
    patchword densify merge dense.shard-*.jsonl --out dense.jsonl
    patchword densify stats dense.jsonl [--bert-vocab DIR] [--json]

Exit codes: 0 done, 1 finished but incomplete (unreadable images skipped, or an image whose description
came out empty: named), 2 user error (one line), 128 + signal when SIGTERM / SIGINT stopped it (one
``interrupted:`` line; what it created and left empty is removed). What a job did is said on stderr
(:mod:`patchword.cli.densify_report`); stdout carries only ``stats``'s report.
Under torchrun (``WORLD_SIZE`` > 1, no ``--shard``) every rank writes ``<out stem>.shard-R-of-W<suffix>``
and rank 0 merges them into ``--out`` once all are complete. An option the chosen images (or ``stats``
without ``--synthetic-split``) would ignore, such as ``--images DIR --split test``, is refused, naming it.

The image sources' flags (and the synthetic scenes' config they set, which ``stats`` reads too) are
:mod:`patchword.cli.densify_sources`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import sys
import time
from pathlib import Path

from patchword.cli import VERBOSE_HELP
from patchword.cli.densify_report import report_job, say
from patchword.cli.densify_sources import (
    STATS_SYNTHETIC_FLAGS,
    add_source_arguments,
    image_list,
    synthetic_config,
)
from patchword.cli.threads import add_threads_argument, threads_of
from patchword.errors import run_command
from patchword.logs import setup_logging

__all__ = ["main"]

_logger = logging.getLogger("patchword.densify")

_SUBVERBS = ("merge", "stats")


def _parser(prog: str, description: str) -> argparse.ArgumentParser:
    """A verb's parser with the ``-v`` every verb has."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    return p


def _run_parser() -> argparse.ArgumentParser:
    p = _parser(
        "patchword densify",
        "Describe every image with a vision-language model into SEPS dense-caption JSONL "
        "(resumable: rerun the same command after an interruption). Also: `patchword densify merge "
        "SHARD... --out F` and `patchword densify stats FILE`.",
    )
    add_source_arguments(p)
    mdl = p.add_argument_group("model")
    mdl.add_argument("--model", required=True, help="local directory, hub id, or tiny-random (smoke test)")
    mdl.add_argument("--model-id", help="name written into each line (default: hub id or directory name)")
    mdl.add_argument("--allow-download", action="store_true", help="let a hub id be downloaded")
    mdl.add_argument("--device", default="auto", help="auto (GPU of this rank if any), cpu, cuda, cuda:N")
    mdl.add_argument(
        "--precision",
        default="auto",
        choices=["auto", "fp32", "bf16", "fp16"],
        help="the model's weights and compute (default auto: bf16 on a GPU that has it, else fp32)",
    )
    add_threads_argument(mdl)
    gen = p.add_argument_group("generation")
    gen.add_argument("--prompt", help="instruction shown with each image (default: the SEPS prompt)")
    gen.add_argument(
        "--max-new-tokens", type=int, default=500, help="the longest description, in tokens (default 500)"
    )
    gen.add_argument("--batch-size", type=int, default=8, help="images per generate call (default 8)")
    gen.add_argument("--sample", action="store_true", help="sample (SEPS: temperature 0.2, top-p 0.9)")
    gen.add_argument("--temperature", type=float, help="with --sample (default 0.2)")  # None: not given
    gen.add_argument("--top-p", type=float, help="with --sample (default 0.9)")
    gen.add_argument("--seed", type=int, help="with --sample: batch k is seeded with seed + k (default 0)")
    run = p.add_argument_group("output")
    run.add_argument("--out", type=Path, required=True, help="the JSONL file (appended, resumable)")
    run.add_argument("--shard", help="describe only shard I of N (0-based), e.g. 0/4")
    run.add_argument(
        "--skip-bad-images", action="store_true", help="skip unreadable images instead of stopping"
    )
    run.add_argument(
        "--no-merge",
        action="store_true",
        help="under torchrun (without --shard): leave the per-rank files unmerged; refused elsewhere",
    )
    run.add_argument("--no-progress", action="store_true", help="log lines instead of a progress bar")
    return p


def _merge_parser() -> argparse.ArgumentParser:
    p = _parser("patchword densify merge", "Join shard files of one densify job, in image order.")
    p.add_argument("shards", nargs="+", type=Path, help="the shard files (any order)")
    p.add_argument("--out", type=Path, required=True, help="the merged JSONL file to write")
    p.add_argument("--force", action="store_true", help="overwrite an existing --out")
    return p


def _stats_parser() -> argparse.ArgumentParser:
    p = _parser("patchword densify stats", "Quality report of dense-caption JSONL files.")
    p.add_argument("files", nargs="+", type=Path, help="dense-caption JSONL files (densify's or released)")
    p.add_argument(
        "--bert-vocab", help="BERT vocab.txt, tokenizer directory or cached hub id: exact token counts"
    )
    p.add_argument(
        "--synthetic-split",
        help="count the scene objects each description names (ids syn-<split>-<i> or numbers); automatic for "
        "files written by densify --synthetic",
    )
    p.add_argument("--synthetic-seed", type=int, help="with --synthetic-split: generator seed (default 0)")
    p.add_argument(
        "--synthetic-num-images",
        type=int,
        help="with --synthetic-split: images of the split (default: generator's)",
    )
    p.add_argument(
        "--token-limits",
        type=int,
        nargs="+",
        default=[90, 128],
        help="report the share of descriptions longer than these BERT token counts (default 90 128)",
    )
    p.add_argument(
        "--json", action="store_true", help="print the report as JSON, an object keyed by file path"
    )
    return p


def _setup_logging(verbose: bool) -> None:
    setup_logging(verbose)
    if not verbose:
        try:
            from transformers.utils import logging as hf_logging

            hf_logging.set_verbosity_error()
            hf_logging.disable_progress_bar()
        except ImportError:
            pass


def main(argv: list[str] | None = None) -> int:
    """Run ``patchword densify <argv>``: 0 done, 1 incomplete (images skipped or described with nothing),
    2 user error."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # the sub-verb may follow -v (`densify -v merge ...`): the flags before it are kept for its parser
    lead = len(list(itertools.takewhile(lambda arg: arg in ("-v", "--verbose"), argv)))
    verb = argv[lead] if lead < len(argv) and argv[lead] in _SUBVERBS else "run"
    parser = {"run": _run_parser, "merge": _merge_parser, "stats": _stats_parser}[verb]()
    args = parser.parse_args([*argv[:lead], *argv[lead + 1 :]] if verb != "run" else argv)
    _setup_logging(args.verbose)
    if verb == "merge":
        merging = "while merging: rerun the same command (the shards are untouched)"
        return run_command(lambda: _stopping(merging, lambda: _merge(args)), args.verbose)
    if verb == "stats":
        return run_command(lambda: _stats(args), args.verbose)

    def job() -> int:
        with threads_of(args):  # checked first; the caller's count back afterwards
            return _run(args, parser)

    describing = "while describing images: finished images are kept; rerun the same command"
    # a missing optional dependency is a user error too (MissingExtraError); finished images are kept
    return run_command(
        lambda: _stopping(describing, job), args.verbose, "rerun the same command: finished images are kept"
    )


def _stopping(then: str, job) -> int:
    """``job()`` with SIGTERM / SIGINT raised as :class:`~patchword.errors.Interrupted` (``interrupted:
    SIGTERM received {then}``, exit 128 + signal), as the training commands do: SIGTERM's default action
    (``kill``, a scheduler's pre-emption) ended the process on the spot, saying nothing and leaving the
    empty output, its lock file and the folders made for them, which the output lock takes back when the
    command stops by an exception (:func:`patchword.densify.lock.output_lock`)."""
    from patchword.train.process import stop_raises

    with stop_raises({"then": then}):
        return job()


# --------------------------------------------------------------------------------------------------------
# run
# --------------------------------------------------------------------------------------------------------


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from patchword.densify.config import DEFAULT_PROMPT, GenerationSettings, resolve_device, resolve_precision
    from patchword.densify.runner import densify
    from patchword.densify.shards import parse_shard, shard_from_env, shard_output_path
    from patchword.densify.store import check_output_path
    from patchword.densify.vlm import check_model_id, load_vlm
    from patchword.errors import ConfigError

    sampling = {"temperature": args.temperature, "top_p": args.top_p, "seed": args.seed}
    given = {key: value for key, value in sampling.items() if value is not None}
    if given and not args.sample:  # greedy decoding would ignore it without a word
        flag = "--" + next(iter(given)).replace("_", "-")
        raise ConfigError(
            flag, "applies only with --sample (greedy decoding ignores it): add --sample or drop it"
        )
    settings = GenerationSettings(
        prompt=args.prompt if args.prompt is not None else DEFAULT_PROMPT,
        max_new_tokens=args.max_new_tokens,
        do_sample=args.sample,
        **given,
    )
    _refuse_stdout(args.out)
    check_model_id(args.model_id)  # here too: a finished file returns before load_vlm would check it
    shard = parse_shard(args.shard) if args.shard else None
    ranked = shard_from_env() if shard is None else None
    if args.no_merge and ranked is None:  # a job of one file: nothing to merge, the flag would do nothing
        where = "a --shard job writes its shard file alone" if shard else "this is no torchrun launch"
        raise ConfigError(
            "--no-merge",
            f"applies under torchrun without --shard, where rank 0 merges the ranks' files; {where}: drop it",
        )
    device = resolve_device(args.device)
    precision = resolve_precision(args.precision, device)
    # what the user chose, compared with a finished file's sidecar before the model loads (auto: the
    # model and device decide, as for the file's first run)
    explicit = {"model_id": args.model_id, "precision": None if args.precision == "auto" else precision}
    images = image_list(args, parser)
    out = args.out
    if ranked is not None:
        check_output_path(out)  # the merge's --out, read before any rank's own file is checked
        if _finished_job(out, images, settings, args.model, explicit):
            say(f"{out}: complete ({len(images)} images); nothing to do")
            return 0
        shard, out = ranked, shard_output_path(args.out, ranked)
        _logger.info("torchrun rank %d of %d writes %s", ranked.index, ranked.count, out)

    def load():
        return load_vlm(
            args.model,
            device=device,
            precision=precision,
            allow_download=args.allow_download,
            model_id=args.model_id,
        )

    result = densify(
        images,
        load,
        out,
        settings,
        model_name=args.model,
        **explicit,
        batch_size=args.batch_size,
        shard=shard,
        on_bad_image="skip" if args.skip_bad_images else "error",
        progress=False if args.no_progress else None,
    )
    if report_job(result):  # on stderr: stdout is for results, as in every verb
        return 1
    if ranked is not None and ranked.index == 0 and not args.no_merge:
        _wait_and_merge(args.out, ranked)
    return 0


def _finished_job(out: Path, images, settings, model_name: str, explicit: dict[str, str | None]) -> bool:
    """Under torchrun ``--out`` is written by the merge: it must not exist yet, or be this job, finished
    (``explicit``: the ``model_id`` / ``precision`` the user gave, as :func:`is_complete` compares them)."""
    from patchword.densify.resume import is_complete

    if not out.exists():
        return False
    if is_complete(out, images, settings, model_name=model_name, **explicit):
        return True
    raise FileExistsError(f"{out} exists and is not this job's finished output; choose another --out")


def _wait_and_merge(out: Path, shard, poll_s: float = 10.0) -> None:
    """Rank 0: wait until every rank's shard file is complete, then merge them into ``out``."""
    from patchword.densify.shards import Shard, merge_shards, read_checked_sidecar, shard_output_path
    from patchword.densify.store import read_records

    paths = [shard_output_path(out, Shard(r, shard.count)) for r in range(shard.count)]
    last_log = 0.0
    while True:
        waiting = []
        for path in paths:
            meta = read_checked_sidecar(path) if path.exists() else None
            if meta is None or len(read_records(path)[0]) != meta["stop"] - meta["start"]:
                waiting.append(path.name)
        if not waiting:
            break
        if time.monotonic() - last_log > 60:
            _logger.info("rank 0 waits for %d shard(s) before merging: %s", len(waiting), ", ".join(waiting))
            last_log = time.monotonic()
        time.sleep(poll_s)
    lines = merge_shards(paths, out)
    say(f"merged {len(paths)} shards into {out} ({lines} lines)")


# --------------------------------------------------------------------------------------------------------
# merge, stats
# --------------------------------------------------------------------------------------------------------


def _refuse_stdout(out: Path) -> None:
    """``--out -``, stdout elsewhere (``eval``, ``hash``), refused (ConfigError): never a file named ``-``."""
    from patchword.errors import ConfigError

    if str(out) == "-":
        raise ConfigError("--out", "- (stdout) is not taken here: the JSONL is a file (and its sidecar)")


def _merge(args: argparse.Namespace) -> int:
    from patchword.densify.shards import merge_shards

    _refuse_stdout(args.out)
    lines = merge_shards(args.shards, args.out, force=args.force)
    say(f"merged {len(args.shards)} shards into {args.out} ({lines} lines)")
    return 0


def _synthetic_for(path: Path, args: argparse.Namespace):
    """``(split, SyntheticConfig)`` for the scene coverage, from the flags or the file's sidecar."""
    from patchword.data.synthetic import SyntheticConfig
    from patchword.densify.store import read_sidecar, sidecar_path
    from patchword.errors import ConfigError, DataError

    if args.synthetic_split:
        return args.synthetic_split, synthetic_config(
            args.synthetic_seed or 0,
            args.synthetic_split,
            args.synthetic_num_images,
            flags=STATS_SYNTHETIC_FLAGS,
        )
    meta = read_sidecar(path)
    source = meta.get("source") if meta else None
    if isinstance(source, dict) and source.get("kind") == "synthetic":
        try:
            fields = {k: tuple(v) if isinstance(v, list) else v for k, v in source["config"].items()}
            return source["split"], SyntheticConfig(**fields)
        except (KeyError, AttributeError, TypeError, ConfigError) as err:
            # densify wrote a valid config there: an unknown field or a refused value was edited in
            raise DataError(
                f"{sidecar_path(path)}: source.config is not a synthetic generator config ({err}); the "
                "sidecar was edited or damaged (--synthetic-split SPLIT gives the scenes instead)"
            ) from err
    return None


def _stats(args: argparse.Namespace) -> int:
    from patchword.densify.stats import dense_stats, format_stats, read_texts
    from patchword.errors import ConfigError

    for flag in ("--synthetic-seed", "--synthetic-num-images"):
        if getattr(args, flag[2:].replace("-", "_")) is not None and not args.synthetic_split:
            raise ConfigError(
                flag, "is read only with --synthetic-split (without it, each file's sidecar names its scenes)"
            )
    too_low = [k for k in args.token_limits if k < 1]
    if too_low:  # a share of descriptions "longer than 0 tokens" (or -5) says nothing about a length limit
        raise ConfigError("--token-limits", f"must be BERT token counts of at least 1, got {too_low}")
    bert = None
    if args.bert_vocab:  # as bench scoring loads it: any failure is one line naming the flag and the file
        from patchword.bench.inputs import check_bert_vocab

        try:
            bert = check_bert_vocab(args.bert_vocab, "--bert-vocab")
        except ConfigError as err:
            if Path(args.bert_vocab).expanduser().exists():  # found but unreadable: its reason is the news
                raise
            missing = f"{args.bert_vocab} does not exist (nor is it a hub id in the local Hugging Face cache)"
            raise ConfigError("--bert-vocab", missing) from err
    reports = {}
    for path in args.files:
        data = read_texts(path)
        reports[str(path)] = dense_stats(
            data, bert=bert, token_limits=args.token_limits, synthetic=_synthetic_for(path, args)
        )
    if args.json:  # keyed by path whatever the number of files: a script reads one shape
        print(json.dumps(reports, indent=2))
    else:
        print("\n\n".join(format_stats(path, report) for path, report in reports.items()))
    return 0


if __name__ == "__main__":  # torchrun --nproc_per_node=N -m patchword.cli.densify --images ... --out ...
    raise SystemExit(main())
