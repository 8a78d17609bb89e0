"""CPU scoring when another process holds a core: before (intra-op threads) and after (queue workers).

``score_matrix`` on SEPS pairs at ViT-224 shapes (197 tokens of 512, real caption lengths when the
shared data folder is there), with 2 torch threads, on an idle machine and with one core held by a
busy-loop process, for each scoring mode:

* ``intra``: one thread of control whose ops use torch's intra-op (OpenMP) threads: the engine before
  issue 13 (``SEPSEngine(workers=1)``);
* ``intra-passive``: the same with ``OMP_WAIT_POLICY=PASSIVE`` (OpenMP threads sleep instead of spinning
  at the end of every parallel region; the variable must be set before the process starts);
* ``workers``: single-threaded workers taking image blocks from a shared queue (the engine now, the
  default ``SEPSEngine()``);
* ``reference`` (``--reference``): the official per-caption loop (``patchword.testing``), 2 threads.

Every measurement runs in a fresh process (the busy loop in another one, started first) and reports the
best of ``--repeats`` calls; the table gives the busy / idle slowdown of each mode. Holding one of two
cores leaves 1.5 cores' worth of CPU time to a 2-thread job that shares fairly (each of the 3 runnable
threads gets 2/3 of a core), so a job that degrades "by the busy core's share" slows by about 1.3x, and
by 2x at worst (it runs on one core). Run it on an otherwise idle machine:

    .venv/bin/python benchmarks/score_contention.py                 # 64 x 64 pairs, 2 threads (~1 min)
    .venv/bin/python benchmarks/score_contention.py --reference     # + the official loop (~1 more min)
    .venv/bin/python benchmarks/score_contention.py --quick         # smoke run (small shapes)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

MODES = ("intra", "intra-passive", "workers", "reference")


def _measure(args: argparse.Namespace) -> dict:
    """One mode, in this (fresh) process."""
    import torch

    from patchword.bench.inputs import SCORING_CONFIGS, benchmark_lengths, build_bench_matcher, scoring_inputs
    from patchword.bench.machine import best_time
    from patchword.eval import score_matrix
    from patchword.eval.engine import SEPSEngine
    from patchword.testing import seps_reference_scores

    torch.set_num_threads(args.threads)
    cap_lens, dense_lens, source = benchmark_lengths(None, None, stand_in=args.quick)
    img, caps, lens, dense, dlens, t2i = scoring_inputs(args.images, cap_lens, dense_lens)
    caps, lens, t2i = caps[: args.captions], lens[: args.captions], t2i[: args.captions]
    caps = caps[:, : int(lens.max())]
    spec = SCORING_CONFIGS[args.config]
    matcher = build_bench_matcher(args.config)
    if args.quick:  # small shapes: fewer patches are not possible (the matcher is ViT-224), fewer images
        img, dense, dlens = img[:8], dense[:8], dlens[:8]
        caps, lens, t2i = caps[t2i < 8], lens[t2i < 8], t2i[t2i < 8]  # the captions of those images
    # Caption-tied dense text (the official protocol) pairs caption j with its image's dense row t2i[j].
    caption_tied = spec["dense"] and spec["dense_pairing"] == "caption"
    d, dl = (dense, dlens) if spec["dense"] else (None, None)
    if args.mode == "reference":

        def run():
            return seps_reference_scores(
                matcher, img, caps, lens, d, dl, dense_index=t2i if caption_tied else None
            )
    else:
        engine = SEPSEngine(matcher, workers=1 if args.mode.startswith("intra") else None)

        def run():
            return score_matrix(
                matcher,
                img,
                caps,
                lens,
                d,
                dl,
                txt2img=t2i if caption_tied else None,
                engine=engine,
                max_memory_mb=args.max_memory_mb,
            )

    run()  # warm-up
    seconds = best_time(run, args.repeats)
    return {"mode": args.mode, "seconds": seconds, "pairs": img.shape[0] * caps.shape[0], "lengths": source}


def _child(mode: str, busy: bool, args: argparse.Namespace) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    if mode == "intra-passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    cmd = [sys.executable, __file__, "--child", mode, *_forward(args)]
    loop = None
    if busy:
        loop = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(0.5)  # let it take its core
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, timeout=1800)
    finally:
        if loop is not None:
            loop.kill()
            loop.wait()
    return json.loads(out.stdout.strip().splitlines()[-1])


def _forward(args: argparse.Namespace) -> list[str]:
    out = [
        f"--images={args.images}",
        f"--captions={args.captions}",
        f"--threads={args.threads}",
        f"--config={args.config}",
        f"--repeats={args.repeats}",
        f"--max-memory-mb={args.max_memory_mb}",
    ]
    return out + (["--quick"] if args.quick else [])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--captions", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--config", default="seps-code-image", help="a patchword.bench SCORING_CONFIGS name")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-memory-mb", type=float, default=1024)
    parser.add_argument("--reference", action="store_true", help="also the official per-caption loop")
    parser.add_argument(
        "--modes", default="intra,intra-passive,workers", help="comma-separated: " + ",".join(MODES)
    )
    parser.add_argument("--quick", action="store_true", help="8 images, stand-in lengths, one repeat")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats = 1
    if args.child:
        args.mode = args.child
        print(json.dumps(_measure(args)))
        return 0
    modes = args.modes.split(",") + (["reference"] if args.reference else [])
    rows = []
    for mode in modes:
        idle = _child(mode, False, args)
        busy = _child(mode, True, args)
        rows.append(
            {"mode": mode, "idle_s": idle["seconds"], "busy_s": busy["seconds"], "pairs": idle["pairs"]}
        )
        row = rows[-1]
        print(
            f"{mode:>14}: idle {row['idle_s']:7.3f} s   one core busy {row['busy_s']:7.3f} s   "
            f"slowdown {row['busy_s'] / row['idle_s']:5.2f}x   "
            f"({row['pairs']} pairs, {args.threads} threads)",
            flush=True,
        )
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"(load average at the end {load:.2f}; fair-share slowdown with one of 2 cores busy: ~1.3x, worst 2x)"
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"threads": args.threads, "config": args.config, "rows": rows}, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
