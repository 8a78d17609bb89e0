"""Exhaustive-scoring benchmark: the engine against the official per-caption loop on the same inputs.

For each config of :data:`~patchword.bench.inputs.SCORING_CONFIGS` (SEPS code / paper, caption- and
image-tied dense text, LAPS) at ViT-224 shapes with real caption lengths it measures, in one process:
pairs/s of :func:`~patchword.eval.score_matrix` and of the reference loop
(:func:`patchword.testing.seps_reference_scores`, written like the official code), the largest score
difference between them, the matrix-product FLOPs per pair of each (torch profiler) and the GFLOP/s they
reach against the machine's measured fp32 matmul peak, the engine's peak tensor memory and block plan,
optionally the peak RSS growth in a fresh process, and the Flickr30K / COCO evaluation times extrapolated
from the throughput. Timings are the best of interleaved repeats (see :mod:`patchword.bench.machine`).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import torch

from patchword._validation import check_finite_number
from patchword.bench.flops import count_flops
from patchword.bench.inputs import (
    COCO_CAPTIONS,
    COCO_IMAGES,
    DEFAULT_BERT_VOCAB,
    F30K_CAPTIONS,
    F30K_IMAGES,
    SCORING_CONFIGS,
    VIT_DIM,
    VIT_PATCHES,
    benchmark_lengths,
    build_bench_matcher,
    check_bert_vocab,
    refuse_vocab_without_data,
    scoring_inputs,
)
from patchword.bench.machine import best_time, load_average, machine_description, matmul_peak_gflops
from patchword.bench.memory import ScoringCall, measure_rss_in_subprocess
from patchword.errors import ConfigError
from patchword.testing import seps_reference_scores

__all__ = ["ScoringPlan", "check_scoring_plan", "plan_scoring", "run_scoring"]

_logger = logging.getLogger(__name__)

#: Images whose pairs the FLOP count covers: FLOPs per pair do not depend on how many images are scored.
_FLOP_COUNT_IMAGES = 32


def check_scoring_plan(
    *,
    images: int,
    caption_images: int,
    ref_captions: int,
    configs: list[str],
    max_memory_mb: float,
    length_images: int = F30K_IMAGES,
    captions_per_image: int = F30K_CAPTIONS // F30K_IMAGES,
    names: dict[str, str] | None = None,
) -> int:
    """Check a scoring benchmark's sizes before any work; the number of captions the engine scores.

    The inputs take their token counts from the lengths of ``length_images`` images and their
    ``captions_per_image`` captions each (the Flickr30K 1K test: 1000 and 5): more images than that with
    dense text, or captions of more images, have no lengths (``dense_lens must have shape (1001,)`` deep in
    the first config), and the reference cannot score more captions than there are (the spread of
    ``ref_captions`` over them would score one caption several times while reporting each).

    Args:
        names: what the errors call each argument (the command line passes its flags: ``--images``...);
            default the argument names.

    Raises:
        ConfigError: naming the argument, its limit and why.
    """
    names = _argument_names(names)
    unknown = [name for name in configs if name not in SCORING_CONFIGS]
    if not configs or unknown:
        what = f"unknown scoring config(s) {unknown}" if unknown else "no scoring config given"
        raise ConfigError(names["configs"], f"{what}; choose from {', '.join(SCORING_CONFIGS)}")
    twice = next((name for n, name in enumerate(configs) if name in configs[:n]), None)
    if twice is not None:  # it was scored twice and reported once
        raise ConfigError(names["configs"], f"{twice} is given twice: each config is scored once")
    check_finite_number(names["max_memory_mb"], max_memory_mb, inclusive=False)
    for key, value in (
        ("images", images),
        ("caption_images", caption_images),
        ("ref_captions", ref_captions),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(names[key], f"must be an integer >= 1, got {value!r}")
    dense = [name for name in configs if SCORING_CONFIGS[name]["dense"]]
    if dense and images > length_images:
        raise ConfigError(
            names["images"],
            f"at most {length_images} with dense text ({', '.join(dense)}): the lengths of the dense "
            f"captions of {length_images} images are known, got {images}",
        )
    captioned = min(images, caption_images)
    if captioned > length_images:
        raise ConfigError(
            names["caption_images"],
            f"at most {length_images}: the caption lengths of {length_images} images are known, got "
            f"{caption_images}",
        )
    captions = captions_per_image * captioned
    if ref_captions > captions:
        raise ConfigError(
            names["ref_captions"],
            f"at most {captions}, the captions scored ({captions_per_image} each of {captioned} image(s): "
            f"{names['caption_images']} {caption_images}, {names['images']} {images}), got {ref_captions}",
        )
    return captions


def _argument_names(names: dict[str, str] | None) -> dict[str, str]:
    """What the errors call each argument of the plan: ``names`` over the argument names."""
    keys = ("images", "caption_images", "ref_captions", "configs", "max_memory_mb", "bert_vocab")
    keys += ("stand_in_lengths",)  # named in the refusal of a vocabulary with stand-in lengths
    return {key: key for key in keys} | (names or {})


@dataclass(frozen=True)
class ScoringPlan:
    """A scoring benchmark's sizes, configs and budget, checked against the token lengths its inputs take,
    and those lengths (:func:`plan_scoring`): what :func:`run_scoring` measures.

    Attributes:
        cap_lens, dense_lens, lengths_source: :func:`~patchword.bench.inputs.benchmark_lengths`.
        data, stand_in_lengths, bert_vocab: where the lengths came from (the RSS probe reads them again in
            its process); ``bert_vocab`` None: dense lengths from word counts.
    """

    images: int
    caption_images: int
    ref_captions: int
    configs: list[str]
    max_memory_mb: float
    cap_lens: torch.Tensor
    dense_lens: torch.Tensor
    lengths_source: str
    data: str | None
    stand_in_lengths: bool
    bert_vocab: str | None = None


def plan_scoring(
    *,
    images: int = 256,
    caption_images: int = 48,
    ref_captions: int = 10,
    configs: list[str] | None = None,
    max_memory_mb: float = 1024,
    data: str | None = None,
    bert_vocab: str | None = DEFAULT_BERT_VOCAB,
    vocab_must_load: bool = False,
    stand_in_lengths: bool = False,
    names: dict[str, str] | None = None,
) -> ScoringPlan:
    """Check a scoring benchmark's arguments and read the token lengths of its inputs, before any work.

    The sizes are checked (:func:`check_scoring_plan`) before anything is read, against the lengths of the
    Flickr30K 1K test (the stand-in's and the shared data folder's); a data folder of another size is checked
    again against its own once its lengths are read.

    Args:
        bert_vocab: BERT vocabulary for dense-caption lengths (offline only), or None for word counts.
        vocab_must_load: ``bert_vocab`` was named by the user: it must load (loaded once, here), where the
            default falls back to word counts.
        names: what the errors call each argument (the command line passes its flags: ``--images``...);
            default the argument names.
        Others: as :func:`run_scoring` (``configs`` None: all; an empty list is refused).

    Raises:
        ConfigError: a size, config, budget or vocabulary that cannot work, naming the argument.
        MissingFileError: ``data`` is not the shared data folder.
    """
    configs = list(SCORING_CONFIGS) if configs is None else configs
    names = _argument_names(names)
    sizes = {
        "images": images,
        "caption_images": caption_images,
        "ref_captions": ref_captions,
        "configs": configs,
        "max_memory_mb": max_memory_mb,
    }
    check_scoring_plan(**sizes, names=names)
    tokenizer = None
    if vocab_must_load and bert_vocab:  # it loads, and has dense captions to count (stand-in lengths: none)
        tokenizer = check_bert_vocab(bert_vocab, key=names["bert_vocab"])
        refuse_vocab_without_data(data, stand_in_lengths, names["bert_vocab"], names["stand_in_lengths"])
    cap_lens, dense_lens, source = benchmark_lengths(
        data, bert_vocab, stand_in=stand_in_lengths, tokenizer=tokenizer
    )
    length_images, captions_per_image = dense_lens.numel(), cap_lens.numel() // dense_lens.numel()
    if (length_images, captions_per_image) != (F30K_IMAGES, F30K_CAPTIONS // F30K_IMAGES):
        # a data folder of another size than the Flickr30K test's: its own limits
        check_scoring_plan(
            **sizes, length_images=length_images, captions_per_image=captions_per_image, names=names
        )
    return ScoringPlan(
        **sizes,
        cap_lens=cap_lens,
        dense_lens=dense_lens,
        lengths_source=source,
        data=data,
        stand_in_lengths=stand_in_lengths,
        bert_vocab=bert_vocab,
    )


def run_scoring(
    *,
    images: int = 256,
    caption_images: int = 48,
    ref_captions: int = 10,
    repeats: int = 3,
    configs: list[str] | None = None,
    max_memory_mb: float = 1024,
    data: str | None = None,
    bert_vocab: str | None = DEFAULT_BERT_VOCAB,
    stand_in_lengths: bool = False,
    rss: bool = True,
    peak_size: int = 2048,
    progress: bool = False,
    plan: ScoringPlan | None = None,
) -> dict[str, Any]:
    """Measure every scoring config (see the module docstring).

    Args:
        images: images of the timed block; the reference loops over captions against all of them, as
            the official evaluation does with its 256-image shards.
        caption_images: the engine scores the captions of this many images.
        ref_captions: captions the (slow) reference loop scores, spread over the caption lengths.
        repeats: interleaved timing repeats; the best is kept.
        configs: names of :data:`SCORING_CONFIGS` (default all).
        max_memory_mb: the engine's working-memory budget.
        data: the shared data folder (default: found next to the repository, else stand-in lengths).
        bert_vocab: BERT vocabulary for dense-caption lengths (offline only), or None for word counts.
        stand_in_lengths: use the seeded stand-in lengths without looking for data.
        rss: also measure the first config's peak RSS growth in a fresh process.
        peak_size: matrix side of the fp32 matmul peak measurement.
        progress: progress bars of the engine.
        plan: the arguments already checked and the lengths already read (:func:`plan_scoring`, as the
            command line does before any benchmark runs); then ``images`` to ``stand_in_lengths`` are
            not read.

    Returns:
        A JSON-able dict: ``machine``, ``lengths``, ``setup``, ``peak_gflops`` (and ``peak_gflops_end``,
        measured again at the end), and ``configs`` (name -> the measurements of that config; its
        ``f30k_*_s`` and ``coco5k_engine_s`` are the gallery's pairs times the time per pair, extrapolated
        from the pairs timed, ``extrapolated_from_pairs``).

    Raises:
        ConfigError: a size, config or budget :func:`check_scoring_plan` refuses, before any work.
    """
    from patchword.eval import score_matrix
    from patchword.eval.engine import SEPSEngine, TensorMemoryMeter

    if plan is None:
        plan = plan_scoring(
            images=images,
            caption_images=caption_images,
            ref_captions=ref_captions,
            configs=configs or list(SCORING_CONFIGS),
            max_memory_mb=max_memory_mb,
            data=data,
            bert_vocab=bert_vocab,
            stand_in_lengths=stand_in_lengths,
        )
    images, caption_images, ref_captions = plan.images, plan.caption_images, plan.ref_captions
    configs, max_memory_mb = plan.configs, plan.max_memory_mb
    cap_lens, dense_lens, source = plan.cap_lens, plan.dense_lens, plan.lengths_source
    img, caps, lens, dense, dlens, t2i = scoring_inputs(
        images, cap_lens, dense_lens, caption_images=caption_images
    )
    result: dict[str, Any] = {
        "machine": machine_description(),
        "lengths": {
            "source": source,
            "caption_mean": cap_lens.float().mean().item(),
            "caption_median": cap_lens.median().item(),
            "dense_mean": dense_lens.float().mean().item(),
            "dense_median": dense_lens.median().item(),
        },
        "setup": {
            "images": images,
            "captions": caps.shape[0],
            "ref_captions": ref_captions,
            "repeats": repeats,
            "max_memory_mb": max_memory_mb,
            "dim": VIT_DIM,
            "patches": VIT_PATCHES,
        },
        "peak_gflops": matmul_peak_gflops(peak_size),
        "configs": {},
    }
    n_pairs = img.shape[0] * caps.shape[0]
    count_rows = slice(min(images, _FLOP_COUNT_IMAGES))
    n_count = count_rows.stop
    ref_cols = torch.arange(ref_captions) * (caps.shape[0] // ref_captions)  # spread over lengths
    for name in configs:
        spec = SCORING_CONFIGS[name]
        matcher = build_bench_matcher(name)
        caption_tied = spec["dense_pairing"] == "caption"
        engine = SEPSEngine(matcher)

        def dense_of(rows: slice, spec=spec, caption_tied=caption_tied):
            # Image-tied dense text follows the scored images; caption-tied rows are indexed by txt2img.
            if not spec["dense"]:
                return None, None
            return (dense, dlens) if caption_tied else (dense[rows], dlens[rows])

        def run_engine(rows: slice = slice(None), matcher=matcher, caption_tied=caption_tied, engine=engine):
            return score_matrix(
                matcher,
                img[rows],
                caps,
                lens,
                *dense_of(rows),
                txt2img=t2i if caption_tied else None,
                max_memory_mb=max_memory_mb,
                engine=engine,
                progress=progress,
            )

        def run_reference(rows: slice = slice(None), matcher=matcher, spec=spec, caption_tied=caption_tied):
            index = t2i[ref_cols] if caption_tied and spec["dense"] else None
            return seps_reference_scores(
                matcher, img[rows], caps[ref_cols], lens[ref_cols], *dense_of(rows), dense_index=index
            )

        sims, ref = run_engine(), run_reference()  # warm-up, and the exactness check of this input
        engine_s = ref_s = math.inf
        for _ in range(repeats):  # interleaved: both see the same machine state
            engine_s = min(engine_s, best_time(run_engine, 1))
            ref_s = min(ref_s, best_time(run_reference, 1))
        # of the full block (the FLOP count below scores fewer images); not ``plan``, the benchmark's plan,
        # which the RSS probe below still reads
        block_plan = engine.last_plan
        # The meter and the FLOP count are dispatch modes and profilers of the calling thread: they run the
        # same engine with one thread of control (its CPU workers would hide every op from them).
        single = SEPSEngine(matcher, workers=1)
        with TensorMemoryMeter() as meter:
            run_engine(engine=single)
        engine_flops = count_flops(lambda run=run_engine, single=single: run(count_rows, engine=single)) / (
            n_count * caps.shape[0]
        )
        ref_flops = count_flops(lambda run=run_reference: run(count_rows)) / (n_count * ref_cols.numel())
        engine_pair_s, ref_pair_s = engine_s / n_pairs, ref_s / ref.numel()
        entry = {
            "max_abs_diff_vs_reference": (sims[:, ref_cols] - ref).abs().max().item(),
            "engine_us_per_pair": 1e6 * engine_pair_s,
            "reference_us_per_pair": 1e6 * ref_pair_s,
            "speedup": ref_pair_s / engine_pair_s,
            "engine_pairs_per_s": 1 / engine_pair_s,
            "engine_mflop_per_pair": engine_flops / 1e6,
            "reference_mflop_per_pair": ref_flops / 1e6,
            "engine_gflops": engine_flops / engine_pair_s / 1e9,
            "reference_gflops": ref_flops / ref_pair_s / 1e9,
            # metered on ``single`` (one worker, the whole budget): its plan, not the timed engine's
            "engine_peak_tensor_mb": meter.peak_bytes / (1 << 20),
            "peak_tensor_plan": {
                "image_block": single.last_plan.image_block,
                "text_block": single.last_plan.text_block,
                "dense_block": single.last_plan.dense_block,
            },
            "plan": {
                "image_block": block_plan.image_block,
                "text_block": block_plan.text_block,
                "dense_block": block_plan.dense_block,
                **block_plan.details,
            },
            # Extrapolated from the time per pair of the pairs timed (the table says so).
            "f30k_engine_s": F30K_IMAGES * F30K_CAPTIONS * engine_pair_s,
            "f30k_reference_s": F30K_IMAGES * F30K_CAPTIONS * ref_pair_s,
            "coco5k_engine_s": COCO_IMAGES * COCO_CAPTIONS * engine_pair_s,
            "extrapolated_from_pairs": {"engine": n_pairs, "reference": ref.numel()},
        }
        if rss and name == configs[0]:
            # the probe's torch threads: this run's (a fresh process has torch's default, all the cores)
            call = ScoringCall(
                name,
                images,
                caption_images,
                max_memory_mb,
                plan.data,
                plan.stand_in_lengths,
                plan.bert_vocab,
                threads=torch.get_num_threads(),
            )
            entry["engine_rss_growth_mb"] = measure_rss_in_subprocess(call)
        result["configs"][name] = entry
        _logger.info("%s: %s", name, {k: v for k, v in entry.items() if k != "plan"})
    result["peak_gflops_end"] = matmul_peak_gflops(peak_size)
    result["machine"]["load_average_end"] = load_average()
    return result
