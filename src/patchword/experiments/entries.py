"""The rows of ``patchword report``: a run, or a variant of a sweep (its seeds' runs), with what each run
was configured with, what its evaluation recorded and what that evaluation scored.

* A run's config is the one it ended with: its ``config.yaml`` with the overrides of its last ``--resume``
  (``resumes.jsonl``; each resume applies its own overrides to ``config.yaml``, as ``resume_run`` does).
* A run's record is its training summary, else the recorded evaluation of its default checkpoint (an
  imported run evaluated with ``patchword eval``), else its ``metrics.json``; ``{}`` for a run nothing
  evaluated (still training, killed): such a row is "not evaluated", never leak-free or complete. An
  exported model directory's ``metrics.json`` is its export record: the evaluation nested in it counts only
  while the directory's ``model.safetensors`` holds the weights that export recorded (their sha256) and
  its ``config.yaml`` is the one it wrote (as ``patchword export`` of such a directory takes it).
* A sweep variant's seeds: those its ``sweep.json`` records finished whose ``summary.json`` is there (one
  whose summary is gone is unfinished, as ``patchword sweep`` takes it); it is INCOMPLETE where seeds it
  was asked for are not: the seeds ``sweep.json`` records set out for it (``planned_seeds``, keyed as
  ``runs``), or, in a record without them, every seed of the sweep (``seeds``). A planned seed whose
  ``summary.json`` exists but which ``sweep.json`` does not list (continued with ``patchword train
  --resume``) is "finished outside the sweep", not missing: rerunning the sweep command records it.
* A run without a usable evaluation whose ``eval_*.json`` files describe something else (made with
  overrides that change what they measure...) keeps them with why each is not used (``Entry.unused``).
* Labels are unique: the shortest suffix of the run's (or sweep's) path that tells it from the other rows'
  (``R/a`` and ``R/x/a`` read ``R/a`` and ``x/a``); everything else is keyed by the row itself.
"""

from __future__ import annotations

import json
import logging
import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

from patchword.config import flat_config
from patchword.errors import DataError, MissingFileError
from patchword.eval.metrics import RECALL_KEYS
from patchword.experiments.fields import AMOUNT, FINITE, FLAG, LIST, MAPPING, TEXT, check_fields
from patchword.experiments.galleries import gallery_of_run, run_dataset
from patchword.experiments.machines import check_sessions
from patchword.experiments.rows import TWO_STAGE_KEYS, has_recalls
from patchword.experiments.sweep import SWEEP_FILE, mean_std_of, read_sweep
from patchword.imports.published import scored_split, split_use
from patchword.readers import read_json
from patchword.runs.config import RunConfig
from patchword.runs.files import CONFIG_FILE, IMPORT_FILE, METRICS_JSON, SUMMARY_FILE, WEIGHTS_FILE
from patchword.runs.load import (
    WEIGHTS_DIGEST_KEY,
    check_export_weights,
    last_session_config,
    resolve_checkpoint,
)
from patchword.runs.recorded import RecordedEvaluations

__all__ = [
    "RECORD_FIELDS",
    "Entry",
    "SeedsDiffer",
    "collect",
    "run_config",
    "unique_labels",
]

#: The fields of an evaluation record the report reads, and what each must hold (null: not recorded).
RECORD_FIELDS = {
    **{key: AMOUNT for key in RECALL_KEYS},
    "images": AMOUNT,
    "captions": AMOUNT,
    "split": TEXT,
    "role": TEXT,
    "dataset": TEXT,
    "leaky": FLAG,
    "model_dtype": TEXT,
    "params_total": AMOUNT,
    "params_trainable": AMOUNT,
    "train_seconds": AMOUNT,
    "train_steps_per_s": AMOUNT,
    "train_sessions": LIST,
    "checkpoint_step": AMOUNT,
    "steps": AMOUNT,
    **{key: AMOUNT for key in TWO_STAGE_KEYS},
    "hybrid_alpha": FINITE,  # the global score's weight in a two-stage re-ranking: any finite number
    "selection_object_recall": MAPPING,
    "selection_object_recall.caption": AMOUNT,
    "selection_chance": MAPPING,
    "selection_chance.caption": AMOUNT,
    "cost": MAPPING,
    **{f"cost.{key}": TEXT for key in ("device", "device_name", "peak_host_scope", "precision")},
    **{
        f"cost.{key}": AMOUNT
        for key in (
            "threads",
            "world_size",
            "scoring_seconds",
            "pairs",
            "pairs_per_s",
            "search_seconds",
            "peak_device_mb",
            "peak_device_growth_mb",
            "device_start_mb",
            "peak_host_rss_mb",
            "peak_host_growth_mb",
            "host_rss_start_mb",
        )
    },
}

