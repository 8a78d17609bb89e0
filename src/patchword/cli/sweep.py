"""``patchword sweep``: one recipe over several seeds (and named variants), with the mean and spread of every
test metric in ``sweep.json`` (see :mod:`patchword.experiments.sweep`).

    patchword sweep --config demo --seeds 0,1,2          # or --seeds 0 1 2, --seeds 0-2
    patchword sweep --config demo --seeds 0 --name comparison --suite compositional \\
        --variant "vse: model.name=vse-tiny model.tiny_pretrained=synthetic-64" \\
        --variant "seps-paper: model.seps.variant=paper"
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_arguments", "format_summary", "parse_variant", "run", "seeds_and_overrides"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", help="YAML file with RunConfig fields, or a shipped recipe's name (e.g. demo)"
    )
    parser.add_argument(
        "--seeds",
        required=True,
        nargs="+",
        metavar="SEEDS",
        help="seeds: 0,1,2 or 0-4, or several such parts (0 1 2, 0-4 7); distinct, at most 1000; a "
        "key=value after them is an override",
    )
    parser.add_argument("--name", help="the sweep directory's name under output_dir (default <name>-sweep)")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar='"NAME: OVERRIDES"',
        help="a named variant: its overrides on top of the common ones (repeat for more variants)",
    )
    parser.add_argument(
        "--suite",
        action="append",
        choices=("compositional", "patches"),
        default=[],
        help="also run this evaluation suite on every finished run (repeatable)",
    )
    parser.add_argument("overrides", nargs="*", help="dotted overrides shared by every run")


def parse_variant(text: str) -> tuple[str, list[str]]:
    """``"vse: model.name=vse-tiny x.y=1"`` -> ("vse", ["model.name=vse-tiny", "x.y=1"])."""
    from patchword.errors import ConfigError

    name, sep, rest = text.partition(":")
    if not sep or not name.strip():
        raise ConfigError("--variant", f'expected "NAME: key=value ...", got {text!r}')
    overrides = shlex.split(rest)
    bad = [item for item in overrides if "=" not in item]
    if bad:
        raise ConfigError("--variant", f"{name.strip()}: expected key=value overrides, got {bad[0]!r}")
    return name.strip(), overrides


def seeds_and_overrides(parts: list[str], overrides: list[str]) -> tuple[list[int], list[str]]:
    """``--seeds``'s arguments (``["0,1", "2-4"]``: each a list or a range, as one ``--seeds 0,1,2-4``) ->
    (the seeds, ``overrides`` followed by the ``key=value`` items ``--seeds`` took from the end of its list:
    ``--seeds 0 1 train.epochs=3``, argparse giving a list option every argument after it; as ``eval
    --ensemble`` hands its own on).

    Raises:
        ConfigError: naming ``--seeds``: a part :func:`~patchword.experiments.sweep.parse_seeds` refuses,
            no seed, a seed in two parts, more than ``MAX_SEEDS`` in all.
    """
    from patchword.errors import ConfigError
    from patchword.experiments.sweep import MAX_SEEDS, parse_seeds

    first = next((i for i, part in enumerate(parts) if "=" in part), len(parts))
    if first == 0:
        raise ConfigError("--seeds", f"names no seed: {parts[0]!r} is an override; give the seeds first")
    # everything from the first override on is overrides (an item without "=" there is the loader's error)
    parts, overrides = parts[:first], [*overrides, *parts[first:]]
    seeds = [seed for part in parts for seed in parse_seeds(part)]
    given = " ".join(parts)
    if len(set(seeds)) != len(seeds):
        raise ConfigError("--seeds", f"expected distinct seeds, got {given!r}")
    if len(seeds) > MAX_SEEDS:
        raise ConfigError(
            "--seeds",
            f"{given!r} is {len(seeds)} seeds: a sweep runs at most {MAX_SEEDS} (one training run each)",
        )
    return seeds, overrides


def run(args: argparse.Namespace) -> None:
    from patchword.distributed import launch_info
    from patchword.errors import ConfigError
    from patchword.experiments.sweep import run_sweep

    variants: dict[str, list[str]] = {}
    for name, overrides in (parse_variant(v) for v in args.variant):
        if name in variants:
            raise ConfigError("--variant", f"two variants share the name {name!r}")
        variants[name] = overrides
    seeds, overrides = seeds_and_overrides(args.seeds, list(args.overrides))
    record = run_sweep(
        args.config,
        seeds,
        overrides,
        name=args.name,
        variants=variants or None,
        suites=args.suite,
    )
    if launch_info().rank == 0:
        print(format_summary(record))
        print(f"written: {record['directory']}/sweep.json", file=sys.stderr)  # stdout: the summary alone


def format_summary(record: dict[str, Any]) -> str:
    """Per variant, its finished seeds of those planned for it (``n of planned``, INCOMPLETE when fewer)
    and each metric's ``mean ± std`` (sample standard deviation; none shown for one seed, where it is
    undefined), as ``sweep.json`` (:func:`~patchword.experiments.sweep.run_sweep`'s record) holds them.
    A sweep without variants is shown under its directory's name."""
    from patchword.experiments.sweep import PLANNED_SEEDS

    planned, summaries = record.get(PLANNED_SEEDS, {}), record["summary"]
    lines = []
    for key in dict.fromkeys([*planned, *summaries]):
        summary = summaries.get(key, {"n": 0, "mean": {}, "std": {}})
        total = max(len(planned.get(key, [])), summary["n"])
        label = Path(record["directory"]).name if key == "runs" and key not in record["variants"] else key
        mark = " (INCOMPLETE)" if summary["n"] < total else ""
        lines.append(f"{label}: {summary['n']} of {total} seeds{mark}")
        means = {k: f"{m:.2f}" for k, m in summary["mean"].items()}
        key_width, mean_width = (max(map(len, texts), default=0) for texts in (means, means.values()))
        lines += [
            f"  {k:<{key_width}}  {m:>{mean_width}}"
            + ("" if summary["std"].get(k) is None else f" ± {summary['std'][k]:.2f}")
            for k, m in means.items()
        ]
    return "\n".join(lines)
