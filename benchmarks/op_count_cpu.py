"""Aten op calls of ``score_matrix`` on the CPU, counted with a dispatch mode: the "before" of issue 34.

The engine at f715cbc cannot run on the simulated device (``benchmarks/device_counts.py``): it indexes host
tensors with device indices, which CUDA refuses. On a GPU it used the plan it uses on one CPU thread (blocks
of 1 image x ~147 captions, ``_WORKING_SET``), so its op calls are counted here on the CPU, with every aten
op that reaches the dispatcher counted once (views included, as the simulated device counts them), for the
first IMAGES images against every caption, extrapolated linearly to all images:

    git worktree add /tmp/before f715cbc
    cd /tmp/before && PYTHONPATH=src python /path/to/benchmarks/op_count_cpu.py f30k 4 seps-code-image f715cbc

Arguments: shape (f30k | coco5k), images scored, comma-separated configs, a label for the tree.
"""

import json
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from patchword.bench.inputs import SCORING_CONFIGS, build_bench_matcher, scoring_inputs, stand_in_lengths
from patchword.eval import score_matrix


class Count(TorchDispatchMode):
    n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        Count.n += 1
        return func(*args, **(kwargs or {}))


torch.set_num_threads(1)
cap_lens, dense_lens = stand_in_lengths()
shape = sys.argv[1]
images = int(sys.argv[2])
n_img, n_txt = {"f30k": (1000, 5000), "coco5k": (5000, 25000)}[shape]
reps = (n_img + 999) // 1000
for config in sys.argv[3].split(","):
    spec = SCORING_CONFIGS[config]
    img, caps, lens, dense, dlens, t2i = scoring_inputs(
        images, cap_lens.repeat(reps), dense_lens.repeat(reps), caption_images=images
    )
    # every caption, the first `images` images
    g = torch.Generator().manual_seed(0)
    lens = cap_lens.repeat(reps)[:n_txt]
    caps = torch.randn(n_txt, int(lens.max()), 512, generator=g)
    t2i = torch.arange(n_txt) // 5
    m = build_bench_matcher(config)
    ct = spec["dense_pairing"] == "caption"
    if ct:
        dl = dense_lens.repeat(reps)[:n_img]
        dense = torch.randn(n_img, int(dl.max()), 512, generator=g)
    else:
        dl = dlens
    args = (dense, dl) if spec["dense"] else (None, None)
    Count.n = 0
    with Count():
        score_matrix(
            m,
            img,
            caps,
            lens,
            *args,
            txt2img=t2i if ct and spec["dense"] else None,
            device="cpu",
            progress=False,
        )
    print(
        json.dumps(
            {
                "tree": sys.argv[4],
                "config": config,
                "shape": shape,
                "images": images,
                "ops": Count.n,
                "ops_extrapolated": Count.n * n_img // images,
            }
        ),
        flush=True,
    )