_logger = logging.getLogger(__name__)

#: The field of ``sweep.json`` mapping each variant (keyed as ``runs``) to the seeds set out for it.
PLANNED_SEEDS = "planned_seeds"

#: Config keys every run of a sweep has its own value of, or that name where it is.
_PER_RUN = frozenset({"seed", "name", "output_dir"})


@dataclass(frozen=True)
class SeedsDiffer:
    """A config key whose value differs between the seeds of one sweep row: seed -> value."""

    values: dict[int, Any]

    def __str__(self) -> str:
        shown = "; ".join(f"seed {s}: {json.dumps(v, default=str)}" for s, v in self.values.items())
        return f"DIFFERS BETWEEN SEEDS ({shown})"


class Entry:
    """One row: a run, or a variant of a sweep (its finished seeds' runs).

    Attributes:
        label: the row's name (unique among the rows :func:`collect` returns).
        runs: the run directories; ``planned``: the seeds the row set out to run (at least ``len(runs)``);
            ``missing``: the planned seeds not finished; ``outside``: those finished outside the sweep (a
            ``summary.json`` its ``sweep.json`` does not list: rerunning the sweep command records them).
        configs: each run's config as it ended (``config.yaml`` and its last resume's overrides).
        summaries: each run's evaluation record, its fields checked (``{}``: none); ``sources``: the file
            each came from (``metrics.json, metrics`` for an export's nested one; None: none); ``unused``:
            per run without one, its ``eval_*.json`` files that do not describe its checkpoint, ``(name,
            why)`` (an evaluation made with ``data.max_caption_len=20``...).
        scored, uses: each run's scored split (:func:`~patchword.imports.published.scored_split`) and what
            else it is to the run (:func:`~patchword.imports.published.split_use`); None where none.
        galleries, datasets: each run's test gallery and the data it scored
            (:func:`~patchword.experiments.galleries.gallery_of_run`, ``run_dataset``).
        imports: each run's ``import.json`` (``{}``: a run trained here).
        compositional, stale: each run's compositional suite record of its default checkpoint
            (``{}``: none); the runs whose ``eval_compositional.json`` describes something else.
        config: the row's flat config (``seed``: the list of seeds of a multi-run row; a key whose values
            differ between the runs: :class:`SeedsDiffer`); ``seeds_differ``: those keys.
    """

    def __init__(
        self,
        label: str,
        runs: list[Path],
        planned: int | None = None,
        missing: list[int] | None = None,
        outside: list[int] | None = None,
    ) -> None:
        self.label, self.runs = label, runs
        # the seeds a sweep set out to run; fewer finished runs: an interrupted sweep (never shown as whole)
        self.planned = max(planned or 0, len(runs))
        self.missing = list(missing or [])
        self.outside = list(outside or [])
        self.configs = [run_config(run) for run in runs]
        # each run's eval_*.json read (and its checkpoint hashed) once, for its recall and suite records
        recorded = [_recorded(run) for run in runs]
        records = [_evaluation(run, lookup) for run, lookup in zip(runs, recorded, strict=True)]
        self.summaries = [record for record, _, _ in records]
        self.sources = [source for _, source, _ in records]
        # per run, the eval_*.json files that do not describe its checkpoint, where nothing else does
        self.unused = [
            [] if has_recalls(record) else _logged(run, unused)
            for run, (record, _, unused) in zip(runs, records, strict=True)
        ]
        for record, source, _ in records:
            if source is not None:
                check_fields(record, RECORD_FIELDS, source)
                check_sessions(record, source)
        self.scored = [scored_split(r, c.data) for r, c in zip(self.summaries, self.configs, strict=True)]
        self.uses = [split_use(r, c.data) for r, c in zip(self.summaries, self.configs, strict=True)]
        pairs = list(zip(self.summaries, [c.data for c in self.configs], strict=True))
        self.galleries = [gallery_of_run(record, data) for record, data in pairs]
        self.datasets = [run_dataset(record, data) for record, data in pairs]
        self.imports = [_json(run / IMPORT_FILE) for run in runs]  # {}: a run trained here
        self.compositional = [r.suite("compositional")[0] if r is not None else {} for r in recorded]
        # runs whose eval_compositional.json describes something else (another checkpoint, other data, a
        # config edited since, or a file written before records said which)
        self.stale = [
            r.name
            for r, c in zip(runs, self.compositional, strict=True)
            if not c and (r / _SUITE_FILE).is_file()
        ]
        self.config = _row_config(self.configs) if runs else None
        self.seeds_differ = sorted(k for k, v in (self.config or {}).items() if isinstance(v, SeedsDiffer))

    def value(self, key: str) -> tuple[float, float | None] | None:
        """(mean, sample std) of ``key`` (``a.b`` reaches into a mapping) over the entry's summaries, None
        where a run lacks it."""
        values = []
        for record in self.summaries:
            for part in key.split("."):
                record = record.get(part) if isinstance(record, dict) else None
            values.append(record)
        return mean_std_of(values)

    def first(self, key: str) -> Any:
        return next((s[key] for s in self.summaries if key in s), None)


