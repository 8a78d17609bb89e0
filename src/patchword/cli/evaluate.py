"""``patchword eval RUN``: score a trained run on one split and write a metrics JSON that says how.

Only the split being scored is read and tokenised (with the run's own saved vocabulary); ``--out`` is
checked before anything else, so a finished evaluation is never lost to an existing file.

Under ``torchrun --nproc_per_node=N -m patchword eval RUN`` the processes share the encoding and the
scoring (:func:`patchword.eval.protocol.evaluate`); rank 0 writes and prints the metrics.

Each mode takes its own options and refuses the others' (one ``error:`` line, exit 2, before anything is
read): an ignored ``--ensemble`` would write a single model's numbers as if they were the ensemble's.
So is an override of a key no evaluation reads (``train.max_steps=5``: :data:`NOT_EVALUATION_KEYS`; a
``precision`` of :data:`~patchword.runs.config.UNREAD_PRECISIONS`, evaluation running no autocast), of a
matcher option its registration declares training-only (``model.seps.detach_selection``:
:func:`patchword.model.training_only_keys`), and of a Hugging Face backbone the run's ``backbones.json``
records (``model.hf_vision``: :func:`patchword.runs.load.check_backbone_overrides`). A key set inside a
mapping given to a whole section (``model.seps={detach_selection: true}``) is refused as its dotted
spelling is.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from patchword.cli.threads import add_threads_argument, check_threads, threads_of
from patchword.runs.config import NOT_EVALUATION_KEYS, not_evaluation_reason

__all__ = ["NOT_EVALUATION_KEYS", "add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, help="directory written by `patchword train`")
    parser.add_argument("--checkpoint", default=None, help="checkpoint file inside run_dir (default best.pt)")
    parser.add_argument(
        "--out",
        type=Path,
        help="where to write the metrics JSON (default run_dir/eval_<split>.json, or eval_<suite>.json); "
        "stdout gets the JSON too, `written: FILE` goes to stderr; '-': no file, the whole record on stdout",
    )
    parser.add_argument("--force", action="store_true", help="overwrite an existing --out file")
    parser.add_argument(
        "--ensemble",
        nargs="+",
        type=Path,
        metavar="RUN",
        help="more run directories (or checkpoint files inside them) whose similarity matrices are averaged "
        "with run_dir's, as SCAN / NAAF report their best numbers; a key=value after them is an override",
    )
    parser.add_argument(
        "--suite",
        choices=("compositional", "patches"),
        help="instead of recall: compositional hard negatives (attribute swap, relation swap, object "
        "replaced, count changed) of the run's synthetic test split, or of --suite-file; patches: linear "
        "probes and patch-word grounding of the image encoder's patch tokens (synthetic scenes)",
    )
    parser.add_argument(
        "--suite-file",
        nargs="+",
        type=Path,
        metavar="JSON",
        help="SugarCrepe-style files (image file, positive caption, negative caption) for real images",
    )
    parser.add_argument("--image-root", type=Path, help="directory the --suite-file image names are in")
    parser.add_argument(
        "--device",
        help="where to evaluate: auto, cpu, cuda, cuda:1, mps (the override device=...; default: the run's, "
        "auto), as index build, search and serve take it",
    )
    add_threads_argument(parser)
    parser.add_argument(
        "overrides", nargs="*", help="dotted overrides, e.g. eval.split=dev eval.coco_1k=true data.root=..."
    )


def _mode(args: argparse.Namespace) -> str | None:
    """The suite to run (None: recall), once the options are checked against it.

    ``--suite-file`` alone means the compositional suite (its files are compositional triples).

    Raises:
        ConfigError: an option the mode does not read, naming the option.
    """
    from patchword.errors import ConfigError

    suite = args.suite or ("compositional" if args.suite_file else None)
    if suite is not None and args.ensemble:
        raise ConfigError(
            "--ensemble", f"averages the recall of several runs; --suite {suite} scores one run: drop one"
        )
    if suite == "patches":
        for flag, value in (("--suite-file", args.suite_file), ("--image-root", args.image_root)):
            if value:
                raise ConfigError(flag, "is read by --suite compositional, not --suite patches")
    if args.image_root and not args.suite_file:
        raise ConfigError("--image-root", "is the directory of the --suite-file images: give --suite-file")
    return suite


#: An override as ``--ensemble``'s list may hold it: a dotted key, ``=``, a value.
_OVERRIDE = re.compile(r"[A-Za-z_][\w.-]*=")


def _take_overrides_from(args: argparse.Namespace, dest: str, flag: str, what: str, plural: str) -> None:
    """A list option takes every argument after it (``eval runs/a --ensemble runs/b data.num_test=200``,
    ``--suite-file a.json data.root=x``): an item that reads as an override (``key=value``) and names no
    existing file or directory is moved to the overrides, in order after those given before it, instead of
    being read as a ``what`` (``plural``: what the message calls several).

    Raises:
        ConfigError: ``flag`` followed by overrides only.
    """
    items = getattr(args, dest)
    if not items:
        return
    from patchword.errors import ConfigError

    moved = [p for p in items if _OVERRIDE.match(str(p)) and not p.exists()]
    setattr(args, dest, [p for p in items if p not in moved])
    args.overrides = [*args.overrides, *map(str, moved)]
    if not getattr(args, dest):
        raise ConfigError(flag, f"names no {what} ({', '.join(map(str, moved))}: overrides, not {plural})")


def _check_ensemble_files(items: list[Path] | None) -> None:
    """An ``--ensemble`` item that is a file is a checkpoint of the run directory it lies in: one in a folder
    that is no run (``--ensemble notes.txt``) would be reported as ``.`` not being a run directory.

    Raises:
        ConfigError: naming ``--ensemble`` and the file.
    """
    from patchword.errors import ConfigError
    from patchword.runs.files import CONFIG_FILE

    for item in items or []:
        if item.is_file() and not (item.parent / CONFIG_FILE).is_file():
            raise ConfigError(
                "--ensemble",
                f"{item} is a file in no run directory (no {CONFIG_FILE} beside it): name a run directory "
                "or a checkpoint inside one",
            )


def _refuse_unread_overrides(overrides: list[str]) -> None:
    """An override of a key no evaluation reads (:data:`NOT_EVALUATION_KEYS`) or of a matcher option
    declared training-only (:func:`~patchword.model.training_only_keys`), refused before anything is read;
    an item without ``=`` is left to the config loader, which names it.

    Raises:
        ConfigError: naming the key and what it changes instead.
    """
    from patchword.errors import ConfigError
    from patchword.model.matcher_options import override_paths, within

    keys = [(key, item) for item in overrides for key in override_paths(item)]
    for key, item in keys:
        why = not_evaluation_reason(key, _value(item) if key == "precision" else None)
        if why is not None:
            raise ConfigError(key, f"does not apply to an evaluation ({why}){within(key, item)}")
    if any(key.startswith("model.") for key, _ in keys):
        from patchword.model import training_only_keys

        training_only = training_only_keys()
        for key, item in keys:
            if key in training_only:
                why = f"a training-only option: {training_only[key]}"
                raise ConfigError(key, f"does not apply to an evaluation ({why}){within(key, item)}")


def _value(item: str):
    """The value of override ``item`` as the config loader parses it (None where it is no YAML)."""
    import yaml

    try:
        return yaml.safe_load(item.split("=", 1)[1].strip())
    except yaml.YAMLError:
        return None  # the loader names the key


def run(args: argparse.Namespace) -> None:
    """stdout is one JSON document whatever the mode (``| jq``): the metrics, or the suite's record (its
    table goes to stderr); ``written: FILE`` goes to stderr. ``--out -`` writes no file and prints the whole
    record the file would hold."""
    from patchword.cli import file_or_stdout
    from patchword.cli.train import quiet_other_rank
    from patchword.distributed import launch_info
    from patchword.errors import ConfigError
    from patchword.runs.evaluate import evaluate_run_dir
    from patchword.runs.suites import evaluate_patch_suite, evaluate_suite

    check_threads(args)  # before anything is read, as every flag
    _take_overrides_from(args, "ensemble", "--ensemble", "run directory", "runs")
    _take_overrides_from(args, "suite_file", "--suite-file", "suite file", "suite files")
    _check_ensemble_files(args.ensemble)
    _refuse_unread_overrides(args.overrides)
    if args.device is not None:  # the flag other verbs have, as the override
        if any(item.startswith("device=") for item in args.overrides):
            raise ConfigError("--device", "is the override device=...: give one of them")
        args.overrides = [*args.overrides, f"device={args.device}"]
    suite = _mode(args)
    to_stdout = args.out is not None and file_or_stdout(args.out, args.force) is None
    with _record_file(args.out) as out, threads_of(args):
        common = dict(overrides=args.overrides, out=out, force=args.force)
        if suite is not None:
            from patchword.eval.compositional import format_compositional_table
            from patchword.eval.patch_probe import format_probe_table

            if suite == "patches":
                result, out = evaluate_patch_suite(args.run_dir, args.checkpoint, **common)
                table = format_probe_table(result)
            else:
                files = dict(suite_files=args.suite_file, image_root=args.image_root)
                result, out = evaluate_suite(args.run_dir, args.checkpoint, **files, **common)
                table = format_compositional_table(result)
            print(table, file=sys.stderr)  # for people; stdout stays one JSON document (| jq)
            _print_record(out, to_stdout, result)
            return

        main = launch_info().rank == 0
        if not main:  # rank 0 reports, as in training
            quiet_other_rank()
        metrics, out = evaluate_run_dir(args.run_dir, args.checkpoint, ensemble=args.ensemble, **common)
        if main:
            _print_record(out, to_stdout, _shown(metrics))


@contextlib.contextmanager
def _record_file(out: Path | None) -> Iterator[Path | None]:
    """Where the evaluation writes its record: ``out``, or for ``--out -`` a file in a temporary directory
    (removed afterwards) whose text :func:`_print_record` prints: the evaluation functions always write
    one, and a file named ``-`` was written before."""
    if out is None or str(out) != "-":
        yield out
        return
    with tempfile.TemporaryDirectory(prefix="patchword-eval-") as tmp:
        yield Path(tmp) / "record.json"


def _print_record(out: Path, to_stdout: bool, shown: dict) -> None:
    """stdout: the record written (``--out -``: its whole text, no file kept) or ``shown``; the file written
    named on stderr."""
    if to_stdout:
        print(out.read_text(encoding="utf-8").rstrip("\n"))
        return
    print(json.dumps(shown, indent=2))
    print(f"written: {out}", file=sys.stderr)  # stdout stays one JSON document (| jq)


#: What stdout shows of each ensemble member (the written file holds its whole record).
_MEMBER_KEYS = ("run_dir", "checkpoint", "checkpoint_step", "rsum", "score_spread")


def _shown(metrics: dict) -> dict:
    """The metrics stdout shows: an ensemble's members by run, checkpoint, step, rSum and score spread."""
    members = metrics.get("ensemble")
    if not isinstance(members, list):
        return metrics
    return {**metrics, "ensemble": [{k: m.get(k) for k in _MEMBER_KEYS} for m in members]}
