"""Dense captions for SEPS: describe every image with a local vision-language model, resumably.

SEPS trains and evaluates with one MLLM description per image ("dense text"); the official code only reads
them from JSONL files. This package writes such files for any image list: a folder, a LAPS/SEPS or Karpathy
split or the synthetic scenes, with transformers' image-text-to-text models (LLaVA-1.5, LLaVA-NeXT,
Qwen2-VL, ...) or the in-process ``tiny-random`` smoke-test model. Output lines are appended and flushed
batch by batch, reruns continue where a run stopped, shards split the work across processes and
:func:`merge_shards` joins them.
``patchword densify`` is the command line (:mod:`patchword.cli.densify`); docs/densify.md the guide.

Modules, one job each:

- :mod:`.config`: the prompt and decoding settings, device and precision.
- :mod:`.sources`: the ordered image lists and their ids.
- :mod:`.vlm`: loading a model and its processor; batched generation.
- :mod:`.fingerprint`: which model wrote a file (its files' fingerprint, compared on resume and merge).
- :mod:`.tiny`: the ``tiny-random`` model.
- :mod:`.store`: the JSONL file and its sidecar (append, torn-line repair, atomic rewrite).
- :mod:`.resume`: what a rerun accepts (the sidecar check) and finds (the finished lines).
- :mod:`.runner`: the resumable generation loop.
- :mod:`.shards`: shard ranges, per-rank file names, merge.
- :mod:`.stats`: the quality report.
"""

from __future__ import annotations

from patchword.densify.config import DEFAULT_PROMPT, GenerationSettings, resolve_device, resolve_precision
from patchword.densify.resume import is_complete
from patchword.densify.runner import DensifyResult, densify
from patchword.densify.shards import Shard, merge_shards, parse_shard, shard_from_env, shard_output_path
from patchword.densify.sources import (
    ImageItem,
    ImageList,
    images_from_folder,
    images_from_karpathy,
    images_from_laps,
    images_from_synthetic,
)
from patchword.densify.stats import dense_stats, format_stats, read_texts, scene_coverage
from patchword.densify.store import DenseRecord, read_records
from patchword.densify.vlm import TINY_RANDOM, Generation, VisionLanguageModel, load_vlm

__all__ = [
    "DEFAULT_PROMPT",
    "TINY_RANDOM",
    "DenseRecord",
    "DensifyResult",
    "Generation",
    "GenerationSettings",
    "ImageItem",
    "ImageList",
    "Shard",
    "VisionLanguageModel",
    "dense_stats",
    "densify",
    "format_stats",
    "images_from_folder",
    "images_from_karpathy",
    "images_from_laps",
    "images_from_synthetic",
    "is_complete",
    "load_vlm",
    "merge_shards",
    "parse_shard",
    "read_records",
    "read_texts",
    "resolve_device",
    "resolve_precision",
    "scene_coverage",
    "shard_from_env",
    "shard_output_path",
]