def _recorded(run: Path) -> RecordedEvaluations | None:
    """The recorded evaluations of ``run``'s default checkpoint; None for a run without one."""
    try:
        return RecordedEvaluations(run, resolve_checkpoint(run))
    except MissingFileError:
        return None


def _evaluation(
    run: Path, recorded: RecordedEvaluations | None
) -> tuple[dict[str, Any], str | None, list[tuple[str, str]]]:
    """A run's record and where it came from: its training summary, else the recorded evaluation of its
    default checkpoint (``recorded``: :func:`_recorded`), else its metrics.json (an export record:
    :func:`_exported`); ``({}, None)`` for none. Third, (file name, why) of each ``eval_*.json`` not
    describing the default checkpoint (:meth:`~patchword.runs.recorded.RecordedEvaluations.recall`; ``[]``
    where a summary with recalls is the record: nothing else is looked up)."""
    summary = _json(run / SUMMARY_FILE)
    if summary and has_recalls(summary):
        return summary, str(run / SUMMARY_FILE), []
    evaluation, name, unused = recorded.recall() if recorded is not None else ({}, None, [])
    if summary:
        return summary, str(run / SUMMARY_FILE), unused
    if evaluation:
        return evaluation, str(run / str(name)), unused
    metrics = _json(run / METRICS_JSON)
    if WEIGHTS_DIGEST_KEY in metrics:
        return (*_exported(run, metrics), unused)
    return metrics, (str(run / METRICS_JSON) if metrics else None), unused


