"""``patchword sweep``: the same recipe over several seeds (and, optionally, named variants), with the mean
and spread of every test metric.

    patchword sweep --config demo --seeds 0,1,2                       # 3 runs of the demo's recipe
    patchword sweep --config demo --seeds 0,1 --name vse-vs-seps \\
        --variant "vse: model.name=vse-tiny model.tiny_pretrained=synthetic-64" \\
        --variant "seps: model.seps.variant=paper"                    # 2 variants x 2 seeds

A sweep directory ``OUTPUT_DIR/NAME`` holds one run directory per variant and seed (``<variant>/seed-<s>``, or
``seed-<s>`` without variants) and ``sweep.json``: the recipe, the overrides, every run's test metrics, and
per variant the mean and the sample standard deviation (n - 1; null for a single seed) of each metric, with
the split, its gallery size and whether the protocol is leaky. It is resumable: a finished run (its
``summary.json`` exists) is kept, an interrupted one (``last.pt``) resumed, one stopped before its first
checkpoint started again (as ``patchword train`` does: only what such a start writes is removed, a seed
directory holding anything else is refused, naming it); what every member left is checked (readable, same
settings: its ``config.yaml`` and every ``--resume`` of it in ``resumes.jsonl``) before the first run, so a
bad one stops the sweep with ``sweep.json`` as it was; ``sweep.json`` is rewritten (atomically) after every
run. A suite file already in a run directory is reused only when it provably scored the run's best checkpoint
without overrides (see :mod:`patchword.experiments.sweep_members`); otherwise it is set aside and the suite
evaluated again. Under ``torchrun`` every process runs every seed in turn (each run uses all processes); rank
0 writes ``sweep.json``.

The record of a sweep name lists every seed and variant ever run under it: a later invocation with fewer
seeds or other variants adds to it, keeping the finished runs it records (read back from their directories
and checked like the runs asked for; one whose ``summary.json`` is gone is left out, its seed still
planned, so the sweep shows as incomplete), ``seeds`` becomes every seed any invocation set out to run, and
``planned_seeds`` (:data:`PLANNED_SEEDS`) those set out for each variant (keyed as ``runs``), so that a
variant run with fewer seeds than another is complete when its own seeds are.

Seeds come from ``--seeds`` alone (``seed=`` among the overrides is refused), at most :data:`MAX_SEEDS`
of them, each in numpy's seed range; ``--name`` is one plain directory name under ``output_dir``.
"""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path
from typing import Any

from patchword.config import SEED_RANGE, check_dir_name
from patchword.errors import ConfigError, ResumeHint
from patchword.eval.metrics import RANK_KEYS, RECALL_KEYS
from patchword.experiments.sweep_members import check_existing_member, suite_figures
from patchword.fileio import atomic_write_text
from patchword.readers import read_json
from patchword.runs.files import CONFIG_FILE, LAST_CHECKPOINT, SUMMARY_FILE

__all__ = [
    "MAX_SEEDS",
    "PLANNED_SEEDS",
    "SWEEP_FILE",
    "mean_std",
    "mean_std_of",
    "parse_seeds",
    "read_sweep",
    "run_sweep",
    "summarize",
    "sweep_hint",
]

#: The key of ``sweep.json``'s ``runs`` / ``summary`` / planned seeds for a sweep without variants (so no
#: variant may have this name).
_NO_VARIANT = "runs"

_logger = logging.getLogger(__name__)

