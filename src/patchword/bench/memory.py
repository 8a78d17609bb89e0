"""Peak resident memory of one exhaustive scoring call, measured in a fresh process.

The engine's own accounting (``TensorMemoryMeter``) sees tensor storage only; the resident set size
also sees allocator slack and kernel scratch buffers. It is measured in a fresh interpreter
(``python -m patchword.bench _rss ...``) so that nothing else this process allocated counts, with glibc
told to return big freed blocks to the OS (``MALLOC_MMAP_THRESHOLD_``) so that freed tensors leave RSS.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import resource
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from patchword.bench.inputs import benchmark_lengths, build_bench_matcher, scoring_inputs

__all__ = ["ScoringCall", "rss_growth_of_scoring", "measure_rss_in_subprocess", "run_probe"]

_logger = logging.getLogger(__name__)


def _status_kb(field: str) -> int:
    """A ``/proc/self/status`` memory field in KiB (VmRSS: now, VmHWM: peak since the last reset)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _reset_peak_rss() -> None:
    """Reset VmHWM to the current RSS (Linux: ``5`` written to /proc/self/clear_refs)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


@dataclass(frozen=True)
class ScoringCall:
    """One ``score_matrix`` call of benchmark config ``config`` (what the memory probe measures).

    Attributes:
        config: a name of :data:`~patchword.bench.inputs.SCORING_CONFIGS`.
        images: images scored; caption_images: the captions of this many of them.
        max_memory_mb: the engine's working-memory budget.
        data: the shared data folder (None: found or stand-in); stand_in_lengths: skip looking for it.
        bert_vocab: the vocabulary of the dense lengths (None: word counts), as in the timed run: the probe
            reads the lengths again, and dense text of other lengths is another call.
        threads: torch's intra-op threads, as in the timed run (0: torch's default): the engine's working
            set grows with its workers.
    """

    config: str
    images: int
    caption_images: int
    max_memory_mb: float
    data: str | None = None
    stand_in_lengths: bool = False
    bert_vocab: str | None = None
    threads: int = 0

    def probe_argv(self) -> list[str]:
        """Arguments of ``patchword bench _rss`` that repeat this call in a fresh process."""
        argv = ["_rss", "--config", self.config, "--images", str(self.images)]
        argv += ["--caption-images", str(self.caption_images), "--max-memory-mb", str(self.max_memory_mb)]
        argv += ["--data", self.data] if self.data else []
        argv += ["--bert-vocab", self.bert_vocab] if self.bert_vocab else []
        argv += ["--threads", str(self.threads)] if self.threads else []
        return argv + (["--stand-in-lengths"] if self.stand_in_lengths else [])


def rss_growth_of_scoring(call: ScoringCall) -> float:
    """Growth of this process's peak RSS (MiB) over ``call`` (after a small warm-up call: thread pools,
    kernels, lazy imports), with ``call.threads`` torch threads (the caller's count back afterwards).
    Meaningful in a fresh process."""
    from patchword.eval import score_matrix
    from patchword.train.process import torch_threads

    cap_lens, dense_lens, _ = benchmark_lengths(call.data, call.bert_vocab, stand_in=call.stand_in_lengths)
    matcher = build_bench_matcher(call.config)
    img, caps, lens, dense, dlens, t2i = scoring_inputs(
        call.images, cap_lens, dense_lens, caption_images=call.caption_images
    )
    out = torch.empty(img.shape[0], caps.shape[0])
    budget = call.max_memory_mb
    small = scoring_inputs(2, cap_lens, dense_lens)
    with torch_threads(call.threads):
        score_matrix(matcher, *small[:5], txt2img=small[5], max_memory_mb=budget)
        before = _status_kb("VmRSS")
        _reset_peak_rss()
        score_matrix(matcher, img, caps, lens, dense, dlens, txt2img=t2i, max_memory_mb=budget, out=out)
    return (_status_kb("VmHWM") - before) / 1024


def run_probe(args: Any) -> None:
    """``patchword bench _rss``: the call of ``args`` (what :meth:`ScoringCall.probe_argv` wrote, parsed: an
    attribute per field) measured, ``{"rss_growth_mb": ...}`` printed as one line of JSON."""
    call = ScoringCall(**{field.name: getattr(args, field.name) for field in dataclasses.fields(ScoringCall)})
    print(json.dumps({"rss_growth_mb": rss_growth_of_scoring(call)}))


def measure_rss_in_subprocess(call: ScoringCall) -> float | None:
    """:func:`rss_growth_of_scoring` in a fresh interpreter; None (logged) when the probe fails."""
    cmd = [sys.executable, "-m", "patchword.bench", *call.probe_argv()]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env, timeout=1800)
        return float(json.loads(done.stdout.strip().splitlines()[-1])["rss_growth_mb"])
    except (subprocess.SubprocessError, ValueError, KeyError, IndexError) as err:
        _logger.warning("RSS probe failed: %s", err)
        return None
