"""Golden scores of the real official ``CrossSparseAggrNet_v2`` (LAPS and SEPS ``lib/cross_net.py``) on tiny
seeded inputs, saved as ``tests/data/official_seps_golden.pt`` for
``tests/matching/test_seps_independent.py``.

The official code is imported from the given exports at run time; none of it is copied into the project.
Export the ``lib/`` directories of the two official repositories, then run:

    git --git-dir=/work/.mirror/CrossmodalGroup+LAPS/repo archive \\
        355a43babb70a3fdfbe74aabebad9a8414b91b3b lib | tar -x -C /tmp/laps
    git --git-dir=/work/.mirror/maxingan2412+seps/repo archive \\
        7f4dfa68856c014337b38345835aee199fe49f72 lib | tar -x -C /tmp/seps
    .venv/bin/python benchmarks/official_seps_golden.py --laps /tmp/laps --seps /tmp/seps

(``mkdir -p /tmp/laps /tmp/seps`` first; the git directories are what the ``fetch`` tool returns for
``github:CrossmodalGroup/LAPS`` and ``github:maxingan2412/seps``. ``git archive`` may report missing data
blobs of those mirrors, e.g. ``data/coco/id_mapping.json``; ``lib/`` is complete.)

Commits used for the committed fixture:

* LAPS: ``CrossmodalGroup/LAPS`` at ``355a43babb70a3fdfbe74aabebad9a8414b91b3b`` (HEAD, 2025-06-26; its
  ``lib/`` is unchanged since 2024-04).
* SEPS: the official repository ``github.com/Sweet4tars/seps`` has no snapshot available here (``fetch``
  refuses it). The fork ``maxingan2412/seps`` carries its history unchanged up to
  ``7f4dfa68856c014337b38345835aee199fe49f72`` (2025-11-04, author ``Sweet_Stars``), which
  reference/seps_laps.md treats as the official SEPS code; the fork's later commits only add comments.

The fixture also records the git blob ids of the ``lib/cross_net.py`` and ``lib/xttn.py`` that were run, so
``git ls-tree <commit> lib/`` in either repository confirms the exact files.

Cases: {LAPS, SEPS} x {``vit``: 1 + 16 tokens (CLS by the official ``is_sqr`` rule), README ratios
0.5 / 0.4; ``swin``: 16 tokens, 0.8 / 0.6; ``vit_odd``: 1 + 16 tokens, 0.52 / 0.45, where
``ceil(N rho) = 9`` differs from its floor and rounding and ``int(N aggr rho) = 3`` from its rounding}.
3 images x 4 captions, 32-d, every aggregation parameter moved off its initialisation. SEPS gets, per
caption, the dense caption of its ground-truth image (``txt2img``), as the official evaluation does. Each
case runs in eval mode in float64 (``scores``) and float32 (``scores_fp32``). No package outside torch is
needed: the two files import only torch, math and ``lib.xttn``, so nothing is stubbed.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

COMMITS = {
    "laps": ("CrossmodalGroup/LAPS", "355a43babb70a3fdfbe74aabebad9a8414b91b3b"),
    "seps": (
        "maxingan2412/seps (official history of Sweet4tars/seps)",
        "7f4dfa68856c014337b38345835aee199fe49f72",
    ),
}
SHAPES = {  # tokens per image, sparse_ratio, aggr_ratio
    "vit": (17, 0.5, 0.4),
    "swin": (16, 0.8, 0.6),
    "vit_odd": (17, 0.52, 0.45),
}
NUM_PATCHES, DIM, N_IMG = 16, 32, 3
CAP_LENS = [10, 7, 4, 8]
DENSE_LENS = [24, 13, 19]
TXT2IMG = [2, 0, 1, 0]


def _blob_id(path: Path) -> str:
    """The git blob id of a file (what ``git ls-tree`` lists)."""
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def load_official(root: Path):
    """``lib.cross_net`` of the export ``root`` (the folder holding ``lib/``, or ``lib/`` itself)."""
    root = root.resolve()
    if root.name == "lib":
        root = root.parent
    if not (root / "lib" / "cross_net.py").is_file():
        raise SystemExit(f"{root} holds no lib/cross_net.py")
    for name in [n for n in sys.modules if n == "lib" or n.startswith("lib.")]:
        del sys.modules[name]  # LAPS and SEPS both call their package "lib"
    sys.path.insert(0, str(root))
    try:
        module = importlib.import_module("lib.cross_net")
    finally:
        sys.path.remove(str(root))
    files = {f"lib/{n}": _blob_id(root / "lib" / n) for n in ("cross_net.py", "xttn.py")}
    return module, files


def inputs(seed: int = 0) -> dict:
    """Seeded float64 inputs; padded positions hold noise too (the official loop slices them away)."""
    g = torch.Generator().manual_seed(seed)
    out = {
        "img_vit": torch.randn(N_IMG, 1 + NUM_PATCHES, DIM, generator=g, dtype=torch.float64),
        "img_swin": torch.randn(N_IMG, NUM_PATCHES, DIM, generator=g, dtype=torch.float64),
        "caps": torch.randn(len(CAP_LENS), max(CAP_LENS), DIM, generator=g, dtype=torch.float64),
        "cap_lens": torch.tensor(CAP_LENS),
        "dense": torch.randn(N_IMG, max(DENSE_LENS), DIM, generator=g, dtype=torch.float64),
        "dense_lens": torch.tensor(DENSE_LENS),
        "txt2img": torch.tensor(TXT2IMG),
    }
    out["img_vit"][:, 0] *= 3.0  # a CLS token unlike the patches
    return out


def run_case(module, family: str, shape: str, data: dict, seed: int) -> dict:
    """Build the official net with a stand-in ``opt``, move its weights, score in eval mode."""
    tokens, sparse, aggr = SHAPES[shape]
    opt = SimpleNamespace(
        embed_size=DIM, num_patches=NUM_PATCHES, sparse_ratio=sparse, aggr_ratio=aggr,
        attention_weight=0.8, ratio_weight=2.0,
    )  # fmt: skip
    torch.manual_seed(seed)
    net = module.CrossSparseAggrNet_v2(opt)
    g = torch.Generator().manual_seed(seed + 1)
    moved = {k: v + 0.3 * torch.randn(v.shape, generator=g) for k, v in net.state_dict().items()}
    net.load_state_dict(moved)
    img = data["img_vit"] if tokens == 1 + NUM_PATCHES else data["img_swin"]
    args = [img, data["caps"], data["cap_lens"]]
    if family == "seps":
        rows = data["txt2img"]
        args += [data["dense"][rows], data["dense_lens"][rows]]
    scores = {}
    for name, dtype in (("scores", torch.float64), ("scores_fp32", torch.float32)):
        net = net.to(dtype).eval()
        with torch.no_grad():
            scores[name] = net(*[a.to(dtype) if a.is_floating_point() else a for a in args]).detach().clone()
    return {
        "family": family,
        "shape": shape,
        "opt": {"embed_size": DIM, "num_patches": NUM_PATCHES, "sparse_ratio": sparse, "aggr_ratio": aggr},
        "weights": {k: v.to(torch.float64).clone() for k, v in moved.items()},
        **scores,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--laps", type=Path, required=True, help="export of the official LAPS lib/")
    parser.add_argument("--seps", type=Path, help="export of the official SEPS lib/ (omit: LAPS cases only)")
    parser.add_argument("--laps-commit", default=COMMITS["laps"][1])
    parser.add_argument("--seps-commit", default=COMMITS["seps"][1])
    parser.add_argument("--out", type=Path, default=Path("tests/data/official_seps_golden.pt"))
    args = parser.parse_args(argv)
    data = inputs()
    fixture = {"official": {}, "inputs": data, "cases": {}}
    roots = {"laps": (args.laps, args.laps_commit), "seps": (args.seps, args.seps_commit)}
    for seed, (family, (root, commit)) in enumerate(roots.items()):
        if root is None:
            continue
        module, files = load_official(root)
        fixture["official"][family] = {"repo": COMMITS[family][0], "commit": commit, "files": files}
        for j, shape in enumerate(SHAPES):
            fixture["cases"][f"{family}_{shape}"] = run_case(module, family, shape, data, 10 * seed + j)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(fixture, args.out)
    size = args.out.stat().st_size
    print(f"wrote {args.out} ({size / 1024:.0f} KiB): {', '.join(fixture['cases'])}")
    for name, case in fixture["cases"].items():
        print(f"  {name}: scores {tuple(case['scores'].shape)}, mean {case['scores'].mean():.4f}")


if __name__ == "__main__":
    main()