SWEEP_FILE = "sweep.json"
#: The field of ``sweep.json`` mapping each variant (as ``runs`` does) to the seeds set out for it.
PLANNED_SEEDS = "planned_seeds"
#: The test metrics a sweep summarises (those present in a run's summary).
METRICS = (*RECALL_KEYS, *RANK_KEYS)
#: What a sweep records about how its metrics were obtained (from the first run's summary).
PROTOCOL = ("split", "images", "captions", "leaky", "matcher", "dense_pairing", "oracle_rsum")
#: The most seeds one sweep runs (each is a whole training run): more is a typo such as ``0-99999999``.
MAX_SEEDS = 1000


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` or ``"0-4"`` -> the seeds: distinct, in numpy's seed range, at most :data:`MAX_SEEDS`
    (counted before any range is expanded).

    Raises:
        ConfigError: naming ``--seeds``.
    """
    ranges: list[tuple[int, int]] = []
    for part in text.split(","):
        item = part.strip()
        if not item:
            raise ConfigError("--seeds", f"an empty item in {text!r}: expected seeds like 0,1,2 or 0-4")
        low, dash, high = item[1:].partition("-")  # a leading "-" is a sign, not a range
        try:
            ranges.append((int(item[0] + low), int(high)) if dash else (int(item), int(item)))
        except ValueError:
            raise ConfigError("--seeds", f"expected seeds like 0,1,2 or 0-4, got {text!r}") from None
    for low, high in ranges:
        if low > high:
            raise ConfigError("--seeds", f"the range {low}-{high} runs backwards (write {high}-{low})")
        if low < SEED_RANGE[0] or high > SEED_RANGE[1]:
            raise ConfigError("--seeds", f"seeds lie in [0, 2**32 - 1] (numpy's seed range), got {text!r}")
    count = sum(high - low + 1 for low, high in ranges)
    if count > MAX_SEEDS:
        raise ConfigError(
            "--seeds", f"{text!r} is {count} seeds: a sweep runs at most {MAX_SEEDS} (one training run each)"
        )
    seeds = [seed for low, high in ranges for seed in range(low, high + 1)]
    if len(set(seeds)) != len(seeds):
        raise ConfigError("--seeds", f"expected distinct seeds, got {text!r}")
    return seeds


def mean_std(values: list[float]) -> tuple[float, float | None]:
    """The mean and the sample standard deviation (n - 1; None for one value: undefined, not 0)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def mean_std_of(values: list[Any]) -> tuple[float, float | None] | None:
    """:func:`mean_std` of ``values``, None where there are none or one is not a number (None, a string, a
    bool: a record that lacks the figure or holds something else)."""
    if not values or any(not isinstance(v, (int, float)) or isinstance(v, bool) for v in values):
        return None
    return mean_std(values)


def summarize(results: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Per metric the mean and the sample standard deviation over the seeds' summaries (std None, written
    null, for one seed: a spread of one value is undefined)."""
    out: dict[str, Any] = {"n": len(results), "mean": {}, "std": {}}
    keys = [*METRICS, *sorted({k for r in results.values() for k in r if "." in k})]  # suites' figures
    for key in keys:
        values = [float(r[key]) for r in results.values() if isinstance(r.get(key), (int, float))]
        if len(values) != len(results) or not values:
            continue
        out["mean"][key], out["std"][key] = mean_std(values)
    first = next(iter(results.values()), {})
    out["protocol"] = {key: first.get(key) for key in PROTOCOL if key in first}
    return out


def _members(
    overrides: list[str], plan: dict[str, tuple[list[str], list[int]]], sweep_dir: Path
) -> list[tuple[str, int, list[str], Path]]:
    """``(variant, seed, overrides, run directory)`` of every run of the sweep, in the order they run;
    ``plan`` maps each variant to its overrides and its seeds."""
    members = []
    for variant, (extra, seeds) in plan.items():
        parent = sweep_dir / variant if variant else sweep_dir
        for seed in seeds:
            where = [f"output_dir={parent}", f"name=seed-{seed}", f"seed={seed}"]
            members.append((variant, seed, [*overrides, *extra, *where], parent / f"seed-{seed}"))
    return members


def sweep_hint(run_dir: Path, sweep_dir: Path) -> ResumeHint:
    """How an interruption of the run in ``run_dir`` of the sweep in ``sweep_dir`` says to go on
    (:class:`~patchword.errors.ResumeHint`): the same ``patchword sweep`` command, which resumes the run and
    records it in ``sweep.json`` (``patchword train --resume``, the runner's own advice, finishes the run
    but leaves it out of the sweep's record)."""
    rerun = "running the same `patchword sweep` command again"
    return ResumeHint(
        rerun,
        f"continue by {rerun} (it resumes {run_dir} and records it in {sweep_dir / SWEEP_FILE}; "
        "`patchword train --resume` would leave it out of the sweep's record)",
    )


def _run_one(config: str | None, overrides: list[str], run_dir: Path, sweep_dir: Path) -> dict[str, Any]:
    """Train, resume or read back one run of the sweep (checked by
    :func:`~patchword.experiments.sweep_members.check_existing_member`); returns its summary. An
    interruption says to run the sweep command again (:func:`sweep_hint`)."""
    from patchword.runs.config import load_run_config
    from patchword.train.runner import resume_run, train_run

    if (run_dir / SUMMARY_FILE).is_file():
        _logger.info("%s is finished: kept", run_dir)
        return read_json(run_dir / SUMMARY_FILE, "run summary")
    if (run_dir / LAST_CHECKPOINT).is_file():
        _logger.info("%s was interrupted: resuming it", run_dir)
        return resume_run(run_dir, hint=sweep_hint(run_dir, sweep_dir))
    # new, or a start killed before its first checkpoint, which train_run clears and starts again
    return train_run(load_run_config(config, overrides), hint=sweep_hint(run_dir, sweep_dir))


def _refuse_foreign_directory(sweep_dir: Path, key: str) -> None:
    """A sweep directory is new or a sweep's own: never an ordinary run (the sweep would write into it) and
    never a file."""
    if sweep_dir.exists() and not sweep_dir.is_dir():
        raise ConfigError(key, f"{sweep_dir} is a file, not a sweep directory; choose another name")
    if (sweep_dir / CONFIG_FILE).is_file():
        raise ConfigError(
            key, f"{sweep_dir} is a run directory, not a sweep; choose another name (--name) for the sweep"
        )


def read_sweep(sweep_dir: str | Path) -> dict[str, Any]:
    """``sweep_dir/sweep.json``, checked: ``runs`` maps each variant (``runs`` without variants) to its
    finished seeds, ``seeds`` lists the seeds the sweep set out to run, ``variants`` (absent from files
    written before it) maps each variant the sweep set out to run to its overrides, and
    :data:`PLANNED_SEEDS` maps each variant (keyed as ``runs``) to the seeds set out for it; a file written
    before it was recorded gets every variant planned with all of ``seeds`` (what those files meant).

    Raises:
        MissingFileError: no sweep.json.
        DataError: damaged, or not the shape :func:`run_sweep` writes; the message names the file.
    """
    from patchword.errors import DataError

    path = Path(sweep_dir) / SWEEP_FILE
    record = read_json(path, "sweep record")
    runs, seeds = record.get("runs"), record.get("seeds", [])
    if not isinstance(runs, dict) or not all(isinstance(v, dict) for v in runs.values()):
        raise DataError(f"{path}: not a sweep record: 'runs' must map each variant to its seeds' results")
    if not isinstance(seeds, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise DataError(f"{path}: not a sweep record: 'seeds' must be a list of integers")
    if not isinstance(record.get("variants", {}), dict):
        raise DataError(f"{path}: not a sweep record: 'variants' must map each variant to its overrides")
    for variant, done in runs.items():
        if not all(str(s).lstrip("-").isdigit() for s in done):
            raise DataError(
                f"{path}: not a sweep record: variant {variant!r} names a seed that is not a number"
            )
    planned = record.setdefault(
        PLANNED_SEEDS, {v: list(seeds) for v in dict.fromkeys([*record.get("variants", {}), *runs])}
    )
    if not isinstance(planned, dict) or not all(
        isinstance(p, list) and all(isinstance(s, int) and not isinstance(s, bool) for s in p)
        for p in planned.values()
    ):
        raise DataError(f"{path}: not a sweep record: {PLANNED_SEEDS!r} must map each variant to its seeds")
    return record


#: What a sweep sets for each of its runs: a variant's override of one of them would be dropped unsaid.
_SET_BY_SWEEP = ("seed", "output_dir", "name")


def _refuse_set_keys(overrides: list[str], variants: dict[str, list[str]]) -> None:
    """``seed=`` among the common overrides, or any key of :data:`_SET_BY_SWEEP` among a variant's: the
    sweep sets it for every run (the seed from ``--seeds``, the directory from ``output_dir`` and ``--name``).

    Raises:
        ConfigError: naming ``seed`` or ``--variant``.
    """
    for item in overrides:
        if "=" in item and item.split("=", 1)[0].strip() == "seed":
            raise ConfigError("seed", f"is set for each run of a sweep by --seeds: drop {item!r}")
    for variant, extra in variants.items():
        for item in extra:
            key = item.split("=", 1)[0].strip()
            if key in _SET_BY_SWEEP:
                raise ConfigError(
                    "--variant",
                    f"{variant}: {key} is set for each run of a sweep (--seeds, output_dir= and --name "
                    f"outside the variants): drop {item!r}",
                )


def _merge_earlier(
    earlier: dict[str, Any] | None, variants: dict[str, list[str]], seeds: list[int], sweep_dir: Path
) -> tuple[dict[str, tuple[list[str], list[int]]], dict[str, dict[int, dict[str, Any]]]]:
    """This invocation's plan merged with the record ``earlier`` (the ``sweep.json`` an earlier invocation
    under the same name wrote; None: none): the plan (each variant's overrides and seeds: those asked for,
    then the finished ones the record holds and this invocation does not run, read back from their
    directories) and the recorded rows of those kept runs (variant -> seed -> row). A kept run whose
    ``summary.json`` is gone is left out; one of a variant whose overrides the record does not hold (a file
    written before it recorded them) keeps its row as recorded."""
    plan = {variant: (extra, list(seeds)) for variant, extra in variants.items()}
    kept: dict[str, dict[int, dict[str, Any]]] = {}
    recorded = (earlier or {}).get("variants", {})
    for key, done in (earlier or {}).get("runs", {}).items():
        variant = "" if key == _NO_VARIANT and key not in recorded else key
        extra = variants[variant] if variant in variants else recorded.get(variant, None if variant else [])
        if variant and ("/" in variant or variant.startswith(".")):
            extra = None  # not a directory name: nothing is read from where it points
        asked = plan[variant][1] if variant in plan else []
        parent = sweep_dir / variant if variant else sweep_dir
        rows: dict[int, dict[str, Any]] = {}
        for seed, row in done.items():
            if int(seed) in asked or not isinstance(row, dict):
                continue
            if extra is not None and not (parent / f"seed-{seed}" / SUMMARY_FILE).is_file():
                _logger.warning(
                    "%s: no %s any more: left out of the sweep", parent / f"seed-{seed}", SUMMARY_FILE
                )
                continue
            rows[int(seed)] = row
        if rows:
            kept[variant] = rows
            if extra is not None:
                plan[variant] = (extra, [*asked, *rows])
    return plan, kept


def run_sweep(
    config: str | None,
    seeds: list[int],
    overrides: list[str],
    *,
    name: str | None = None,
    variants: dict[str, list[str]] | None = None,
    suites: list[str] | None = None,
) -> dict[str, Any]:
    """Run (or continue) the sweep; returns what ``sweep.json`` holds (plus ``directory``): ``seeds``, every
    seed any invocation set out to run, and :data:`PLANNED_SEEDS`, those of each variant.

    ``suites`` (``compositional``, ``patches``) are evaluated on every finished run that lacks them; their
    accuracies go into the run's row as ``<suite>.<key>``. An earlier ``sweep.json`` of the same name is
    added to, never cut down: its finished runs stay in the record (see the module docstring)."""
    from patchword.distributed import launch_info
    from patchword.runs.config import load_run_config

    _refuse_set_keys(overrides, variants or {})
    base = load_run_config(config, overrides)  # every override checked before anything runs
    variants = variants or {"": []}
    for variant, extra in variants.items():
        load_run_config(config, [*overrides, *extra])
        if variant and ("/" in variant or variant.startswith(".")):
            raise ConfigError("--variant", f"a variant name is a directory name, got {variant!r}")
        if variant == _NO_VARIANT:  # sweep.json keys a sweep without variants "runs"
            raise ConfigError("--variant", f"{variant!r} is the name of a sweep without variants: rename it")
        if re.fullmatch(r"seed-\d+", variant):  # its runs would go inside the run of that seed
            raise ConfigError("--variant", f"{variant!r} is the name of a seed's run directory: rename it")
    if name is None:  # the sweep's directory is NAME-sweep
        check_dir_name(base.name, "name", "the sweep's name without --name (its directory NAME-sweep)")
    elif not name.strip():
        raise ConfigError(
            "--name", f"is the sweep's directory under output_dir: a plain non-empty name, got {name!r}"
        )
    else:
        check_dir_name(name, "--name", "the sweep's directory under output_dir")
    sweep_dir = Path(base.output_dir) / (name if name is not None else f"{base.name}-sweep")
    _refuse_foreign_directory(sweep_dir, "--name")
    launch = launch_info()
    main = launch.rank == 0
    suites = list(suites or [])
    if suites and launch.world_size > 1:
        raise ConfigError("--suite", "the evaluation suites run in one process: sweep without torchrun")
    earlier = read_sweep(sweep_dir) if (sweep_dir / SWEEP_FILE).is_file() else None
    plan, kept = _merge_earlier(earlier, variants, seeds, sweep_dir)
    planned = list((earlier or {}).get("seeds", []))
    per_variant = {key: list(s) for key, s in (earlier or {}).get(PLANNED_SEEDS, {}).items()}
    for variant in variants:  # this invocation's seeds added to each of its variants' (keyed as runs)
        have = per_variant.setdefault(variant or _NO_VARIANT, [])
        have += [seed for seed in seeds if seed not in have]
    record: dict[str, Any] = {
        "config": config,
        "overrides": overrides,
        "seeds": [*planned, *(seed for seed in seeds if seed not in planned)],
        PLANNED_SEEDS: per_variant,
        "variants": {
            **(earlier or {}).get("variants", {}),
            **{v: extra for v, extra in variants.items() if v},
        },
        "runs": {},
        "summary": {},
    }
    position = {seed: i for i, seed in enumerate(record["seeds"])}

    def in_order(seeds: list[int]) -> list[int]:  # the record's order of seeds
        return sorted(seeds, key=lambda seed: position.get(seed, len(position)))

    def store(variant: str) -> None:
        rows = results[variant]
        have = per_variant.setdefault(variant or _NO_VARIANT, [])  # a finished seed was planned
        have += [seed for seed in rows if seed not in have]
        record["runs"][variant or _NO_VARIANT] = {str(seed): rows[seed] for seed in in_order(list(rows))}
        record["summary"][variant or _NO_VARIANT] = summarize(rows)

    results = {variant: dict(rows) for variant, rows in kept.items()}
    for variant in results:  # in the record until read back: a kill now loses none of them
        store(variant)
    members = _members(overrides, {v: (extra, in_order(s)) for v, (extra, s) in plan.items()}, sweep_dir)
    for _, _, member_overrides, run_dir in members:
        check_existing_member(config, member_overrides, run_dir, suites)
    for variant, seed, member_overrides, run_dir in members:
        summary = _run_one(config, member_overrides, run_dir, sweep_dir)
        row = {k: v for k, v in summary.items() if isinstance(v, (int, float, str, bool, type(None)))}
        for suite in suites:
            row.update(suite_figures(run_dir, suite))
        results.setdefault(variant, {})[seed] = row
        store(variant)
        if main:
            sweep_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_text(sweep_dir / SWEEP_FILE, json.dumps(record, indent=2))
    return {**record, "directory": str(sweep_dir)}
