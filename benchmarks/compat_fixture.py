"""Make the backward-compatibility fixture: a tiny run directory and its export written by one patchword
version, with the scores that version gives, for ``tests/runs/test_compat.py`` to load with today's code.

Run it with the *old* version first on the path (a ``git worktree`` of the commit)::

    git worktree add /tmp/f715 f715cbc
    PYTHONPATH=/tmp/f715/src python benchmarks/compat_fixture.py tests/data/compat_f715cbc --commit f715cbc

It trains ``seps-tiny-32`` for 2 steps on 16 synthetic scenes, exports the run, evaluates it
(``patchword eval``), and scores 4 seeded images against 6 fixed captions (with dense text) through
``RetrievalModel.forward`` of the run and of the export. Only the files a run needs to load are kept (no
``last.pt``): the fixture is about 0.4 MB. The fixture in tests/data/compat_f715cbc was made this way from
f715cbc on the 2-core AMD EPYC (torch 2.13.0 CPU).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import torch

CAPTIONS = [
    "a red circle left of a blue square",
    "two green triangles",
    "a small yellow square above a red circle",
    "a blue triangle",
    "three circles",
    "a large green square right of a yellow triangle",
]
TRAIN = [
    "data.num_train=16",
    "data.num_dev=6",
    "data.num_test=8",
    "data.synthetic_image_size=32",
    "model.name=seps-tiny-32",
    "train.batch_size=8",
    "train.max_steps=2",
    "train.num_threads=1",
    "progress=false",
]
KEPT = ("best.pt", "config.yaml", "vocab.json", "summary.json", "metrics.json", "metrics.jsonl")


def fixed_inputs() -> torch.Tensor:
    """The (4, 3, 32, 32) images every version scores (seeded, independent of patchword)."""
    return torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))


def score(directory: Path) -> torch.Tensor:
    """(4, 6) sims of ``directory`` (a run or an export) on the fixed inputs, the captions as dense text."""
    from patchword.runs import load_run

    run = load_run(directory)
    ids, lens = run.tokenize(CAPTIONS)
    dense_ids, dense_lens = run.tokenize(CAPTIONS[:4])  # one description per image
    with torch.no_grad():
        return run.model(fixed_inputs(), ids, lens, dense_ids, dense_lens).sims.float()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--commit", required=True, help="the commit the patchword on the path was built from")
    args = parser.parse_args()
    from patchword.cli import main as patchword

    work = Path(tempfile.mkdtemp())
    name = f"run_{args.commit}"
    assert (
        patchword(["train", *TRAIN, f"output_dir={work}", f"name={name}", f"data.cache_dir={work / 'c'}"])
        == 0
    )
    assert patchword(["export", str(work / name), str(work / "export")]) == 0
    assert patchword(["eval", str(work / name), "--out", str(work / "eval.json")]) == 0
    args.out.mkdir(parents=True)
    (args.out / "run").mkdir()
    for file in KEPT:
        shutil.copyfile(work / name / file, args.out / "run" / file)
    shutil.copytree(work / "export", args.out / "export")
    shutil.copyfile(work / "eval.json", args.out / "eval.json")
    torch.save({"run": score(work / name), "export": score(work / "export")}, args.out / "scores.pt")
    (args.out / "made_by.json").write_text(
        json.dumps({"commit": args.commit, "torch": torch.__version__, "train": TRAIN}, indent=2)
    )
    shutil.rmtree(work)
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
