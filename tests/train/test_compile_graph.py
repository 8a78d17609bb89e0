"""``train.compile=true`` on a GPU: the training step of the patch-token families (SEPS, LAPS, VSE, CLIP,
FILIP; tiny encoders and Hugging Face BERT + ViT) traces into one graph, without a break. A break costs a
return to Python and the fusion across it on every step; checked with ``torch._dynamo.explain`` on the
CPU, where the tracing is the same. (The region families break where they read lengths on the host: the
GRU's ``pack_padded_sequence``, SCAN's and NAAF's chunk widths, one read of the lengths per forward:
docs/distributed.md.)"""

from __future__ import annotations

import pytest
import torch

from conftest import TINY_RUN_32, tiny_hf_laps_overrides
from patchword.config import apply_overrides
from patchword.runs.config import RunConfig

pytestmark = pytest.mark.usefixtures("one_thread")

PATCH_FAMILIES = {
    "seps_paper": ["model.seps.variant=paper"],
    "seps_code_caption": ["model.seps.variant=code", "model.seps.dense_pairing=caption"],
    "laps": ["model.matcher=laps"],
    "vse": ["model.matcher=vse"],
    "clip_infonce": ["model.matcher=clip", "train.loss=infonce"],
    "filip": ["model.matcher=filip", "train.loss=infonce"],
}


def _trainer_and_batches(overrides: list[str], tmp_path):
    """The trainer of a run with ``overrides`` (its model in training mode) and its first epoch's
    batches."""
    from patchword.train.runner import _build
    from patchword.train.trainer import Trainer

    cfg = apply_overrides(RunConfig(), [*overrides, f"data.cache_dir={tmp_path / 'cache'}"])
    data, model = _build(cfg, None)
    trainer = Trainer(
        cfg, model, data.splits["train"], data.splits["dev"], tmp_path, tokenizer=data.tokenizer
    )
    batches = list(trainer._loader(trainer._epoch_batches(0)))
    trainer.loss.model.train()
    return trainer, batches


def _breaks(overrides: list[str], tmp_path) -> tuple[int, int, list[str]]:
    """(graphs, graph breaks, reasons) of the traced loss of the first training batch (ShardLoss forward,
    hardest negatives, the alignment loss at full weight)."""
    trainer, batches = _trainer_and_batches(overrides, tmp_path)
    batch = batches[0]
    torch._dynamo.reset()
    try:
        explained = torch._dynamo.explain(lambda b: trainer.loss(b, True, False, 1.0))(batch)
    finally:
        torch._dynamo.reset()
    reasons = [f"{b.reason} at {b.user_stack[-1] if b.user_stack else '?'}" for b in explained.break_reasons]
    return explained.graph_count, explained.graph_break_count, reasons


@pytest.mark.parametrize("family", list(PATCH_FAMILIES))
def test_the_training_step_of_a_patch_family_traces_into_one_graph(family, tmp_path):
    graphs, breaks, reasons = _breaks([*TINY_RUN_32, *PATCH_FAMILIES[family]], tmp_path)
    assert (graphs, breaks) == (1, 0), reasons


def test_the_training_step_of_hugging_face_backbones_traces_into_one_graph(tiny_hf, laps_dataset, tmp_path):
    graphs, breaks, reasons = _breaks(tiny_hf_laps_overrides(tiny_hf, laps_dataset, tmp_path), tmp_path)
    assert (graphs, breaks) == (1, 0), reasons


def test_an_epoch_of_varying_batch_shapes_compiles_once_per_varying_dimension(tmp_path):
    """Batches differ in caption length and the last one in size: torch.compile then traces the first
    batch, once more with the length dynamic and once more with the batch size dynamic, and never again
    (a recompilation per batch would cost minutes per step on a GPU), without a graph break."""
    trainer, batches = _trainer_and_batches([*TINY_RUN_32, "model.seps.variant=paper"], tmp_path)
    widths = {b.ids.shape[1] for b in batches}
    sizes = {b.ids.shape[0] for b in batches}
    assert len(batches) >= 5 and len(widths) >= 3 and len(sizes) == 2  # what the test is about
    graphs = []

    def counting_backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    try:
        step = torch.compile(lambda b: trainer.loss(b, True, False, 1.0), backend=counting_backend)
        for batch in batches:
            step(batch)
        breaks = dict(torch._dynamo.utils.counters["graph_break"])
    finally:
        torch._dynamo.reset()
    assert len(graphs) == 3, f"{len(graphs)} graphs for {len(batches)} batches"
    assert breaks == {}


def _count_compiled_graphs(monkeypatch) -> list:
    """Make ``torch.compile`` (as the trainer calls it) trace without generating code; the returned list
    fills with the graphs it compiles."""
    graphs = []
    original = torch.compile

    def counting_compile(fn, **kwargs):
        kwargs.pop("mode", None)

        def backend(graph_module, example_inputs):
            graphs.append(graph_module)
            return graph_module.forward

        return original(fn, **{**kwargs, "backend": backend})

    monkeypatch.setattr(torch, "compile", counting_compile)
    return graphs


