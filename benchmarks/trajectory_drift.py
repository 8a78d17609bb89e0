"""How fast two training runs that differ only in rounding drift apart (issue 13's 1e-4 loss criterion).

Runs the same one-process training twice, with 1 and with 2 intra-op threads (the two differ only in
the order of floating-point reductions, like a 1-process and a 2-process run), records every step's
gradients (before clipping) and weights, and prints per step the relative L2 difference of the
gradients and of the weights between the two runs, plus the largest relative difference of the logged
losses. ``--smooth-max TAU`` replaces every ``Tensor.amax`` (the fine-grained score's max over tokens)
by ``TAU * logsumexp(x / TAU)`` in both runs: a probe of how much of the drift the non-smooth max causes.
``--float64`` trains both runs with ``precision=fp64``; ``--perturb EPS`` multiplies the 2-thread run's
weights by ``1 + EPS * N(0, 1)`` after its first step: together they measure how large a difference must
be before the trajectories part (fp32 rounding is ~1e-7, fp64's ~1e-16).

    .venv/bin/python benchmarks/trajectory_drift.py --steps 8                  # SEPS code, Done-when config
    .venv/bin/python benchmarks/trajectory_drift.py --steps 8 model.matcher=vse  # global cosine only
    .venv/bin/python benchmarks/trajectory_drift.py --steps 8 --smooth-max 0.01 \\
        model.seps.sparse_ratio=1.0 model.seps.aggr_ratio=1.0
    .venv/bin/python benchmarks/trajectory_drift.py --steps 20 --float64
    .venv/bin/python benchmarks/trajectory_drift.py --steps 20 --float64 --perturb 1e-10

Extra arguments are dotted config overrides on top of the issue's Done-when command. Results and the
machine are in docs/distributed.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DONE_WHEN = [
    "--config",
    str(ROOT / "configs" / "synthetic_seps_paper.yaml"),
    "train.log_every=1",
    "train.global_warmup_steps=0",
    "train.batch_size=64",
    "train.eval_every=100000",
    "model.seps.variant=code",
]


def _child(out: str, smooth_max: float, argv: list[str]) -> None:
    """One training run, saving [{"g": grads, "w": weights}] per optimiser step to ``out``."""
    import torch

    from patchword.cli import main
    from patchword.train import runner, trainer

    snaps: list[dict] = []
    step = trainer.Trainer._clip_and_step

    perturb = float(os.environ.get("DRIFT_PERTURB", "0"))

    def recording_step(self, found_inf):
        grads = {n: p.grad.detach().clone() for n, p in self.model.named_parameters() if p.grad is not None}
        step(self, found_inf)
        if perturb and not snaps:
            gen = torch.Generator().manual_seed(0)
            with torch.no_grad():
                for p in self.model.parameters():
                    p.mul_(1 + perturb * torch.randn(p.shape, generator=gen, dtype=p.dtype))
        snaps.append({"g": grads, "w": {n: p.detach().clone() for n, p in self.model.named_parameters()}})

    trainer.Trainer._clip_and_step = recording_step
    # Only the training steps matter here: no dev validation, and the run ends where the test would start.
    trainer.Trainer.validate = lambda self: {"rsum": 0.0}

    def save_and_exit(*args, **kwargs):
        torch.save(snaps, out)
        os._exit(0)

    runner.evaluate_run = save_and_exit
    if smooth_max > 0:

        def smooth_amax(x, dim=None, keepdim=False):
            return smooth_max * torch.logsumexp(x / smooth_max, dim=dim, keepdim=keepdim)

        torch.Tensor.amax = smooth_amax
    main(["train", *argv])
    raise SystemExit("training ended before its test evaluation")


def _rel(a, b) -> float:
    return float((a - b).norm() / max(float(a.norm()), 1e-30))


def drift(args: argparse.Namespace, overrides: list[str]) -> dict:
    import torch

    work = Path(tempfile.mkdtemp(prefix="drift_"))
    losses, snaps = {}, {}
    for threads in (1, 2):
        argv = [*DONE_WHEN, f"train.max_steps={args.steps}", f"train.num_threads={threads}"]
        argv += [
            f"output_dir={work}",
            f"name=t{threads}",
            *(["precision=fp64"] if args.float64 else []),
            *overrides,
        ]
        out = work / f"t{threads}.pt"
        cmd = [
            sys.executable,
            __file__,
            "--child",
            str(out),
            "--smooth-max",
            str(args.smooth_max),
            "--",
            *argv,
        ]
        env = dict(os.environ, DRIFT_PERTURB=str(args.perturb if threads == 2 else 0.0))
        subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, env=env)
        records = [
            json.loads(line) for line in (work / f"t{threads}" / "metrics.jsonl").read_text().splitlines()
        ]
        losses[threads] = [r["loss"] for r in records if r["split"] == "train"]
        snaps[threads] = torch.load(out)
    rows = []
    for k, (a, b) in enumerate(zip(snaps[1], snaps[2], strict=True)):
        names = list(a["g"])
        ga, gb = (torch.cat([s["g"][n].flatten() for n in names]) for s in (a, b))
        wa, wb = (torch.cat([s["w"][n].flatten() for n in names]) for s in (a, b))
        la, lb = losses[1][k], losses[2][k]
        rows.append(
            {
                "step": k + 1,
                "grad_rel_diff": _rel(ga, gb),
                "weight_rel_diff": _rel(wa, wb),
                "loss_rel_diff": abs(la - lb) / max(abs(la), 1e-12),
            }
        )
    print(f"{'step':>4} {'grad':>9} {'weights':>9} {'loss':>9}")
    for r in rows:
        print(
            f"{r['step']:4d} {r['grad_rel_diff']:9.1e} {r['weight_rel_diff']:9.1e} {r['loss_rel_diff']:9.1e}"
        )
    return {"overrides": overrides, "smooth_max": args.smooth_max, "steps": rows}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" in argv:  # child: everything after "--" goes to patchword train
        cut = argv.index("--")
        argv, rest = argv[:cut], argv[cut + 1 :]
    else:
        rest = []
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--smooth-max", type=float, default=0.0)
    parser.add_argument("--float64", action="store_true", help="train both runs in float64 (precision=fp64)")
    parser.add_argument(
        "--perturb",
        type=float,
        default=0.0,
        help="scale the 2-thread run's weights by 1 + eps * N(0, 1) after step 1",
    )
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args, overrides = parser.parse_known_args(argv)
    if args.child:
        os.environ.setdefault("OMP_NUM_THREADS", "2")
        _child(args.child, args.smooth_max, rest)
        return 0
    result = drift(args, overrides)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
