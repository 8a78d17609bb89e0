"""The ``README.md`` model card of an exported run (``patchword export``, :mod:`patchword.runs.export`).

Generated from the run and the export's record (its ``metrics.json``): the matcher and its reported options,
each encoder and where its weights came from (:mod:`patchword.runs.origins`: an imported checkpoint, a warm
start, pretrained tiny encoders, a Hugging Face backbone, or scratch), the training data and the exported
checkpoint's step, the evaluation of that checkpoint with its split, gallery size and protocol, and for an
imported official checkpoint the published results of its method beside the numbers measured here
(:mod:`patchword.imports.published`). An export of an exported directory names the run the weights were
exported from and, where it carries that export's evaluation, says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from patchword.data.prepare import reads_dense_text
from patchword.errors import ConfigError
from patchword.eval.two_stage import TWO_STAGE_RECALLS, two_stage_of
from patchword.imports import published as published_table
from patchword.matching import DEFAULT_MATCHER
from patchword.model import reported_options
from patchword.model_configs import named_model_mapping
from patchword.readers import read_json
from patchword.runs.files import BACKBONES_FILE, IMPORT_FILE
from patchword.runs.load import WEIGHTS_DIGEST_KEY
from patchword.runs.origins import encoder_kinds, encoder_origins, warm_start_line

__all__ = ["CARD_KEYS", "model_card"]

#: The recall figures the model card shows, in its column order.
CARD_KEYS = ("i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10", "rsum")


def _read_json(path) -> dict[str, Any]:
    return read_json(path, path.name, default={})


def _what(mc) -> str:
    """What the model is, for the card's first sentence: its matcher, and the named architecture it started
    from (``seps-tiny-32``). A matcher other than the one that architecture names replaced it: the name then
    says only where the encoders came from (`mine` matcher on the `seps-tiny-32` encoders)."""
    if not mc.name:
        return f"`{mc.matcher}`"
    try:
        named = named_model_mapping(mc.name).get("matcher", DEFAULT_MATCHER)
    except ConfigError:  # a name no shipped architecture has (a run of an older patchword): as it says
        named = mc.matcher
    if named == mc.matcher:
        return f"`{mc.matcher}` (`{mc.name}`)"
    return f"`{mc.matcher}` matcher on the `{mc.name}` encoders"


def _tokens_line(mc, encoder) -> str:
    """How many image tokens the encoder gives: a region encoder's regions, a ViT's patches."""
    what = "regions (precomputed region features)" if mc.image_encoder == "precomp" else "patches"
    return f"* {what}: {encoder.num_patches}, CLS token: {encoder.has_cls}"


def model_card(run, record: dict[str, Any]) -> str:
    """The ``README.md`` of an exported model: what it is, where its weights came from, how it was trained,
    what it scored and how. ``record``: the export's ``metrics.json`` (:func:`~patchword.runs.export.
    export_run`)."""
    cfg, model = run.config, run.model
    mc, dc, tc = cfg.model, cfg.data, cfg.train
    metrics = record.get("metrics") or {}
    imported = _read_json(run.run_dir / IMPORT_FILE)
    backbones = _read_json(run.run_dir / BACKBONES_FILE)
    # the export counted it, training's record first (export._warm_start; None for an imported run)
    warm = record.get("warm_start")
    kinds = encoder_kinds(mc, backbones)
    origins = encoder_origins(mc, imported, backbones, warm)
    # as the run's evaluation records it: region features bring no dense text, whatever data.dense says
    reads_dense = reads_dense_text(dc, model.matcher.consumes_dense)
    dense = (
        f"yes, tied to the {model.matcher.dense_pairing}: its scores need one dense caption per "
        f"{model.matcher.dense_pairing} (`dense_ids` / `dense_lens`; without them the model scores otherwise)"
        if reads_dense
        else "no"
    )
    lines = [
        f"# {run.run_dir.name}",
        "",
        f"A patchword model: {_what(mc)}: image encoder {kinds['image']}, text encoder {kinds['text']}, "
        f"{mc.embed_dim}-d joint space.",
        "",
        "```python",
        "from patchword.runs import load_run",
        "run = load_run('.')          # model, tokenizer, image preprocessing; no download",
        "```",
        "",
        "## Model",
        "",
        # the reported options as the matcher used them (a default as its value)
        f"* matcher: `{mc.matcher}`"
        + "".join(f", {key} `{value}`" for key, value in reported_options(mc, model.matcher).items()),
        f"* image encoder: {kinds['image']}; {origins['image']}",
        f"* text encoder: {kinds['text']}; {origins['text']}",
        _tokens_line(mc, model.image_encoder),
        f"* dense text: {dense}",
        "",
        "## Training",
        "",
    ]
    if imported:
        lines += [
            f"Imported from an official {imported.get('family')} checkpoint: `{imported.get('source')}` "
            f"(sha256 `{str(imported.get('source_sha256', ''))[:16]}`), {imported.get('loaded')} tensors "
            f"loaded, {len(imported.get('ignored', {}))} ignored"
            + (f", {len(imported['derived'])} built from its options" if imported.get("derived") else "")
            + " (listed in `import.json`).",
        ]
    else:
        data = dc.dataset + (
            f" ({dc.synthetic_scenes} scenes, {dc.num_train} training images)"
            if dc.dataset == "synthetic"
            else f" ({dc.root})"
            if dc.root
            else ""
        )
        lines += [f"* data: {data}", _steps_line(record)]
        lines += [line for line in [warm_start_line(warm)] if line]
        lines.append(
            f"* batch {tc.batch_size}, lr {tc.lr}, loss {tc.loss}, precision {cfg.precision}, seed {cfg.seed}"
        )
    lines += ["", "## Evaluation", ""]
    keys = list(CARD_KEYS)
    if all(k in metrics for k in keys):
        lines += [
            "| split | images | captions | " + " | ".join(keys) + " |",
            "|" + "---|" * (len(keys) + 3),
            f"| {_split_read(metrics, dc)} | {metrics.get('images', '')} | "
            f"{metrics.get('captions', '')} | " + " | ".join(f"{metrics[k]:.1f}" for k in keys) + " |",
            "",
            f"Protocol: {_protocol(metrics, detail=True)}; {_evaluated_where(record)}",
        ]
        lines += _two_stage_note(metrics)
        lines += _split_warning(metrics, dc)
    else:
        lines.append(
            f"No evaluation of checkpoint `{record['checkpoint']}` with this config is recorded with the "
            f"run: `patchword eval RUN --checkpoint {record['checkpoint']}` measures it (then export again)."
        )
    lines += _published_section(imported, metrics, record, dc, cfg.eval.coco_1k)
    lines += [
        "",
        _hash_line(record) + f", weights sha256 `{record[WEIGHTS_DIGEST_KEY][:16]}` (`model.safetensors`), "
        f"patchword {record['patchword_version']}.",
        "",
    ]
    return "\n".join(lines)


