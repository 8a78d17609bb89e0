"""Steps of ``benchmarks/gpu_check.py`` beyond the default run (``--steps ...`` names them), each called as
``step_NAME(args, budget, partial, say, child_env)``:

* ``tf32``: exhaustive scoring in float32 and with ``precision="tf32"`` (the alignment products on TF32
  tensor cores, the patch ranking in float32) at the Flickr30K and COCO-5K shapes, image- and caption-tied
  SEPS: time of each, the largest score difference and how many caption queries change their top image.
* ``eval_tf32``: ``patchword eval`` of a trained run (``--eval-run``, carried to the machine) with
  ``eval.precision=fp32`` and ``tf32``: the recalls of both.
* ``train_profile``: ``torch.profiler`` over a few training steps (ViT-B/16 + BERT-base, batch 64): host
  wall and device busy time per step, kernel launches, host syncs, the top ops.
* ``train_compile``: training steps/s with ``torch.compile``, one child process per ``--compile-variants``
  item, several compiling at once and timed one at a time (:mod:`gpu_compile_variants`), killed at the
  budget (compilation can take minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpu_compile_variants import (
    TURN_RESERVE_S,
    parse_compile_variants,
    run_variants,
    variant_command,
    variant_label,
)

ROOT = Path(__file__).resolve().parents[1]

#: (config, shape, precisions) in the order they run: cheap shapes first, the caption-tied COCO case (the
#: one above 60 s in float32) before the image-tied one.
TF32_CASES = [
    ("seps-code-caption", "f30k", ("fp32", "tf32")),
    ("seps-code-image", "f30k", ("fp32", "tf32")),
    ("seps-code-caption", "coco5k", ("tf32", "fp32")),
    ("seps-code-image", "coco5k", ("tf32", "fp32")),
]


def step_tf32(args, budget, partial, say, child_env) -> dict:
    import torch

    from patchword.bench import inputs as bench
    from patchword.eval import score_matrix

    device = torch.device(args.device)
    shapes = dict(bench.SCORING_SHAPES)
    if args.quick:
        shapes = {"f30k": (16, 80), "coco5k": (40, 200)}
    cap_lens, dense_lens = bench.stand_in_lengths()
    rows: list[dict] = []
    per_pair: dict[str, float] = {}
    made: dict[str, tuple] = {}  # shape -> host inputs, generated once
    for config, shape, precisions in TF32_CASES:
        n_img, n_txt = shapes[shape]
        if shape not in made:
            made.clear()  # one shape's inputs at a time in host memory
            reps = (n_img + dense_lens.numel() - 1) // dense_lens.numel()
            made[shape] = bench.scoring_inputs(n_img, cap_lens.repeat(reps), dense_lens.repeat(reps))
        img, caps, lens, dense, dlens, t2i = made[shape]
        given = [t.to(device) for t in (img, caps[:n_txt], lens[:n_txt], dense, dlens)]
        matcher = bench.build_bench_matcher(config).to(device)
        txt2img = t2i[:n_txt] if matcher.dense_pairing == "caption" else None
        sims = {}
        for precision in precisions:
            key = f"{config}/{precision}"
            need = 1.3 * per_pair.get(key, per_pair.get(f"{config}/fp32", 0.0)) * n_img * n_txt
            if need > budget.free("tf32"):
                say(f"tf32 {config} {shape} {precision}: skipped, ~{need:.0f} s needed")
                rows.append({"config": config, "shape": shape, "precision": precision, "status": "skipped"})
                continue
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            sims[precision] = score_matrix(
                matcher, *given, txt2img=txt2img, device=device, precision=precision
            )
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds = time.perf_counter() - start
            per_pair[key] = seconds / (n_img * n_txt)
            row = {"config": config, "shape": shape, "precision": precision, "seconds": round(seconds, 2)}
            row["pairs_per_s"] = n_img * n_txt / seconds
            rows.append(row)
            say(f"tf32 {config} {shape} {n_img}x{n_txt} precision={precision}: {seconds:.2f} s")
            partial({"rows": rows})
        if len(sims) == 2:
            diff = (sims["tf32"] - sims["fp32"]).abs()
            top_t2i = (sims["tf32"].argmax(0) != sims["fp32"].argmax(0)).float().mean().item()
            top_i2t = (sims["tf32"].argmax(1) != sims["fp32"].argmax(1)).float().mean().item()
            compared = {"max_abs_diff": diff.max().item(), "mean_abs_diff": diff.mean().item()}
            compared.update(top1_changed_t2i=top_t2i, top1_changed_i2t=top_i2t)
            rows[-1].update(compared)
            say(
                f"tf32 {config} {shape}: max |tf32 - fp32| {compared['max_abs_diff']:.2e} (mean "
                f"{compared['mean_abs_diff']:.1e}); top-1 image changed for {100 * top_t2i:.3f}% of "
                "captions, "
                f"top-1 caption for {100 * top_i2t:.3f}% of images"
            )
            partial({"rows": rows})
        del sims, given
        if device.type == "cuda":
            torch.cuda.empty_cache()
    timed = [r for r in rows if "seconds" in r]
    summary = "; ".join(
        f"{r['config'].removeprefix('seps-code-')} {r['shape']} {r['precision']} {r['seconds']} s"
        for r in timed
    )
    return {"rows": rows, "summary": summary or "nothing measured"}


def step_eval_tf32(args, budget, partial, say, child_env) -> dict:
    if not args.eval_run:
        return {"status": "skipped", "summary": "no --eval-run given"}
    work = Path(tempfile.mkdtemp(prefix="gpu_check_eval_"))
    results = {}
    for precision in ("fp32", "tf32"):
        out = Path(args.out) / f"eval_{precision}.json"
        cmd = [sys.executable, "-m", "patchword", "eval", str(args.eval_run), "--out", str(out), "--force"]
        cmd += [f"device={args.device}", f"eval.precision={precision}", f"data.cache_dir={work / 'cache'}"]
        cmd += ["progress=false"]
        start = time.perf_counter()
        proc = subprocess.run(
            cmd, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=budget.free("eval_tf32")
        )
        seconds = round(time.perf_counter() - start, 1)
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
            return {"status": "failed", "tail": tail, "summary": f"eval {precision}: exit {proc.returncode}"}
        metrics = json.loads(out.read_text())
        keep = ("rsum", "i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10", "eval_precision")
        results[precision] = {k: metrics.get(k) for k in keep} | {"seconds": seconds}
        say(f"eval_tf32 {precision}: rSum {metrics.get('rsum'):.2f} ({seconds} s with start-up and data)")
        partial({"results": results})
    delta = {
        k: results["tf32"][k] - results["fp32"][k]
        for k in results["fp32"]
        if k not in ("precision", "seconds")
    }
    fp32, tf32 = results["fp32"]["rsum"], results["tf32"]["rsum"]
    summary = f"rSum fp32 {fp32:.2f}, tf32 {tf32:.2f} (delta {delta['rsum']:+.2f})"
    return {"results": results, "delta": delta, "summary": summary}


def step_train_profile(args, budget, partial, say, child_env) -> dict:
    import ddp_bench

    model = "seps-tiny-paper" if args.quick else "seps-vit-b16-paper"
    ns = argparse.Namespace(device=args.device, quick=args.quick, model=model, batch=8 if args.quick else 64)
    ns.__dict__.update(precision=args.profile_precision, steps=3, warmup=3, pair_chunk=0, tf32=False)
    ns.__dict__.update(compile=False, sync_debug=False, profile_steps=3, unfused=False)
    with contextlib.redirect_stdout(io.StringIO()):
        row = ddp_bench.gpu_step(ns)
    if "profile" not in row:
        return {"status": "failed", "row": row, "summary": f"profile failed: {row.get('profile_error')}"}
    prof = row.pop("profile")
    tables = prof.pop("tables")
    for key, table in tables.items():
        (Path(args.out) / f"train_profile_{key}.txt").write_text(table)
    say(tables.get("self_device_time_total") or tables.get("self_cpu_time_total", ""))
    summary = (
        f"{row['model']} b{row['batch']} {row['precision']}: wall {prof['wall_ms_per_step']:.1f} ms/step "
        f"profiled, device busy "
        f"{prof['device_busy_ms_per_step']:.1f} ms/step, {prof['kernel_launches_per_step']:.0f} launches, "
        f"{prof['aten_calls_per_step']:.0f} aten calls, {prof['host_syncs_per_step']:.1f} syncs per step; "
        f"ms per step: {kinds_line(prof)}"
    )
    return {"row": row, "profile": prof, "summary": summary}


def kinds_line(profile: dict) -> str:
    """'gemm 21.3, attention 15.1, ...' ms per step, from a gpu-step profile."""
    kinds = profile.get("device_ms_per_step_by_kind", {})
    return ", ".join(f"{kind} {ms:.1f}" for kind, ms in kinds.items())


def busy_line(profile: dict | None) -> str:
    """', device busy 57.0 ms/step (gemm 21.3, ...)' from a gpu-step profile; '' without one."""
    if not (profile or {}).get("device_ms_per_step_by_kind"):  # no profile, or no device kernels
        return ""
    return f", device busy {profile['device_busy_ms_per_step']:.1f} ms/step ({kinds_line(profile)})"


def wave_size(requested: int, free_gb: float | None, variant_gb: float, cpus: int) -> int:
    """How many variants compile at once: ``--compile-parallel``, no more than the free device memory holds
    at ``variant_gb`` each (``free_gb`` None: not counted), and no more than the CPUs (a compilation is
    mostly one Python thread: more processes than CPUs only share them, and each finishes later)."""
    fit = requested if free_gb is None else int(free_gb // variant_gb)
    return max(1, min(requested, fit, cpus))


def step_train_compile(args, budget, partial, say, child_env) -> dict:
    """Steps/s of the compiled training step, one child process per ``--compile-variants`` item, in waves
    of ``--compile-parallel`` that compile at once and are then timed one at a time
    (:mod:`gpu_compile_variants`), while the budget holds."""
    model = "seps-tiny-paper" if args.quick else "seps-vit-b16-paper"
    rows: list[dict] = []
    free_gb = None
    if args.device.startswith("cuda") and not args.quick:  # as many as the free device memory holds
        import torch

        free_gb = torch.cuda.mem_get_info(torch.device(args.device))[0] / 2**30
        free_gb -= PROBE_GB if _BACKGROUND else 0.0  # the attention probe beside them
    parallel = wave_size(args.compile_parallel, free_gb, args.compile_variant_gb, os.cpu_count() or 1)
    memory = "" if free_gb is None else f", {free_gb:.0f} GB free, {args.compile_variant_gb:g} GB each"
    say(f"train_compile: {parallel} variants at once ({os.cpu_count()} CPUs{memory})")

    def command(variant: dict, out: Path) -> list[str]:
        return variant_command(sys.executable, ROOT, variant, args.device, args.quick, out)

    def report(row: dict) -> None:
        label = variant_label(row).replace(":", "_")
        profile = row.pop("profile", None) or {}
        for key, table in profile.pop("tables", {}).items():
            (Path(args.out) / f"train_compile_{label}_{key}.txt").write_text(table)
        if "steps_per_s" in row:
            row["profile"] = profile
        rows.append(row)
        partial({"rows": rows})
        say(f"train_compile {_compiled_line(model, row)}")
        if "tail" in row:
            say("\n".join(row["tail"]))

    def before_turns() -> None:  # the attention probe, if it runs beside the compilation: done, or stopped
        finish_background(limit_s=max(10.0, budget.free("train_compile") - TURN_RESERVE_S * parallel))

    try:
        run_variants(
            parse_compile_variants(args.compile_variants),
            command,
            child_env(),
            ROOT,
            Path(args.out),
            parallel,
            lambda: budget.free("train_compile"),
            report,
            before_turns=before_turns,
        )
    finally:
        finish_background(limit_s=10.0)  # a wave that never reached its turns
    summary = "; ".join(_compiled_line(model, r) for r in rows)
    failed = [r for r in rows if "tail" in r]
    entry = {"rows": rows, "summary": summary}
    if failed and len(failed) == len(rows):
        entry.update(status="failed", tail=failed[0]["tail"])
    return entry


def _attention_case(row: dict) -> str:
    """What an attention probe row varied: '35 keys, mask additive, dropout 0.1', or 'mask expanded' for a
    whole training step (every key length at once)."""
    parts = [f"{row['keys']} keys"] if "keys" in row else []
    parts += [f"mask {row['mask']}"] if "mask" in row else []
    parts += [f"dropout {row['dropout']}"] if "dropout" in row else []
    parts += [f"widths {row['widths']}"] if "widths" in row else []
    return ", ".join(parts)


def _attention_result(row: dict) -> str:
    if "error" in row:
        return row["error"]
    if row["case"] in ("setting", "memory"):  # versions, backends and their order; the device memory
        return ", ".join(f"{k} {row[k]}" for k in row if k != "case")
    return ", ".join(f"{k} {row[k]}" for k in ("eager", "compiled") if k in row)


#: device memory the attention probe may take beside the compiling variants (the benchmark model on the
#: device; its traces run the step's forward at batch 64, as the eager bf16 step's 10.3 GB peak bounds)
PROBE_GB = 10.0

#: work started in the background (the attention probe beside train_compile's compilation), each a
#: function that waits for it and records its result: see :func:`finish_background`
_BACKGROUND: list = []


def finish_background(limit_s: float | None = None) -> None:
    """Wait for what runs in the background (at most ``limit_s`` seconds each, then stop it) and record
    it: before any other step, before train_compile's first timed step, and at the end."""
    while _BACKGROUND:
        _BACKGROUND.pop(0)(limit_s)


