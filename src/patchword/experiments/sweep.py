"""``patchword sweep``: the same recipe over several seeds (and, optionally, named variants), with the mean
and spread of every test metric.

    patchword sweep --config demo --seeds 0,1,2                       # 3 runs of the demo's recipe
    patchword sweep --config demo --seeds 0,1 --name vse-vs-seps \\
        --variant "vse: model.name=vse-tiny model.tiny_pretrained=synthetic-64" \\
        --variant "seps: model.seps.variant=paper"                    # 2 variants x 2 seeds

A sweep directory ``OUTPUT_DIR/NAME`` holds one run directory per variant and seed
(``<variant>/seed-<s>``, or ``seed-<s>`` without variants) and ``sweep.json``: the recipe, the overrides,
every run's test metrics, and per variant the mean and the sample standard deviation (n - 1) of each
metric, with the split, its gallery size and whether the protocol is leaky. It is resumable: a finished run
(its ``summary.json`` exists) is kept, an interrupted one (``last.pt``) resumed, one stopped before its first
checkpoint started again; what every member left is checked (readable, same settings) before the first run,
so a bad one stops the sweep with ``sweep.json`` as it was; ``sweep.json`` is rewritten (atomically) after
every run. Under ``torchrun`` every process runs every seed in turn (each run uses all processes); rank 0
writes ``sweep.json``.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path
from typing import Any

from patchword.errors import ConfigError
from patchword.eval.metrics import RANK_KEYS, RECALL_KEYS
from patchword.fileio import atomic_write_text
from patchword.readers import read_json
from patchword.runs.files import CONFIG_FILE, LAST_CHECKPOINT, SUMMARY_FILE

__all__ = ["SWEEP_FILE", "mean_std", "parse_seeds", "read_sweep", "run_sweep", "summarize"]

_logger = logging.getLogger(__name__)

SWEEP_FILE = "sweep.json"
#: The test metrics a sweep summarises (those present in a run's summary).
METRICS = (*RECALL_KEYS, *RANK_KEYS)
#: What a sweep records about how its metrics were obtained (from the first run's summary).
PROTOCOL = ("split", "images", "captions", "leaky", "matcher", "dense_pairing", "oracle_rsum")


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` or ``"0-4"`` -> the seeds."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            if "-" in part.strip()[1:]:
                low, high = part.split("-", 1)
                seeds += list(range(int(low), int(high) + 1))
            elif part.strip():
                seeds.append(int(part))
    except ValueError:
        raise ConfigError("--seeds", f"expected seeds like 0,1,2 or 0-4, got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ConfigError("--seeds", f"expected distinct seeds, got {text!r}")
    return seeds


def mean_std(values: list[float]) -> tuple[float, float]:
    """The mean and the sample standard deviation (n - 1; 0 for one value)."""
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
    return mean, math.sqrt(var)


def summarize(results: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Per metric the mean and the sample standard deviation over the seeds' summaries (std 0 for one)."""
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
    overrides: list[str], variants: dict[str, list[str]], seeds: list[int], sweep_dir: Path
) -> list[tuple[str, int, list[str], Path]]:
    """``(variant, seed, overrides, run directory)`` of every run of the sweep, in the order they run."""
    members = []
    for variant, extra in variants.items():
        parent = sweep_dir / variant if variant else sweep_dir
        for seed in seeds:
            where = [f"output_dir={parent}", f"name=seed-{seed}", f"seed={seed}"]
            members.append((variant, seed, [*overrides, *extra, *where], parent / f"seed-{seed}"))
    return members


def _check_existing_member(
    config: str | None, overrides: list[str], run_dir: Path, suites: list[str]
) -> None:
    """What an earlier sweep left in ``run_dir`` is readable and made with the settings asked for now: checked
    for every member before the first run, so that a bad one stops the sweep before ``sweep.json`` is
    rewritten (the seeds before it would otherwise replace a complete record)."""
    from patchword.runs.config import load_run_config

    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError("--name", f"{run_dir} is a file where the sweep keeps a run: move it away")
    if (run_dir / CONFIG_FILE).is_file():
        _refuse_other_settings(run_dir, load_run_config(config, overrides))
    if (run_dir / SUMMARY_FILE).is_file():
        read_json(run_dir / SUMMARY_FILE, "run summary")
        for suite in suites:
            if (run_dir / f"eval_{suite}.json").is_file():
                read_json(run_dir / f"eval_{suite}.json", "suite evaluation")