def _protocol(metrics: Mapping[str, Any], detail: bool = False) -> str:
    """The evaluation's protocol as ``patchword report`` labels its row: ``leak-free`` or ``LEAKY``
    (``detail``: with why), then a two-stage search's shortlists and weight
    (:func:`~patchword.eval.metrics.two_stage_of`): ``leak-free, two-stage (shortlist 40/8, α 1.0)``."""
    leaky = "LEAKY (a query carries dense text of its own image)" if detail else "LEAKY"
    protocol = leaky if metrics.get("leaky") else "leak-free"
    search = two_stage_of(metrics)
    return protocol if search is None else f"{protocol}, {search}"


def _two_stage_note(metrics: Mapping[str, Any]) -> list[str]:
    """What a two-stage evaluation's recalls are (as the report's TWO-STAGE note says): a shortlist
    search's, where a ground truth left out of the shortlist is a miss; with the % of queries it missed."""
    if two_stage_of(metrics) is None:
        return []
    missed = [
        f"{metrics[key]:.1f}% of the {what} queries"
        for key, what in (("shortlist_miss_i2t", "image"), ("shortlist_miss_t2i", "caption"))
        if isinstance(metrics.get(key), (int, float))
    ]
    return [
        "",
        f"**Two-stage:** {TWO_STAGE_RECALLS}"
        + (f"; the shortlist missed it for {' and '.join(missed)}." if missed else "."),
    ]


