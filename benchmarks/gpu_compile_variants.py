"""The ``train_compile`` step of ``make gpu-check``: steps/s of the compiled training step for each
``--compile-variants`` item, one ``ddp_bench.py gpu-step`` child process per variant.

Compilation takes most of a variant's wall time (1-2 minutes for ViT-B/16 + BERT-base on an H100 machine),
and most of it runs on one CPU core: tracing, lowering and scheduling are single-threaded, only the
kernels compile in a pool. A GPU machine's time is scarce and it has 16 cores, so ``--compile-parallel N``
variants compile at once, each in a child with its own compiler cache, then take turns on the device: a
child warms up, prints ``gpu-step: ready`` and waits (``--wait-go``); once every child of the wave is
ready (or gone), each in turn is told to time its steps and profile, alone on an otherwise idle GPU and
CPU. The figures are those of variants run one after the other; only the wall time to compile changes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

#: the options a --compile-variants item may add after its scope (other than a torch.compile mode)
VARIANT_FLAGS = {
    "math-bf16": ["--math-sdp-bf16"],
    "math-off": ["--no-math-sdp"],
    **{f"mask-{form}": ["--text-mask", form] for form in ("additive", "broadcast", "contiguous")},
    **{f"eager-attention-{which}": ["--eager-attention", which] for which in ("text", "image", "all")},
    "compiled-optimizer": ["--compile-optimizer"],
    # every frame compiled for the sizes it meets: if a graph break on the GPU splits BERT into frames
    # called at 35 and then 128 keys, the second is not traced with a symbolic length
    "static": ["--static-shapes"],
    # batches of two caption widths in turn (a dataset's, padded to multiples of 16): a symbolic width in
    # the trace and a CUDA graph recorded per width, as training on real data has them
    "widths-32-40": ["--caption-widths", "32,40"],
}

#: seconds kept, per child of a wave, for its timed steps and its profile once compiled
TURN_RESERVE_S = 30.0


def parse_compile_variants(text: str) -> list[dict]:
    """``precision:scope[:option...]`` items, comma-separated (``bf16:step:reduce-overhead:math-bf16``)
    -> the ``gpu-step`` settings ``{"precision", "scope", "mode", "flags"}``: an option is a
    :data:`VARIANT_FLAGS` name or else the torch.compile mode (one at most); ``ValueError`` names a bad
    item."""
    variants = []
    for item in filter(None, text.split(",")):
        parts = item.split(":")
        modes = [o for o in parts[2:] if o not in VARIANT_FLAGS]
        if (
            len(parts) < 2
            or parts[0] not in ("amp_bf16", "bf16")
            or parts[1] not in ("modules", "step")
            or len(modes) > 1
        ):
            raise ValueError(
                f"{item!r}: expected precision:scope[:option...], precision amp_bf16 or bf16, scope "
                f"modules or step, options a torch.compile mode (one) or {', '.join(VARIANT_FLAGS)}"
            )
        flags = [o for o in parts[2:] if o in VARIANT_FLAGS]
        variants.append(
            {"precision": parts[0], "scope": parts[1], "mode": modes[0] if modes else None, "flags": flags}
        )
    return variants


def variant_label(variant: dict) -> str:
    parts = (variant["precision"], variant["scope"], variant["mode"], *variant.get("flags", ()))
    return ":".join(v for v in parts if v)


def variant_command(python: str, root: Path, variant: dict, device: str, quick: bool, out: Path) -> list[str]:
    """The ``gpu-step`` command of one variant: batch 64 of seps-vit-b16-paper (``quick``: batch 8 of
    seps-tiny-paper), 3 warm-up steps, then (told to go) 10 timed steps and 3 profiled ones, JSON to
    ``out``."""
    model = "seps-tiny-paper" if quick else "seps-vit-b16-paper"
    cmd = [python, str(root / "benchmarks" / "ddp_bench.py"), "gpu-step", "--device", device]
    cmd += ["--model", model, "--batch", "8" if quick else "64", "--compile", "--steps", "10"]
    cmd += ["--warmup", "3", "--precision", variant["precision"], "--compile-scope", variant["scope"]]
    cmd += ["--json", str(out), "--profile-steps", "3", "--wait-go"]  # the profile after the timed steps
    if variant["mode"]:
        cmd += ["--compile-mode", variant["mode"]]
    cmd += [arg for flag in variant["flags"] for arg in VARIANT_FLAGS[flag]]
    return [*cmd, "--quick"] if quick else cmd


class VariantChild:
    """One variant's ``gpu-step`` process: its output lines (read by a thread, so that a full pipe never
    blocks it) and whether it said it is ready."""

    def __init__(self, variant: dict, cmd: list[str], env: dict, cwd: Path) -> None:
        self.variant, self.out = variant, Path(cmd[cmd.index("--json") + 1])
        self.start = time.perf_counter()
        self.ready_s: float | None = None
        self.killed = False  # stopped by the runner (the budget), not gone by itself
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if line.strip() == "gpu-step: ready":
                self.ready_s = round(time.perf_counter() - self.start, 1)
                self.ready.set()

    def settled(self) -> bool:
        """Ready to time, or gone."""
        return self.ready.is_set() or self.proc.poll() is not None

    def tail(self, n: int = 15) -> list[str]:
        return self.lines[-n:]

    def stop(self) -> None:
        """Kill it if it still runs, and close its pipes."""
        if self.proc.poll() is None:
            self.killed = True
            self.proc.kill()
        self.proc.wait()
        self._reader.join(timeout=5)
        for pipe in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                pipe.close()

    def _timing(self) -> dict | None:
        """The JSON ``gpu-step`` writes right after its timed steps (again with its profile), if readable."""
        try:
            return json.loads(self.out.read_text())
        except (OSError, ValueError):
            return None

    def take_turn(self, timeout: float) -> dict:
        """Time, profile and exit within ``timeout`` seconds: the row of :func:`run_variants`."""
        if not self.ready.is_set():
            self.stop()
            if self.killed:
                return {**self.variant, "status": f"not compiled in {time.perf_counter() - self.start:.0f} s"}
            return {**self.variant, "status": f"failed: exit {self.proc.returncode}", "tail": self.tail()}
        try:
            self.proc.stdin.write("go\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=max(timeout, 1.0))
        except subprocess.TimeoutExpired:
            self.stop()
            status = f"stopped: its timed steps and profile ran past {timeout:.0f} s"
            timing = self._timing()  # the steps/s stand if they were written before the profile
            return {**self.variant, **(timing or {}), "status": status, "ready_s": self.ready_s}
        except BrokenPipeError:  # it exited between saying ready and now: stopped below like the others
            pass
        self.stop()
        if self.proc.returncode != 0:
            return {**self.variant, "status": f"failed: exit {self.proc.returncode}", "tail": self.tail()}
        timing = self._timing()
        if timing is None:
            return {**self.variant, "status": f"failed: no readable {self.out.name}", "tail": self.tail()}
        seconds = round(time.perf_counter() - self.start, 1)
        return {**self.variant, **timing, "ready_s": self.ready_s, "seconds": seconds}


def run_variants(
    variants: list[dict],
    command: Callable[[dict, Path], list[str]],
    env: dict,
    cwd: Path,
    out_dir: Path,
    parallel: int,
    free_s: Callable[[], float],
    report: Callable[[dict], None],
    before_turns: Callable[[], None] | None = None,
) -> list[dict]:
    """Run ``variants`` in waves of ``parallel`` (compiled at once, then timed one at a time), in order.

    Args:
        command: ``(variant, json_path) -> argv`` of its ``gpu-step --wait-go`` child.
        env: the children's environment; each gets its own ``TORCHINDUCTOR_CACHE_DIR`` (a cache's keys
            do not hold every setting a variant changes, such as math-bf16) and a share of the CPUs for
            kernel compilation.
        free_s: seconds of the budget left for this step, asked before each wave and each turn.
        report: called with each finished row, in variant order.
        before_turns: called once the wave has compiled (or been stopped) and before its first turn:
            work that ran beside the compilation and must end before anything is timed.

    A wave starts only if the budget holds its turns (:data:`TURN_RESERVE_S` each) and, after the first,
    as long a compilation as the previous wave's slowest. Children still compiling when the budget
    leaves only the turns are stopped before any turn, so that nothing compiles while a variant is timed.

    Returns:
        one row per variant: ``gpu-step``'s JSON, ``ready_s`` (wall seconds to compile and warm up,
        ``compiling_at_once`` of them together) and ``seconds`` (start to exit), or a ``status`` saying
        why not (and the child's last lines, ``tail``, where it failed). Each child's whole output goes
        to ``train_compile_LABEL.log`` beside its JSON.
    """
    rows: list[dict] = []
    parallel, compile_s = max(1, parallel), 30.0  # compile_s: the last wave's slowest, once known
    for first in range(0, len(variants), parallel):
        wave = variants[first : first + parallel]
        if free_s() < TURN_RESERVE_S * len(wave) + compile_s:
            for variant in variants[first:]:
                report(row := {**variant, "status": f"skipped (budget: {free_s():.0f} s free)"})
                rows.append(row)
            break
        threads = str(max(1, (os.cpu_count() or 1) // len(wave)))
        children: list[VariantChild] = []
        caches: list[str] = []  # each child compiles from nothing, into a cache of its own, removed after
        try:
            for variant in wave:
                label = variant_label(variant).replace(":", "_")
                caches.append(tempfile.mkdtemp(prefix="gpu_check_inductor_"))
                child_env = {
                    **env,
                    "TORCHINDUCTOR_CACHE_DIR": caches[-1],
                    "TORCHINDUCTOR_COMPILE_THREADS": threads,
                }
                cmd = command(variant, out_dir / f"train_compile_{label}.json")
                children.append(VariantChild(variant, cmd, child_env, cwd))
            # compile together, while the budget leaves every child its turn; then nothing compiles
            while not all(c.settled() for c in children) and free_s() > TURN_RESERVE_S * len(children):
                time.sleep(0.5)
            for child in children:
                if not child.ready.is_set():
                    child.stop()
            if before_turns is not None:
                before_turns()
            compile_s = max([c.ready_s for c in children if c.ready_s is not None] or [compile_s])
            for k, child in enumerate(children):
                row = child.take_turn(timeout=free_s() - TURN_RESERVE_S * (len(children) - 1 - k))
                row["compiling_at_once"] = len(children)
                # everything it printed (PyTorch's reasons for refusing a kernel come as warnings)
                child.out.with_suffix(".log").write_text("\n".join(child.lines) + "\n")
                rows.append(row)
                report(row)
        finally:
            for child in children:
                child.stop()
            for cache in caches:
                shutil.rmtree(cache, ignore_errors=True)
    return rows
