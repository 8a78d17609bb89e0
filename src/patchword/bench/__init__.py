"""Benchmarks of exhaustive scoring and two-stage search: ``patchword bench scoring | two-stage | gallery |
all``.

An application on top of the library (nothing in the library imports it), split by job:

* :mod:`~patchword.bench.machine` - machine description, fp32 matmul peak, best-of timing;
* :mod:`~patchword.bench.flops` - matrix-product FLOPs of a call (torch profiler);
* :mod:`~patchword.bench.memory` - peak RSS growth of one scoring call in a fresh process;
* :mod:`~patchword.bench.inputs` - the scored matchers and their ViT-224 inputs with real caption lengths;
* :mod:`~patchword.bench.scoring` - ``score_matrix`` against the official per-caption loop
  (:func:`patchword.testing.seps_reference_scores`, the same reference the tests use);
* :mod:`~patchword.bench.two_stage` - shortlist + re-ranking against exhaustive scoring on a trained run;
* :mod:`~patchword.bench.gallery` - exhaustive scoring at gallery shapes (1K x 5K to 100K x 500K) into a
  memory-mapped matrix, in bounded memory, extrapolated past a time budget;
* :mod:`~patchword.bench.formatting` - the markdown tables;

The command line is :mod:`patchword.cli.bench` (``patchword bench``, ``python -m patchword.bench``).
"""

from patchword.bench.flops import count_flops
from patchword.bench.formatting import format_duration, format_scoring, format_two_stage
from patchword.bench.gallery import format_gallery, run_gallery
from patchword.bench.machine import machine_description, matmul_peak_gflops
from patchword.bench.scoring import run_scoring
from patchword.bench.two_stage import run_two_stage

__all__ = [
    "count_flops",
    "format_duration",
    "format_gallery",
    "format_scoring",
    "format_two_stage",
    "machine_description",
    "matmul_peak_gflops",
    "run_gallery",
    "run_scoring",
    "run_two_stage",
]
