"""What a lent GPU machine should measure, in one command within a wall-clock budget (``make gpu-check``).

    PYTHON=python3 make gpu-check           # on the GPU machine: PYTHONPATH=src, no venv, nothing installed
    make gpu-check GPU_CHECK_ARGS="--budget-s 300"
    .venv/bin/python benchmarks/gpu_check.py --quick --device cpu --out /tmp/gc   # a CPU smoke run (~1.5 min)

Steps, in order, each printed as soon as it has a result:

a. ``device``: GPU name and memory, torch / CUDA / cuDNN versions, driver (``nvidia-smi``), TF32 flags.
b. ``pytest``: ``pytest -m cuda`` in a subprocess with a timeout (tests/eval/test_cuda.py: CUDA equals
   the CPU).
c. ``scoring``: ``score_matrix`` at the Flickr30K (1000 x 5000) and COCO-5K (5000 x 25000) shapes,
   ViT-B/16-224 tokens, SEPS code variant with image-tied then caption-tied dense text, inputs already on
   the device and given from the host (the upload included); exactness against the official per-caption
   loop (``patchword.testing.seps_reference_scores``) on a slice and the engine's speed-up over it per pair.
d. ``train``: training steps/s at ViT-B/16 + BERT-base shapes, batch 64 and 128, bfloat16 autocast, and
   at batch 64 also with unfused query/key/value projections and in ``precision=bf16`` (the bfloat16 copy
   with float32 master weights) (``ddp_bench.py gpu-step``; random initialisation, needs transformers).
e. ``demo``: ``patchword demo device=... train.max_steps=...`` end to end, timed, its test rSum.
f. ``profile``: ``torch.profiler`` of one ``score_matrix`` call on a slice: top ops by self device time and
   the host-device synchronisations and copies.

More steps, run when ``--steps`` names them (``benchmarks/gpu_check_extra.py``): ``tf32`` (scoring in
float32 and ``precision="tf32"``), ``eval_tf32`` (``patchword eval --eval-run RUN`` in both),
``train_profile`` (the training step under the profiler), ``train_compile`` (steps/s with
``torch.compile``, one child process per ``--compile-variants`` item, several compiling at once and timed
one at a time: ``benchmarks/gpu_compile_variants.py``), ``attention`` (which attention kernel the
encoders run, eager and compiled: ``benchmarks/attention_probe.py``; in the background beside the
compilation when ``train_compile`` is the next step, finished before anything else runs).

Timings come before the profiler (it slows what it watches). A step is skipped, with a line saying so, when
the budget left cannot hold it and the minimum of the steps after it; a step that fails prints its
traceback, is recorded as an error and the next one runs. ``gpu_check.json`` and ``gpu_check.md`` are
rewritten in ``--out`` after every step (and every scoring case), so a run killed at the wall-clock limit
still leaves what it measured. Optional packages (transformers) that are missing skip their step.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import traceback
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Run from a bare checkout with whatever interpreter is there: the package from src/, ddp_bench beside us.
for _path in (ROOT / "src", ROOT / "benchmarks"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

#: Least wall seconds each step needs to say anything; a later (chosen) step's minimum is kept free for it.
MIN_SECONDS = {"device": 5, "pytest": 20, "scoring": 30, "train": 60, "demo": 45, "profile": 15}
# the steps of gpu_check_extra.py, run when --steps names them
MIN_SECONDS.update({"tf32": 20, "eval_tf32": 40, "train_profile": 30, "train_compile": 60, "attention": 30})
DEFAULT_STEPS = ["device", "pytest", "scoring", "train", "demo", "profile"]


def say(line: str) -> None:
    print(line, flush=True)


class Budget:
    """Wall seconds left of ``--budget-s``, and what the steps after a given one need of it."""

    def __init__(self, total_s: float, steps: list[str]) -> None:
        self.total_s, self.steps, self.start = total_s, steps, time.monotonic()

    def left(self) -> float:
        return self.total_s - (time.monotonic() - self.start)

    def free(self, step: str) -> float:
        """Seconds ``step`` may spend and still leave every later step its minimum."""
        return self.left() - sum(MIN_SECONDS[n] for n in self.steps[self.steps.index(step) + 1 :])


class Report:
    """The results so far, rewritten as ``gpu_check.json`` and ``gpu_check.md`` after every change."""

    def __init__(self, out: Path, args: argparse.Namespace) -> None:
        self.out, self.start = out, time.monotonic()
        self.data: dict = {"args": vars(args), "started": time.strftime("%Y-%m-%d %H:%M:%S"), "steps": {}}
        out.mkdir(parents=True, exist_ok=True)
        for name in ("gpu_check.json", "gpu_check.md"):  # never overwrite an earlier run's results silently
            if (out / name).exists():
                kept = out / f"{Path(name).stem}-{time.strftime('%Y%m%d-%H%M%S')}{Path(name).suffix}"
                (out / name).rename(kept)
                say(f"earlier {name} kept as {kept}")

    def record(self, step: str, entry: dict) -> None:
        self.data["steps"][step] = entry
        self.data["elapsed_s"] = round(time.monotonic() - self.start, 1)
        from patchword.fileio import atomic_write_text

        atomic_write_text(self.out / "gpu_check.json", json.dumps(self.data, indent=2, default=str))
        atomic_write_text(self.out / "gpu_check.md", markdown(self.data))


# ------------------------------------------------------------------------------------------------ steps


def step_device(args, budget: Budget, partial) -> dict:
    import torch

    info: dict = {"device": args.device, "torch": torch.__version__, "cuda": torch.version.cuda}
    info["python"], info["cpus"] = platform.python_version(), os.cpu_count()
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"{args.device} requested but torch.cuda.is_available() is False")
        props = torch.cuda.get_device_properties(device)
        info["name"], info["memory_gib"] = props.name, round(props.total_memory / 2**30, 1)
        info["capability"] = f"sm_{props.major}{props.minor}"
        info["cudnn"] = torch.backends.cudnn.version()
        info["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
        info["tf32_cudnn"] = torch.backends.cudnn.allow_tf32
        torch.zeros(1, device=device)  # the context: its start-up is not a later step's time
        info["driver"] = _driver_version()
    else:
        info["name"] = _cpu_name()
    with contextlib.suppress(PackageNotFoundError):  # its metadata: importing transformers costs seconds
        info["transformers"] = version("transformers")
    info["summary"] = device_line(info)
    return info


def _driver_version() -> str | None:
    """The NVIDIA driver's version from ``nvidia-smi``, else from the kernel module, else None."""
    query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
    with contextlib.suppress(OSError, IndexError, subprocess.SubprocessError):
        return subprocess.run(query, capture_output=True, text=True, timeout=20).stdout.split()[0]
    with contextlib.suppress(OSError, AttributeError):
        text = Path("/proc/driver/nvidia/version").read_text()
        return re.search(r"Kernel Module\s+(\S+)", text).group(1)
    return None


