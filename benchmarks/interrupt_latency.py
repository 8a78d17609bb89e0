"""How long ``patchword eval`` takes to stop after Ctrl-C while its scoring workers are busy.

``tests/cli/test_faults.py`` checks what the stop does, by counts (no scoring block is started after the
signal, one ``interrupted:`` line, exit code 130); how long it takes depends on the machine and its load
(the blocks in hand are finished first), so it is measured here rather than asserted there (it was a
`< 5 s` verdict until issue 36). Command:

    .venv/bin/python benchmarks/interrupt_latency.py [--repeats 3] [--test-images 600] [--wait 1.5]

Trains the test's tiny run once (one step, 2 threads) in a temporary directory, then ``--repeats`` times
starts ``patchword eval`` on it, sends SIGINT ``--wait`` seconds after the test split is loaded (the
scoring has started) and prints the seconds from the signal to the exit, with the exit codes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from patchword.cli import main as patchword  # noqa: E402

# tests/cli/test_faults.py's tiny SEPS run, with the Ctrl-C test's test split and memory budget
RUN = [
    "data.num_train=21",
    "data.num_dev=6",
    "data.synthetic_image_size=32",
    "model.name=seps-tiny-32",
    "model.seps.variant=paper",
    "train.batch_size=16",
    "train.max_steps=1",
    "train.num_threads=2",
    "eval.max_memory_mb=4",
    "progress=false",
]


def one_interrupt(run: Path, out: Path, wait: float) -> dict:
    cmd = [sys.executable, "-m", "patchword", "eval", str(run), "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    proc = subprocess.Popen(
        cmd,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    for line in proc.stderr:  # the test split is loaded: the scoring starts
        if "synthetic scenes" in line:
            break
    time.sleep(wait)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    rest = proc.stderr.read()
    proc.wait()
    return {"seconds": time.monotonic() - sent, "exit": proc.returncode, "last_line": rest.strip()[-200:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--test-images", type=int, default=600)
    parser.add_argument("--wait", type=float, default=1.5, help="seconds of scoring before the SIGINT")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        run = [*RUN, f"data.num_test={args.test_images}", f"output_dir={root}", "name=r"]
        if patchword(["train", *run, f"data.cache_dir={root / 'cache'}"]) != 0:
            return 1
        trials = [one_interrupt(root / "r", root / "e.json", args.wait) for _ in range(args.repeats)]
    seconds = [t["seconds"] for t in trials]
    print(
        f"SIGINT to exit: median {statistics.median(seconds):.2f} s (min {min(seconds):.2f}, max "
        f"{max(seconds):.2f}; exit codes {[t['exit'] for t in trials]})"
    )
    if args.json is not None:
        args.json.write_text(json.dumps({"test_images": args.test_images, "trials": trials}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