def _logged(run: Path, unused: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``unused`` ((file name, why) of a run with no usable evaluation), each logged as a warning: the row
    reads NOT EVALUATED although the user evaluated it."""
    for name, why in unused:
        _logger.warning("%s: not the run's evaluation, not shown: %s", run / name, why)
    return unused


def _exported(run: Path, record: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The evaluation an exported model directory's ``metrics.json`` (``record``) nests, where
    ``patchword export`` would carry it (the export's own checks: the record names the sha256 of
    ``model.safetensors`` and the directory's ``config.yaml`` is the one it wrote) and the file holds those
    weights; ``({}, None)``
    otherwise: its figures are of other weights, or of none (an export of a checkpoint nothing evaluated)."""
    from patchword.runs.export import carries_evaluation

    weights = run / WEIGHTS_FILE
    # a digest that is no string is a damaged record, named (the row was shown NOT EVALUATED unsaid)
    check_fields(record, {WEIGHTS_DIGEST_KEY: TEXT}, str(run / METRICS_JSON), not_null=[WEIGHTS_DIGEST_KEY])
    if not (weights.is_file() and carries_evaluation(record, run)):
        return {}, None
    try:
        check_export_weights(run, weights)
    except DataError as err:  # other weights than the figures describe: the row is not evaluated
        _logger.warning("%s: its recorded evaluation is not shown (%s)", run, err)
        return {}, None
    return record["metrics"], f"{run / METRICS_JSON}, metrics"


_SUITE_FILE = "eval_compositional.json"


def run_config(run: Path) -> RunConfig:
    """The config ``run`` ended with: its ``config.yaml`` with its last resume's overrides
    (:func:`~patchword.runs.load.resume_overrides`); an override that does not apply is a DataError naming
    ``resumes.jsonl``; local paths absolute (:func:`~patchword.runs.config.resolve_run_paths`): a run made
    before config.yaml recorded them so (relative, read from the directory it was made in) compares with a
    new one on the same files."""
    from patchword.runs.config import resolve_run_paths

    return resolve_run_paths(last_session_config(run))


def _json(path: Path) -> dict[str, Any]:
    return read_json(path, path.name, default={})


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def _row_config(configs: list) -> dict[str, Any]:
    """The flat config of a row's runs: a key's value where every run has it, its list of seeds for
    ``seed`` (a multi-run row), a :class:`SeedsDiffer` where the runs differ."""
    flats = [flat_config(c) for c in configs]
    if len(flats) == 1:
        return flats[0]
    seeds = [c.seed for c in configs]
    row: dict[str, Any] = {"seed": seeds}
    for key in sorted(set().union(*flats) - {"seed"}):
        values = [f.get(key) for f in flats]
        if key in _PER_RUN or all(_same(v, values[0]) for v in values):
            row[key] = values[0]
        else:
            row[key] = SeedsDiffer(dict(zip(seeds, values, strict=True)))
    return row


def unique_labels(keys: list[tuple[Path, str]]) -> list[str]:
    """The rows' labels: for each (directory, variant or ``""``), the shortest suffix of the directory's
    path (made absolute, links kept) that no other row's shares, then ``/variant``. The same directory and
    variant twice keep one label (one row, shown twice)."""
    parts = [Path(os.path.abspath(directory)).parts for directory, _ in keys]
    depth = [1] * len(keys)

    def label(i: int) -> str:
        path = PurePath(*parts[i][-depth[i] :]).as_posix() if parts[i] else "."
        return path + (f"/{keys[i][1]}" if keys[i][1] else "")

    while True:
        groups: dict[str, list[int]] = defaultdict(list)
        for i in range(len(keys)):
            groups[label(i)].append(i)
        grew = False
        for members in groups.values():
            if len({(parts[i], keys[i][1]) for i in members}) > 1:
                for i in members:
                    if depth[i] < len(parts[i]):
                        depth[i] += 1
                        grew = True
        if not grew:
            return [label(i) for i in range(len(keys))]


def _sweep_variants(path: Path) -> list[tuple[str, Path, list[int], list[int], list[int]]]:
    """A sweep's rows: (variant or ``""``, its runs' parent directory, its finished seeds, its planned
    seeds, the planned seeds finished outside the sweep: a ``summary.json`` that ``sweep.json`` does not
    list, a seed continued with ``patchword train --resume``), every variant the sweep set out to run (in
    the record's order), then any finished one it does not plan. See the module docstring for the planned
    seeds."""
    sweep = read_sweep(path)
    where = path / SWEEP_FILE
    variants, seeds, done = sweep.get("variants", {}), sweep.get("seeds", []), sweep["runs"]
    recorded = sweep.get(PLANNED_SEEDS) if isinstance(sweep.get(PLANNED_SEEDS), dict) else {}
    rows = []
    for key in dict.fromkeys([*variants, *done]):
        # sweep.json keeps the seeds of a sweep without variants under "runs", as it would a variant named
        # so: the record's variants (or, before it recorded them, a "runs" directory) tell which it is
        named = key != "runs" or key in variants or ("variants" not in sweep and (path / key).is_dir())
        variant = key if named else ""
        if named and (not key or "/" in key or "\\" in key or key.startswith(".")):
            raise DataError(f"{where}: variant {key!r} is not a directory name of the sweep")
        parent = path / variant if variant else path
        listed = [int(s) for s in done.get(key, {})]
        finished = [s for s in listed if (parent / f"seed-{s}" / SUMMARY_FILE).is_file()]
        asked = recorded.get(key)
        if not isinstance(asked, list) or not all(
            isinstance(s, int) and not isinstance(s, bool) for s in asked
        ):
            asked = seeds  # a record without its variants' own seeds: each was asked for all of them
        planned = list(dict.fromkeys([*asked, *listed]))
        outside = [s for s in planned if s not in listed and (parent / f"seed-{s}" / SUMMARY_FILE).is_file()]
        rows.append((variant, parent, finished, planned, outside))
    return rows


def collect(paths: list[Path]) -> list[Entry]:
    """Runs and sweeps -> rows (a sweep: one row per variant it set out to run, those with no finished
    seed yet included: an interrupted sweep never reads as whole), labelled by :func:`unique_labels`."""
    rows: list[tuple[Path, str, list[Path], int | None, list[int], list[int]]] = []
    for path in paths:
        if (path / SWEEP_FILE).exists():
            for variant, parent, finished, planned, outside in _sweep_variants(path):
                runs = [parent / f"seed-{s}" for s in finished]
                missing = [s for s in planned if s not in finished and s not in outside]
                for seed in outside:
                    _logger.warning(
                        "%s: finished outside the sweep (%s does not list it): rerun the sweep command to "
                        "record it",
                        parent / f"seed-{seed}",
                        path / SWEEP_FILE,
                    )
                rows.append((path, variant, runs, len(planned), missing, outside))
        elif (path / CONFIG_FILE).is_file():
            rows.append((path, "", [path], None, [], []))
        else:
            raise MissingFileError(
                f"{path} is neither a run directory nor a sweep (no config.yaml, no sweep.json)"
            )
    labels = unique_labels([(path, variant) for path, variant, *_ in rows])
    return [
        Entry(label, runs, planned, missing, outside)
        for label, (_, _, runs, planned, missing, outside) in zip(labels, rows, strict=True)
    ]