def _run_one(config: str | None, overrides: list[str], run_dir: Path, dist_main: bool) -> dict[str, Any]:
    """Train, resume or read back one run of the sweep (checked by :func:`_check_existing_member`); returns
    its summary."""
    from patchword.runs.config import load_run_config
    from patchword.train.runner import resume_run, train_run

    if (run_dir / SUMMARY_FILE).is_file():
        _logger.info("%s is finished: kept", run_dir)
        return read_json(run_dir / SUMMARY_FILE, "run summary")
    if (run_dir / LAST_CHECKPOINT).is_file():
        _logger.info("%s was interrupted: resuming it", run_dir)
        return resume_run(run_dir)
    if run_dir.exists() and dist_main:  # stopped before its first checkpoint: nothing to keep
        shutil.rmtree(run_dir)
    return train_run(load_run_config(config, overrides))


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
    written before it) maps each variant the sweep set out to run to its overrides.

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
    return record


def _refuse_other_settings(run_dir: Path, wanted) -> None:
    """A run directory left by an earlier sweep is kept or resumed only if it was made with the settings
    asked for now: a changed override under the same sweep name would otherwise mix two recipes in one
    mean."""
    from patchword.config import flat_config
    from patchword.runs import read_run_config

    saved, asked = flat_config(read_run_config(run_dir)), flat_config(wanted)
    changed = sorted(k for k in saved.keys() | asked.keys() if saved.get(k) != asked.get(k))
    if changed:
        shown = ", ".join(f"{k} {saved.get(k)!r} -> {asked.get(k)!r}" for k in changed[:3])
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        raise ConfigError(
            "--name", f"{run_dir} was made with other settings ({shown}{more}): give the sweep another --name"
        )


def run_sweep(
    config: str | None,
    seeds: list[int],
    overrides: list[str],
    *,
    name: str | None = None,
    variants: dict[str, list[str]] | None = None,
    suites: list[str] | None = None,
) -> dict[str, Any]:
    """Run (or continue) the sweep; returns what ``sweep.json`` holds (plus ``directory``).

    ``suites`` (``compositional``, ``patches``) are evaluated on every finished run that lacks them; their
    accuracies go into the run's row as ``<suite>.<key>``."""
    from patchword.distributed import launch_info
    from patchword.runs.config import load_run_config

    base = load_run_config(config, overrides)  # every override checked before anything runs
    variants = variants or {"": []}
    for variant, extra in variants.items():
        load_run_config(config, [*overrides, *extra])
        if variant and ("/" in variant or variant.startswith(".")):
            raise ConfigError("--variant", f"a variant name is a directory name, got {variant!r}")
    sweep_dir = Path(base.output_dir) / (name or f"{base.name}-sweep")
    _refuse_foreign_directory(sweep_dir, "--name")
    launch = launch_info()
    main = launch.rank == 0
    suites = list(suites or [])
    if suites and launch.world_size > 1:
        raise ConfigError("--suite", "the evaluation suites run in one process: sweep without torchrun")
    record: dict[str, Any] = {
        "config": config,
        "overrides": overrides,
        "seeds": seeds,
        "variants": {v: extra for v, extra in variants.items() if v},
        "runs": {},
        "summary": {},
    }
    members = _members(overrides, variants, seeds, sweep_dir)
    for _, _, member_overrides, run_dir in members:
        _check_existing_member(config, member_overrides, run_dir, suites)
    results: dict[str, dict[int, dict[str, Any]]] = {}
    for variant, seed, member_overrides, run_dir in members:
        summary = _run_one(config, member_overrides, run_dir, main)
        row = {k: v for k, v in summary.items() if isinstance(v, (int, float, str, bool, type(None)))}
        for suite in suites:
            row.update(_suite(run_dir, suite))
        results.setdefault(variant, {})[seed] = row
        record["runs"].setdefault(variant or "runs", {})[str(seed)] = row
        record["summary"][variant or "runs"] = summarize(results[variant])
        if main:
            sweep_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_text(sweep_dir / SWEEP_FILE, json.dumps(record, indent=2))
    return {**record, "directory": str(sweep_dir)}


def _suite(run_dir: Path, suite: str) -> dict[str, float]:
    """A suite's accuracies for one run (evaluated once: its JSON in the run directory is reused)."""
    from patchword.runs.evaluate import evaluate_patch_suite, evaluate_suite

    path = run_dir / f"eval_{suite}.json"
    if path.is_file():
        result = read_json(path, "suite evaluation")
    elif suite == "compositional":
        result, _ = evaluate_suite(run_dir)
    else:
        result, _ = evaluate_patch_suite(run_dir)
    return {
        f"{suite}.{k}": float(v)
        for k, v in _flat(result).items()
        if isinstance(v, (int, float))
        and not k.startswith("n.")
        and not k.endswith("seconds")  # counts, times
    }


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        elif not isinstance(value, bool):
            out[f"{prefix}{key}"] = value
    return out