def _evaluated_where(record: Mapping[str, Any]) -> str:
    """Which recorded evaluation the table shows: one of the run's own, or (an export of an exported
    directory) the one recorded by the export it was made from, for the same weights."""
    carried = record.get("metrics_origin")
    if not isinstance(carried, Mapping):
        return (
            f"checkpoint `{record['checkpoint']}` of the run, evaluated in `{record.get('metrics_source')}`."
        )
    return (
        f"the evaluation recorded by the export it was made from (`{record.get('metrics_source')}` of "
        f"`{record.get('source_run')}`, whose `model.safetensors` held these weights: same sha256), made "
        f"in `{carried.get('file')}` of run `{carried.get('run')}`."
    )


def _split_read(metrics: dict[str, Any], data: Any) -> str:
    """The split of the dataset the evaluation read (its recorded role through the run's data config:
    ``data.test_split=dev`` scores the dev split), not the role it was scored in."""
    return published_table.scored_split(metrics, data) or str(metrics.get("split", "test"))


def _split_warning(metrics: dict[str, Any], data: Any) -> list[str]:
    """A sentence for an evaluation of a split that is not held out: the one the checkpoint was chosen on,
    or one the model trained on."""
    use = published_table.split_use(metrics, data)
    if use == published_table.SELECTION_SPLIT:
        return [
            "",
            f"**Not a test result:** split `{_split_read(metrics, data)}` is the one training chose its "
            "checkpoint on (model selection); these figures are a validation score, not held-out test "
            "performance.",
        ]
    if use == published_table.TRAINING_SPLIT:
        return [
            "",
            f"**Not a test result:** split `{_split_read(metrics, data)}` is the one the model trained on.",
        ]
    return []


def _steps_line(record: dict[str, Any]) -> str:
    """The exported checkpoint's training step, and the run's, each labelled as what it is; for an export
    of an exported directory, the run and checkpoint its weights were exported from."""
    step, total = record.get("checkpoint_step"), record.get("run_steps")
    origin = record.get("origin")
    line = f"* checkpoint `{record['checkpoint']}`"
    if isinstance(origin, Mapping):
        line += (
            f" (exported by `{record.get('source_run')}` from `{origin.get('checkpoint')}` of run "
            f"`{origin.get('run')}`)"
        )
    line += f": saved at training step {'n/a' if step is None else step}"
    return line + (f" (the run trained {total} steps)" if total is not None else "")


def _hash_line(record: dict[str, Any]) -> str:
    """The hash of this directory's ``config.yaml``, and the source run's where it differs (a BERT run's
    export points its vocabulary at the copy), and the config an evaluation carried over from an earlier
    export was made with, where that differs too."""
    line = f"config hash `{record['config_hash']}` (this directory's `config.yaml`"
    source = record.get("source_config_hash")
    if source and source != record["config_hash"]:
        line += f"; the source run's, which its evaluations name: `{source}`"
    carried = record.get("metrics_origin")
    made = carried.get("config_hash") if isinstance(carried, Mapping) else None
    if made and made not in (source, record["config_hash"]):
        line += f"; the one the evaluation above was made with, in run `{carried.get('run')}`: `{made}`"
    return line + ")"


_COLUMNS = ("i2t R@1", "i2t R@5", "i2t R@10", "t2i R@1", "t2i R@5", "t2i R@10", "rSum")


def _cell(value: float | None, signed: bool = False) -> str:
    """A number of the comparison table, one decimal as published; a dash where there is none."""
    return "—" if value is None else f"{value:+.1f}" if signed else f"{value:.1f}"