def step_attention(args, budget, partial, say, child_env) -> dict:
    """``attention_probe.py``: the attention backend of every probed case, eager and compiled. Its output,
    with the backends' C++ warnings in order (the reasons a fused kernel is refused may be printed there
    rather than raised as Python warnings), goes to ``attention_log.txt``; at most 180 s. When
    ``train_compile`` is the next step, the probe (which times nothing) runs in the background beside
    the variants' compilation, at most 300 s, and is waited for before their first timed step."""
    out, log = Path(args.out) / "attention.json", Path(args.out) / "attention_log.txt"
    out.unlink(missing_ok=True)  # rows of an earlier run in the same folder are not this run's
    cmd = [sys.executable, str(ROOT / "benchmarks" / "attention_probe.py"), "--device", args.device]
    cmd += ["--json", str(out)] + (["--quick"] if args.quick else [])
    chosen = [name for name in args.steps.split(",") if name]
    after = chosen.index("attention") + 1
    if chosen[after : after + 1] == ["train_compile"]:
        start, handle = time.perf_counter(), log.open("w")
        try:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=child_env(), stdout=handle, stderr=subprocess.STDOUT)
        except OSError:
            handle.close()
            raise
        deadline = start + min(budget.left(), 300.0)

        def finish(limit_s: float | None) -> None:
            wait = deadline - time.perf_counter()
            try:
                proc.wait(timeout=max(1.0, wait if limit_s is None else min(wait, limit_s)))
                status = None if proc.returncode == 0 else f"exit {proc.returncode}"
            except subprocess.TimeoutExpired:  # what it found so far is in its rows
                proc.kill()
                proc.wait()
                status = f"stopped after {time.perf_counter() - start:.0f} s"
            finally:
                handle.close()
            try:
                entry = _attention_entry(out, log, status, say)
                entry.setdefault("status", "ok")
            except Exception as err:  # noqa: BLE001 - the probe's result is lost, the variants are not
                entry = {"status": "error", "error": f"{type(err).__name__}: {err}"[:500], "summary": ""}
            entry["wall_s"] = round(time.perf_counter() - start, 1)
            partial(entry)  # over the "running" entry the step returned
            took = f"{entry['wall_s']} s, beside the compilation"
            say(f"[attention] {entry['status']} ({took}): {entry.get('summary') or entry.get('error')}")

        _BACKGROUND.append(finish)
        return {"status": "running", "summary": "in the background, beside train_compile's compilation"}
    timeout = min(budget.free("attention"), 180.0)
    try:
        proc = subprocess.run(
            cmd,
            cwd=ROOT,
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
        )
        log.write_text(proc.stdout)
        status = None if proc.returncode == 0 else f"exit {proc.returncode}"
    except subprocess.TimeoutExpired as err:
        log.write_text(err.stdout.decode() if isinstance(err.stdout, bytes) else (err.stdout or ""))
        status = f"timed out after {timeout:.0f} s"
    return _attention_entry(out, log, status, say)


