"""Bytes the compiled training step's kernels move, by forward / backward pass, part of the model and kind
of kernel, as Inductor counts them when it compiles the step (issue 34: what bounds the step besides its
products).

Why: on an H100 the whole bfloat16 step compiled with CUDA graphs (``gpu-step --compile --compile-scope
step --compile-mode reduce-overhead``) keeps the GPU busy ~57 ms: ~21 ms of bf16 products, ~12.8 ms of
float32 math attention, and ~23 ms of everything else (docs/benchmarks.md, run 3). The kernels Inductor
generates for that "everything else" (element-wise work, norms, reductions, dropout) are bound by memory
bandwidth, so the bytes they move bound their time from below. This script compiles the same step with
Inductor on the CPU (caches off, so that every graph is lowered here) and records, for every scheduled
kernel, the bytes Inductor's own metrics count for it (``get_read_write_buffers_sizes``, as
``GraphLowering.count_bytes`` sums them: each buffer read or written once, the best case) and the module
its ops come from (a private Inductor API: checked with torch 2.13). Inductor fuses for the CPU's
C++ kernels, not for Triton's, so the split is a model of the GPU's, not a measurement of it; library
calls (products, attention) are listed apart and their bytes are not their cost. The CPU runs BERT's
attention (dropout 0.1) as the decomposed math attention; on a GPU it is one fused kernel, so it is
listed apart as well.

    .venv/bin/python benchmarks/compiled_step_bytes.py --batch 64 --json step_bytes.json

About 2 minutes for seps-vit-b16-paper at batch 64 on the 2-core AMD EPYC (111 s, compilation included).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT / "src", ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

#: the H100 SXM's HBM3 bandwidth, bytes/s (its peak: the modelled times are lower bounds)
H100_BANDWIDTH = 3.35e12
#: library calls that are products (their time is set by their FLOPs)
PRODUCTS = ("mm", "addmm", "bmm", "baddbmm", "_int_mm")


def part_of(module_path: str) -> str:
    """The part of the model a module path names: image encoder, text encoder, matcher, or the rest."""
    for needle, part in (("image_encoder", "image encoder"), ("text_encoder", "text encoder")):
        if needle in module_path:
            return part
    return "matcher" if "matcher" in module_path else "loss and rest"


def _module_path(scheduler_node) -> str:
    """The most common innermost module of the ops a scheduled kernel computes ('?' when none is known)."""
    paths: Counter = Counter()
    for sub in scheduler_node.get_nodes():
        for origin in getattr(getattr(sub, "node", None), "origins", None) or ():
            stack = origin.meta.get("nn_module_stack") or origin.meta.get("fwd_nn_module_stack") or {}
            names = [v[0] if isinstance(v, tuple) else str(v) for v in stack.values()]
            paths[names[-1] if names else "?"] += 1
    return paths.most_common(1)[0][0] if paths else "?"


def kernel_rows(graph) -> list[dict]:
    """One row per scheduled kernel of a lowered graph: kind, library op (if a call), module, bytes."""
    from torch._inductor import scheduler as sched

    rows = []
    for node in graph.scheduler.nodes:
        if isinstance(node, sched.NopKernelSchedulerNode):
            continue
        op = ""
        if isinstance(node, sched.ExternKernelSchedulerNode):
            target = getattr(node.node, "op_overload", None) or getattr(node.node, "python_kernel_name", "")
            op = str(target).removeprefix("aten.").split(".")[0] or type(node.node).__name__
        rows.append(
            {"op": op, "module": _module_path(node), "bytes": int(node.get_read_write_buffers_sizes())}
        )
    return rows


def classify(row: dict) -> str:
    """'products', 'attention' (the attention kernels, and BERT's math attention on the CPU) or
    'generated' (Inductor's own kernels), for a :func:`kernel_rows` row."""
    in_attention = row["module"].endswith(("attention.self", "self_attn")) or "attention" in row["op"]
    if row["op"] in PRODUCTS:
        return "attention" if in_attention and row["op"] in ("bmm", "baddbmm") else "products"
    if in_attention and row["op"] != "addmm":
        return "attention"
    return "generated" if not row["op"] else "other calls"


def count(batch: int, model: str) -> list[dict]:
    """Compile the bfloat16 step (``gpu-step --compile --compile-scope step`` at ``batch``), run it once
    forward and backward, and return one entry per lowered graph with its kernel rows."""
    import ddp_bench
    import torch
    from torch._inductor.graph import GraphLowering

    torch._inductor.config.fx_graph_cache = False  # a cached graph is not lowered, so not counted
    torch._functorch.config.enable_autograd_cache = False
    graphs: list[dict] = []  # in compilation order, each named by its pass
    original = GraphLowering.codegen

    def codegen(self, *args, **kwargs):  # the scheduler exists once code generation has run
        out = original(self, *args, **kwargs)
        graphs.append({"graph": "backward" if self.is_backward else "forward", "kernels": kernel_rows(self)})
        return out

    setting = argparse.Namespace(device="cpu", quick=False, model=model, batch=batch, unfused=False)
    setting.__dict__.update(precision="bf16", pair_chunk=0, compile=True, compile_scope="step")
    setting.__dict__.update(compile_mode=None, text_mask="default")
    GraphLowering.codegen = codegen
    try:
        _, _, step_module, _, shard, _ = ddp_bench.step_setup(setting)
        loss, _ = step_module(shard, True, False, 1.0)
        loss.backward()
    finally:
        GraphLowering.codegen = original
    return graphs


def summary(graphs: list[dict]) -> list[dict]:
    """GB per (graph, kind, part), and the modelled time of the generated kernels at the H100's peak."""
    out = []
    for graph in graphs:
        totals: Counter = Counter()
        kernels: Counter = Counter()
        for row in graph["kernels"]:
            key = (classify(row), part_of(row["module"]))
            totals[key] += row["bytes"]
            kernels[key] += 1
        for (kind, part), size in sorted(totals.items()):
            entry = {"graph": graph["graph"], "kind": kind, "part": part, "kernels": kernels[kind, part]}
            entry["gb"] = round(size / 1e9, 2)
            if kind == "generated":
                entry["ms_at_h100_peak"] = round(size / H100_BANDWIDTH * 1e3, 2)
            out.append(entry)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--model", default="seps-vit-b16-paper")
    parser.add_argument("--json", default=None, help="also write the summary and every kernel's row here")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    graphs = count(args.batch, args.model)
    rows = summary(graphs)
    for row in rows:
        print(json.dumps(row), flush=True)
    generated = sum(r["gb"] for r in rows if r["kind"] == "generated")
    print(
        f"{args.model} batch {args.batch}: generated kernels move {generated:.1f} GB per step, "
        f"{generated * 1e9 / H100_BANDWIDTH * 1e3:.1f} ms at the H100's peak bandwidth; "
        f"{time.perf_counter() - start:.0f} s",
        flush=True,
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": rows, "graphs": graphs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