def _cpu_name() -> str:
    with contextlib.suppress(OSError, StopIteration), open("/proc/cpuinfo") as fh:
        return next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    return platform.processor() or platform.machine()


def device_line(info: dict) -> str:
    parts = [info.get("name") or "?"]
    if info.get("memory_gib"):
        parts[0] += f" ({info['memory_gib']} GiB, {info['capability']})"
    parts += [f"torch {info['torch']}", f"CUDA {info['cuda']}"]
    if info.get("driver"):
        parts.append(f"driver {info['driver']}")
    parts.append(f"{info['cpus']} CPUs, python {info['python']}")
    return ", ".join(parts)


def _child_env() -> dict[str, str]:
    """This environment with the package's src/ on the path of a child interpreter."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
    }


def _holds_cuda_tests(path: Path) -> bool:
    text = path.read_text()
    return "pytestmark = pytest.mark.cuda" in text or "@pytest.mark.cuda" in text


def step_pytest(args, budget: Budget, partial) -> dict:
    timeout = min(args.pytest_timeout_s, budget.free("pytest"))
    # --continue-on-collection-errors: a module importing a package this machine lacks (fastapi) must not
    # stop the cuda tests, which it does not hold
    cmd = [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider"]
    cmd.append("--continue-on-collection-errors")
    # only the modules that hold cuda tests: the others may import packages this machine lacks (fastapi)
    cmd += sorted(
        str(f.relative_to(ROOT)) for f in (ROOT / "tests").rglob("test_*.py") if _holds_cuda_tests(f)
    )
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=_child_env(), capture_output=True, text=True, timeout=timeout
        )
        output, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as err:
        output = (err.stdout or b"").decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
        rc = None
    (Path(args.out) / "pytest_cuda.log").write_text(output)
    lines = output.strip().splitlines()
    counts = {}
    for line in reversed(lines):
        found = re.findall(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed|xpassed)", line)
        if found:
            counts = {("error" if k.startswith("error") else k): int(n) for n, k in found}
            break
    collection = [m.group(1) for m in map(re.compile(r"^ERROR (\S+\.py)\b").match, lines) if m]
    failed = [m.group(1) for m in map(re.compile(r"^(?:FAILED|ERROR) (\S+::\S+)").match, lines) if m]
    result = {"returncode": rc, "seconds": round(time.perf_counter() - start, 1), "counts": counts}
    result.update(failed=failed, collection_errors=collection, timed_out=rc is None, tail=lines[-15:])
    text = ", ".join(f"{n} {k}" for k, n in counts.items()) or "no summary line"
    result["summary"] = f"{text} in {result['seconds']} s" + (" (TIMED OUT)" if rc is None else "")
    if collection:
        result["summary"] += f"; modules not collected: {', '.join(Path(c).name for c in collection)}"
    if rc is None or counts.get("failed") or failed:
        result["status"] = "failed"
    return result


def step_scoring(args, budget: Budget, partial) -> dict:
    from gpu_check_scoring import run_scoring

    return run_scoring(args, budget, partial, say)


def step_train(args, budget: Budget, partial) -> dict:
    import importlib.util

    import torch

    if not args.quick and importlib.util.find_spec("transformers") is None:
        return {"status": "skipped", "summary": "transformers is not installed: no ViT-B/16 + BERT-base"}
    import ddp_bench

    models = ["seps-tiny-paper"] if args.quick else ["seps-vit-b16-paper", "seps-vit-b16-code"]
    batches = [8, 16] if args.quick else [64, 128]
    steps, warmup = (2, 1) if args.quick else (args.train_steps, 3)
    # the first model at the first batch again with query/key/value as three products (the effect of
    # patchword.encoders.fused) and in precision=bf16 (the bfloat16 copy with float32 master weights):
    # each beside the amp_bf16 row on this GPU
    cases = [(m, b, False, "amp_bf16") for m in models for b in batches]
    cases[1:1] = [(models[0], batches[0], True, "amp_bf16"), (models[0], batches[0], False, "bf16")]
    rows, last_wall = [], None
    for model, batch, unfused, precision in cases:
        case = {"model": model, "batch": batch, "precision": precision, "fused_qkv": not unfused}
        # a doubled batch costs about twice the steps; the first call also pays the model build
        need = 2 * last_wall if last_wall else MIN_SECONDS["train"] / 2
        if need > budget.free("train"):
            free = budget.free("train")
            label = f"{model} batch {batch} {precision}" + (" (q/k/v unfused)" if unfused else "")
            say(f"train {label}: skipped, ~{need:.0f} s needed, {free:.0f} s free")
            rows.append({**case, "status": "skipped (budget)"})
            continue
        ns = argparse.Namespace(device=args.device, quick=args.quick, model=model, batch=batch)
        ns.__dict__.update(precision=precision, steps=steps, warmup=warmup, pair_chunk=0)
        ns.__dict__.update(tf32=False, compile=False, sync_debug=False, unfused=unfused)
        start = time.perf_counter()
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # its JSON: we print one line instead
                row = ddp_bench.gpu_step(ns)
        except torch.cuda.OutOfMemoryError as err:
            row = {**case, "status": f"out of memory: {str(err)[:200]}"}
        last_wall = time.perf_counter() - start
        row["wall_s"] = round(last_wall, 1)
        rows.append(row)
        peak = row.get("peak_memory_gb")
        say(
            f"train {row['model']} batch {batch} {row.get('precision', '')}"
            + (" (q/k/v unfused)" if unfused else "")
            + ": "
            + (f"{row['steps_per_s']:.2f} steps/s" if "steps_per_s" in row else row["status"])
            + (f", peak {peak:.1f} GB" if peak else "")
            + f" ({row['wall_s']} s with the build)"
        )
        partial({"rows": rows})
        _free_memory()
    done = [r for r in rows if "steps_per_s" in r]
    summary = "; ".join(
        f"{r['model']} b{r['batch']} {r['precision']}{' unfused' if not r.get('fused_qkv', True) else ''}: "
        f"{r['steps_per_s']:.2f} steps/s"
        for r in done
    )
    return {"rows": rows, "summary": summary or "nothing measured"}


def step_demo(args, budget: Budget, partial) -> dict:
    timeout = min(args.demo_timeout_s, budget.free("demo"))
    # the run's data cache and checkpoints (~180 MB) stay out of --out, which comes back from the machine
    work = Path(tempfile.mkdtemp(prefix="gpu_check_demo_"))
    steps = 3 if args.quick else args.demo_steps
    overrides = [f"device={args.device}", f"train.max_steps={steps}", f"output_dir={work}"]
    overrides.append(f"data.cache_dir={work / 'cache'}")
    if args.quick:  # the smoke test's sizes (tests/train/test_train.py)
        overrides += ["data.num_train=20", "data.num_dev=12", "data.num_test=12", "train.batch_size=16"]
        overrides += ["train.eval_every=0", "train.eval_max_images=0", "eval.max_memory_mb=16"]
    cmd = [sys.executable, "-m", "patchword", "demo", *overrides, "--no-plots"]
    start = time.perf_counter()
    log = Path(args.out) / "demo.log"
    with open(log, "w") as fh:
        try:
            rc = subprocess.run(
                cmd, cwd=ROOT, env=_child_env(), stdout=fh, stderr=subprocess.STDOUT, timeout=timeout
            ).returncode
        except subprocess.TimeoutExpired:
            rc = None
    seconds = round(time.perf_counter() - start, 1)
    result = {"command": " ".join(cmd[1:]), "returncode": rc, "seconds": seconds, "steps": steps}
    summary_file = work / "demo" / "summary.json"
    if rc != 0 or not summary_file.exists():
        result["tail"] = log.read_text().splitlines()[-20:]
        result["status"] = "failed"
        result["summary"] = f"{'timed out' if rc is None else f'exit {rc}'} after {seconds} s (demo.log)"
        return result
    summary = json.loads(summary_file.read_text())
    config = (work / "demo" / "config.yaml").read_text()
    ran_on = re.search(r"^device: (\S+)", config, re.M)
    result.update({k: summary.get(k) for k in ("rsum", "train_seconds", "eval_seconds", "images", "steps")})
    result["run_device"] = ran_on.group(1) if ran_on else None
    (Path(args.out) / "demo_summary.json").write_text(json.dumps(summary, indent=2))
    result["summary"] = (
        f"rSum {summary['rsum']:.1f} after {summary['steps']} steps on {result['run_device']}, {seconds} s "
        f"end to end (training {summary.get('train_seconds', 0):.1f} s)"
    )
    return result


def step_profile(args, budget: Budget, partial) -> dict:
    import torch
    from gpu_check_scoring import memory_argument
    from torch.profiler import ProfilerActivity, profile

    from patchword.bench.inputs import build_bench_matcher, scoring_inputs, stand_in_lengths
    from patchword.eval import score_matrix

    device = torch.device(args.device)
    n_img, n_txt = (8, 40) if args.quick else (200, 2000)
    cap_lens, dense_lens = stand_in_lengths()
    img, caps, lens, dense, dlens, _ = scoring_inputs(max(n_img, n_txt // 5), cap_lens, dense_lens)
    matcher = build_bench_matcher("seps-code-image").to(device)
    call_args = (img[:n_img], caps[:n_txt], lens[:n_txt], dense[:n_img], dlens[:n_img])
    memory = memory_argument(lambda mm: score_matrix(matcher, *call_args, max_memory_mb=mm, device=device))
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    threads = torch.get_num_threads()
    if device.type == "cpu":  # one torch thread, one engine worker: the profiler sees the calling thread only
        torch.set_num_threads(1)
    try:
        with profile(activities=activities) as prof:
            score_matrix(matcher, *call_args, max_memory_mb=memory, device=device)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
    finally:
        torch.set_num_threads(threads)
    events = prof.key_averages()
    table = None
    for key in ("self_device_time_total", "self_cuda_time_total") if device.type == "cuda" else ():
        with contextlib.suppress(AttributeError, KeyError, ValueError):
            table = events.table(sort_by=key, row_limit=15)
            break
    table = table or events.table(sort_by="self_cpu_time_total", row_limit=15)
    watched = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpy", "aten::_local_scalar_dense")
    calls = {e.key: e.count for e in events if any(w in e.key for w in watched)}
    (Path(args.out) / "profile.txt").write_text(table)
    say(table)
    shown = ", ".join(f"{k} x{n}" for k, n in sorted(calls.items())) or "none"
    return {"shape": [n_img, n_txt], "table": table, "sync_and_copy_calls": calls, "summary": shown}


def _free_memory() -> None:
    gc.collect()
    with contextlib.suppress(ImportError):
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _extra(name: str):
    """Step ``name`` of gpu_check_extra.py, imported when it runs."""

    def step(args, budget: Budget, partial) -> dict:
        import gpu_check_extra

        return getattr(gpu_check_extra, f"step_{name}")(args, budget, partial, say, _child_env)

    return step


STEPS = {
    "device": step_device,
    "pytest": step_pytest,
    "scoring": step_scoring,
    "train": step_train,
    "demo": step_demo,
    "profile": step_profile,
    **{name: _extra(name) for name in ("tf32", "eval_tf32", "train_profile", "train_compile", "attention")},
}


# --------------------------------------------------------------------------------------------- markdown


def markdown(data: dict) -> str:
    steps = data["steps"]
    device = steps.get("device", {})
    lines = ["# gpu-check", "", f"**Device**: {device.get('summary', 'unknown')}", ""]
    lines += [
        f"Started {data['started']}, {data.get('elapsed_s', 0)} s so far; args `{_args(data['args'])}`",
        "",
    ]
    lines += ["| step | status | seconds | result |", "|---|---|---:|---|"]
    for name, entry in steps.items():
        cell = str(entry.get("summary", entry.get("error", ""))).replace("|", "/").replace("\n", " ")
        lines.append(f"| {name} | {entry.get('status', 'ok')} | {entry.get('wall_s', '')} | {cell} |")
    scoring = steps.get("scoring", {}).get("rows")
    if scoring:
        from gpu_check_scoring import scoring_table

        lines += ["", "## Exhaustive scoring", "", *scoring_table(scoring)]
    train = [r for r in steps.get("train", {}).get("rows", []) if "steps_per_s" in r]
    if train:
        lines += ["", "## Training step", "", "| model | batch | precision | q/k/v | steps/s | peak GB |"]
        lines.append("|---|---:|---|---|---:|---:|")
        for r in train:
            peak = f"{r['peak_memory_gb']:.1f}" if r.get("peak_memory_gb") else "-"
            qkv = "fused" if r.get("fused_qkv", True) else "unfused"
            cells = [r["model"], r["batch"], r["precision"], qkv, f"{r['steps_per_s']:.2f}", peak]
            lines.append("| " + " | ".join(map(str, cells)) + " |")
    tf32 = [r for r in steps.get("tf32", {}).get("rows", []) if "seconds" in r]
    if tf32:
        lines += ["", "## float32 vs precision=tf32 (alignment products only)", ""]
        lines += [
            "| config | shape | precision | seconds | pairs/s | max abs diff | top-1 changed (t2i / i2t) |"
        ]
        lines.append("|---|---|---|---:|---:|---:|---|")
        for r in tf32:
            diff = f"{r['max_abs_diff']:.1e}" if "max_abs_diff" in r else ""
            top = f"{100 * r['top1_changed_t2i']:.3f}% / {100 * r['top1_changed_i2t']:.3f}%" if diff else ""
            cells = [
                r["config"],
                r["shape"],
                r["precision"],
                f"{r['seconds']:.2f}",
                f"{r['pairs_per_s']:.3g}",
            ]
            lines.append("| " + " | ".join([*cells, diff, top]) + " |")
    if steps.get("profile", {}).get("table"):
        shape = steps["profile"]["shape"]
        lines += ["", f"## Profile of score_matrix ({shape[0]} x {shape[1]}, seps-code-image)", ""]
        lines += ["```", steps["profile"]["table"].rstrip(), "```"]
    failed = steps.get("pytest", {}).get("failed")
    if failed:
        lines += ["", "## Failed cuda tests (pytest_cuda.log)", "", *(f"* `{test}`" for test in failed)]
    for name, entry in steps.items():
        if entry.get("tail") and entry.get("status") == "failed":
            lines += ["", f"## {name}: last lines of its output", "", "```", *entry["tail"], "```"]
        if entry.get("traceback"):
            lines += ["", f"## {name}: error", "", "```", entry["traceback"].rstrip(), "```"]
    return "\n".join(lines) + "\n"


def _args(args: dict) -> str:
    flags = [
        f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}") for k, v in args.items() if v is not False
    ]
    return " ".join(flags)


# ------------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--out", default=os.environ.get("OUT") or "gpu_check_out", help="default: $OUT or ./gpu_check_out"
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run (with --device cpu)")
    parser.add_argument("--budget-s", type=float, default=450.0, help="wall seconds for all the steps")
    parser.add_argument(
        "--steps",
        default=",".join(DEFAULT_STEPS),
        help=f"which steps, comma-separated, of {', '.join(STEPS)}",
    )
    parser.add_argument("--eval-run", default=None, help="a trained run directory for the eval_tf32 step")
    parser.add_argument("--pytest-timeout-s", type=float, default=90.0)
    parser.add_argument("--ref-images", type=int, default=200, help="images of the official loop's slice")
    parser.add_argument("--ref-captions", type=int, default=10, help="captions of the official loop's slice")
    parser.add_argument("--train-steps", type=int, default=10, help="timed training steps per batch size")
    parser.add_argument(
        "--compile-variants",
        default="bf16:modules",
        help="the train_compile step's settings, comma-separated precision:scope[:option...] (precision "
        "amp_bf16 or bf16; scope modules, as train.compile, or step, the whole loss module; options a "
        "torch.compile mode such as reduce-overhead; math-bf16: math attention in bfloat16; math-off: the "
        "math attention backend disabled (a fused kernel, or an error saying why none fits); mask-additive, "
        "mask-broadcast, mask-contiguous: the form of BERT's key padding mask (ddp_bench.use_text_mask); "
        "eager-attention-text, -image, -all: the text encoder's, the image encoder's or every encoder's "
        "attention outside the compiled graph (ddp_bench.attention_outside_compile); widths-32-40: batches "
        "of caption widths 32 and 40 in turn (a symbolic width, a CUDA graph per width); static: no "
        "automatic dynamic shapes (a frame recompiled per size, never symbolic); compiled-optimizer: "
        "clipping, AdamW and "
        "the bf16 copy as one compiled function (ddp_bench.CompiledOptimizerSide)); "
        "H100 figures: amp_bf16:modules 15.30 steps/s (run 1), bf16:step:reduce-overhead 17.23 (run 3)",
    )
    parser.add_argument(
        "--compile-parallel",
        type=int,
        default=5,
        help="train_compile: at most this many variants compiling at once (then timed one at a time), and "
        "no more than the free device memory holds at --compile-variant-gb each nor than the CPUs",
    )
    parser.add_argument(
        "--compile-variant-gb",
        type=float,
        default=20.0,
        help="train_compile: device memory a compiling variant may take (ViT-B/16 + BERT-base, batch 64: "
        "~12 GB at its peak in run 3, plus the warm-up's cache and the CUDA graphs' pool)",
    )
    parser.add_argument(
        "--profile-precision",
        default="bf16",
        choices=["amp_bf16", "bf16"],
        help="the train_profile step's precision",
    )
    parser.add_argument(
        "--host-shapes",
        default="f30k,coco5k",
        help="the scoring shapes also timed with the inputs given from the host (the upload timed too)",
    )
    parser.add_argument("--demo-steps", type=int, default=50, help="the demo's train.max_steps")
    parser.add_argument("--demo-timeout-s", type=float, default=240.0)
    args = parser.parse_args(argv)
    unknown = set(args.steps.split(",")) - set(STEPS)
    if unknown:
        parser.error(f"unknown steps {sorted(unknown)}; choose from {', '.join(STEPS)}")
    import gpu_check_extra

    try:
        gpu_check_extra.parse_compile_variants(args.compile_variants)
    except ValueError as err:
        parser.error(f"--compile-variants: {err}")
    if args.compile_parallel < 1:
        parser.error(f"--compile-parallel must be >= 1, got {args.compile_parallel}")
    chosen = [name for name in args.steps.split(",") if name]  # in the order given
    budget = Budget(args.budget_s, chosen)
    report = Report(Path(args.out), args)
    say(f"gpu-check: {args.device}, budget {args.budget_s:.0f} s, results in {Path(args.out).resolve()}")
    for name in chosen:
        step = STEPS[name]
        if name != "train_compile":  # nothing runs beside a step but train_compile's compilation
            gpu_check_extra.finish_background()
        if budget.left() < MIN_SECONDS[name]:
            say(f"[{name}] skipped: {budget.left():.0f} s of the budget left, it needs {MIN_SECONDS[name]} s")
            report.record(name, {"status": "skipped", "summary": f"budget: {budget.left():.0f} s left"})
            continue
        say(f"[{name}] ...")
        report.record(name, {"status": "running"})  # what a run killed at the wall-clock limit was doing
        start = time.perf_counter()

        def partial(entry: dict, name: str = name) -> None:
            report.record(name, {"status": "running", **entry})

        try:
            entry = step(args, budget, partial)
            entry.setdefault("status", "ok")
        except Exception as err:  # noqa: BLE001 - one step's failure is a result; the next step still runs
            tb = traceback.format_exc()
            say(tb.rstrip())
            entry = {"status": "error", "error": f"{type(err).__name__}: {err}"[:500], "traceback": tb}
        entry["wall_s"] = round(time.perf_counter() - start, 1)
        said = entry.get("summary", entry.get("error", ""))
        say(f"[{name}] {entry['status']} ({entry['wall_s']} s): {said}")
        report.record(name, entry)
        _free_memory()
    gpu_check_extra.finish_background()  # a probe left running when train_compile did not run
    say(f"gpu-check done in {budget.total_s - budget.left():.0f} s: {Path(args.out) / 'gpu_check.md'}")
    failed = [name for name in chosen if report.data["steps"].get(name, {}).get("status") == "error"]
    if failed:  # every step ran; the exit code still says that one broke (a CPU smoke run must notice)
        say(f"gpu-check: step(s) with an error: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