def _attention_entry(out: Path, log: Path, status: str | None, say) -> dict:
    """The attention step's entry from the probe's rows (``out``) and output (``log``); ``status`` says
    why the probe did not finish, None when it did."""
    rows = json.loads(out.read_text()) if out.exists() else []
    for row in rows:  # one short line each; the reasons are in attention.json and attention_log.txt
        label = ", ".join(filter(None, (row["case"], _attention_case(row))))
        say(f"attention {label}: {_attention_result(row)}")
    math = [r for r in rows if r["case"] == "sdpa" and r.get("compiled") == "math"]
    encoders = "; ".join(
        f"{r['case']} {_attention_case(r)}: {r.get('error') or r.get('compiled')}"
        for r in rows
        if r["case"] not in ("sdpa", "setting", "memory")
    )
    summary = (
        f"{len(math)} of {sum(r['case'] == 'sdpa' for r in rows)} attention cases compile to math; {encoders}"
    )
    setting = next((r for r in rows if r["case"] == "setting"), None)
    if setting:  # the versions and the order the choices above were made under
        summary = f"{_attention_result(setting)}; {summary}"
    memory = next((r for r in rows if r["case"] == "memory"), None)
    if memory:
        summary += f"; device memory reserved at most {memory['peak_reserved_gb']} GB"
    entry = {"rows": rows, "summary": summary if not status else f"{status}; {summary}"}
    if status:
        entry.update(status="failed", tail=log.read_text().strip().splitlines()[-15:])
    return entry


def _compiled_line(model: str, r: dict) -> str:
    """One compile variant's result in a line: steps/s, seconds and device time, or its status."""
    if "steps_per_s" not in r:
        return f"{variant_label(r)}: {r['status']}"
    counts = r.get("compile_counts") or {}
    graphs = (
        f", {counts['unique_graphs']} graphs, {counts['graph_breaks']} breaks, "
        f"{counts['cudagraph_skips']} kept off CUDA graphs"
        if counts
        else ""
    )
    together = r.get("compiling_at_once", 1)
    # a variant stopped during its profile keeps the steps/s it wrote before it, without "seconds"
    seconds = f"; {r['seconds']} s with the timed steps and the profile" if "seconds" in r else ""
    reserved = r.get("warmup_peak_reserved_gb")
    memory = f", {reserved:.1f} GB of device memory reserved at most" if reserved is not None else ""
    status = f" [{r['status']}]" if r.get("status") else ""
    return (
        f"{model} b{r['batch']} {variant_label(r)}: {r['steps_per_s']:.2f} steps/s{status} "
        f"(compiled and warm in {r['ready_s']} s, {together} compiling at once{seconds}{graphs}{memory})"
        f"{busy_line(r.get('profile'))}"
    )