def test_the_alignment_warm_up_does_not_recompile_the_compiled_step(tmp_path, monkeypatch):
    """The alignment loss's weight grows at every step of the first epoch. Compiled, it reaches the step as
    a 0-d tensor on the device, so one batch shape compiles once, not again for the changing weight (a
    Python float recompiles, then enters the graph as a host scalar, which keeps that graph, the one
    every later step reuses, from being replayed as CUDA graphs)."""
    graphs = _count_compiled_graphs(monkeypatch)
    step = ["train.compile=true", "train.compile_scope=step", "model.seps.variant=code"]
    trainer, batches = _trainer_and_batches([*TINY_RUN_32, *step], tmp_path)
    torch._dynamo.reset()
    scales = []
    try:
        for i in range(4):  # one batch, four steps of the warm-up
            trainer.batch_in_epoch = i
            scales.append(float(trainer._align_scale(len(batches))))
            trainer._train_step(batches[0], len(batches))
            trainer.step += 1
    finally:
        torch._dynamo.reset()
    assert len(set(scales)) == 4 and scales[0] == 0.0  # the weight did change
    assert len(graphs) == 1


def test_the_compiled_step_of_hugging_face_backbones_compiles_once(
    tiny_hf, laps_dataset, tmp_path, monkeypatch
):
    """The fused query/key/value projections keep their shared product in a thread-local. Were it unset
    until a first call set it, the compiled step would guard on its absence and compile a second time at
    the second step: a second compilation of the whole ViT-B/16 + BERT-base step on an H100 machine."""
    graphs = _count_compiled_graphs(monkeypatch)
    step = ["train.compile=true", "train.compile_scope=step"]
    trainer, batches = _trainer_and_batches(
        [*tiny_hf_laps_overrides(tiny_hf, laps_dataset, tmp_path), *step], tmp_path
    )
    torch._dynamo.reset()
    try:
        for _ in range(3):  # one batch, three steps, forward and backward
            trainer._train_step(batches[0], len(batches))
            trainer.step += 1
    finally:
        torch._dynamo.reset()
    assert len(graphs) == 1


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp64"])
def test_the_compiled_steps_warm_up_weight_gives_the_uncompiled_steps_losses(
    precision, tmp_path, monkeypatch
):
    """Compiled, the alignment loss's warm-up weight is a 0-d tensor (one entry of the epoch's schedule)
    where the uncompiled step multiplies by a Python float. The losses must not differ for it: not in
    dtype (a float32 0-d tensor times a bfloat16 0-d loss promotes the loss to float32) and not in value
    (a float32 schedule rounds the weight an fp64 run uses). The step runs uncompiled in both trainers
    here, so that only the weight's form differs."""
    monkeypatch.setattr(torch, "compile", lambda fn=None, **kwargs: fn)
    base = [*TINY_RUN_32, "model.seps.variant=code", f"precision={precision}"]
    plain, batches = _trainer_and_batches(base, tmp_path / "plain")
    compiled, _ = _trainer_and_batches(
        [*base, "train.compile=true", "train.compile_scope=step"], tmp_path / "c"
    )
    compiled.loss.load_state_dict(plain.loss.state_dict())
    for i in (1, 2, 3):  # weights 1/3 of the way through the first epoch's warm-up: not exact in binary
        plain.batch_in_epoch = compiled.batch_in_epoch = i
        weight, entry = plain._align_scale(len(batches)), compiled._align_scale(len(batches))
        assert isinstance(weight, float) and isinstance(entry, torch.Tensor) and 0 < weight < 1
        with torch.no_grad():
            loss, stats = plain.loss(batches[0], True, False, weight)
            loss_c, stats_c = compiled.loss(batches[0], True, False, entry)
        assert loss_c.dtype == loss.dtype and stats_c.dtype == stats.dtype
        assert torch.equal(stats_c, stats), (stats_c - stats).abs().max()


@pytest.mark.parametrize("mode", ["reduce-overhead", "default"])
def test_a_compiled_graph_run_without_the_cuda_graphs_asked_for_is_warned_about(
    mode, tmp_path, monkeypatch, caplog
):
    """PyTorch runs a graph it cannot capture without CUDA graphs and says so only in a log that is off by
    default; the trainer warns when its count grows (here a stand-in compile that counts one such graph
    when it compiles, as Inductor does on the CPU: ``the device is cpu``): once for that graph over three
    steps, and not for a mode that asked for none."""
    from torch._dynamo.utils import counters

    def counting_compile(fn=None, **kwargs):
        compiled = []

        def run(*args, **kw):
            if not compiled:  # compiled at the first call, as torch.compile does
                compiled.append(True)
                counters["inductor"]["cudagraph_skips"] += 1
            return fn(*args, **kw)

        return run

    monkeypatch.setattr(torch, "compile", counting_compile)
    step = ["train.compile=true", "train.compile_scope=step", f"train.compile_mode={mode}"]
    trainer, batches = _trainer_and_batches([*TINY_RUN_32, *step], tmp_path)
    with caplog.at_level("WARNING", logger="patchword.train.cuda_graphs"):
        for i in range(3):
            trainer.batch_in_epoch = i
            trainer._train_step(batches[0], len(batches))
            trainer.step += 1
    said = [r.getMessage() for r in caplog.records if "without CUDA graphs" in r.getMessage()]
    if mode == "default":
        assert said == []
    else:
        assert said == [
            "train.compile_mode=reduce-overhead: 1 more compiled graph(s) run without CUDA graphs (same "
            "results, more host time per step); the device is cpu, which has none"
        ]