def _no_row(model: published_table.ImportedModel, backbone: str, datasets: str) -> str:
    """The sentence for an imported checkpoint without a published row: what patchword looked up, with
    only what it knows (an unknown backbone or dataset, or an opt that named neither, is said in words)."""
    if not published_table.published_results(model.family):
        return (
            f"patchword's table of published results holds no result of the official `{model.family}` code, "
            "so nothing published is shown beside the numbers measured here."
        )
    wanted = [f"the official `{model.family}` code"]
    wanted.append(
        f"with backbone {backbone}"
        if model.backbone
        else "with the backbone of this checkpoint (its opt names none patchword can match)"
    )
    wanted.append(
        f"on {datasets}" if model.datasets else "on its dataset (its opt names none patchword knows)"
    )
    basis = f" (read from `import.json`: {model.basis})" if model.basis else ""
    return f"patchword's table of published results has no row for {' '.join(wanted)}{basis}."


def _published_section(
    imported: dict[str, Any],
    metrics: dict[str, Any],
    record: dict[str, Any],
    data: Any = None,
    coco_1k: bool = False,
) -> list[str]:
    """The card's "Published vs measured here" for an imported official checkpoint: each published
    result of its method, backbone and dataset (:func:`patchword.imports.published.published_results`)
    beside the run's recorded evaluation of the exported checkpoint (``metrics``), with source, protocol
    and notes. ``data``: the run's data config (the split and data the evaluation read, for the caveats);
    ``coco_1k``: the run's ``eval.coco_1k`` (whether a COCO 1K row could have been measured)."""
    model = published_table.imported_model(imported)
    if model is None:
        return []
    datasets = " and ".join(published_table.DATASETS[d] for d in model.datasets)
    lines = ["", "## Published vs measured here", ""]
    rows = model.published()
    # SCAN: the rows are those of the checkpoint's variant (t-i LSE...), which the sentence names
    backbone = f"`{model.backbone}`" + (f" (variant {model.variant})" if model.variant else "")
    if not rows:
        return lines + [_no_row(model, backbone, datasets)]
    lines += [
        f"The results published for the official `{model.family}` code with backbone {backbone} on "
        f"{datasets} (read from `import.json`: {model.basis}), as printed by their sources (nothing "
        "corrected; `patchword.imports.published`), beside this run's evaluation of checkpoint "
        f"`{record['checkpoint']}`. difference = measured here - published.",
        "",
    ]
    if metrics:
        lines.append(
            f"Measured here: `{record.get('metrics_source')}`, split {_split_read(metrics, data)}, "
            f"{metrics.get('images', '?')} images, " + f"{_protocol(metrics)} protocol."
        )
    else:
        lines.append(
            f"Not measured here yet: no evaluation of checkpoint `{record['checkpoint']}` is recorded with "
            "the run (`patchword eval RUN` measures it; then export again)."
        )
    for published in rows:
        lines += _published_table(published, metrics, data, model, coco_1k)
    return lines


def _published_table(published, metrics: dict[str, Any], data: Any, model, coco_1k: bool) -> list[str]:
    """One published row beside the measured figures (or why there are none, as ``patchword report``
    says it), their difference, its source, protocol, note and the caveats of the comparison."""
    measured = published_table.measured_metrics(metrics, published.dataset)
    unmeasured = published_table.not_measured(metrics, measured, published.dataset, coco_1k)
    compared = published_table.compare_rows(published, measured)
    title = published_table.DATASETS[published.dataset] + (
        f", {published.variant}" if published.variant else ""
    )
    lines = [
        "",
        f"**{title}**",
        "",
        "| | " + " | ".join(_COLUMNS) + " |",
        "|---" * (len(_COLUMNS) + 1) + "|",
    ]
    for row in compared:
        name = row["row"]
        if name != "published" and unmeasured:
            if name == "measured here":
                lines.append(f"| measured here | {unmeasured} |" + " |" * (len(_COLUMNS) - 1))
            continue
        values = [_cell(row[key], signed=name == "difference") for key in published_table.METRIC_KEYS]
        lines.append(f"| {name} | " + " | ".join(values) + " |")
    lines += ["", f"* source: {published.source}", f"* protocol: {published.protocol}"]
    if published.note:
        lines.append(f"* note: {published.note}")
    if measured:
        lines += [f"* caveat: {text}" for text in published_table.caveats(published, metrics, data, model)]
    return lines
