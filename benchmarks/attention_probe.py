"""Which kernel ``scaled_dot_product_attention`` runs for the encoders' shapes, eagerly and traced by
``torch.compile`` (``make gpu-check`` step ``attention``; alone: ``python benchmarks/attention_probe.py``).

Why: on an H100 (docs/benchmarks.md, gpu-check run 3) the compiled bfloat16 training step ran 12 of its
36 attention layers (one BERT-base pass) as the decomposed float32 "math" attention (two float32 batched
products and a softmax per layer, ~12 ms of its 59 ms), where eager mode ran cuDNN attention for all 36.
Padding the captions' keys to 48 did not change it. This probe records the backend for each candidate
cause, in seconds and without timing anything: the key length (35 captions, 48, 64, 128 dense captions),
attention dropout (:data:`DROPOUTS`), the form of the mask (:data:`MASKS`: the encoder's
(B, 1, L, L) boolean view and the alternatives a fix could pass), and with the math backend disallowed
(``sdpa_kernel``). Eagerly the choice is
``torch._fused_sdp_choice``; compiled, the attention ops of the forward graph AOTAutograd traces (no
Inductor code generation, so each case takes about a second). Last, the benchmark model's encoders
(ViT-B/16, BERT-base at both caption lengths) as the bfloat16 training step runs them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

#: aten attention ops of a traced graph -> the backend they are
_TRACED = {
    "_scaled_dot_product_cudnn_attention": "cudnn",
    "_scaled_dot_product_flash_attention_for_cpu": "flash (cpu)",
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_efficient_attention": "efficient",
    "_safe_softmax": "math",
}


def traced_backends(fn, *inputs) -> list[str]:
    """The attention backends, in order, of the forward graph ``torch.compile`` traces for ``fn(*inputs)``
    (AOTAutograd's aten graph; nothing is generated or run compiled beyond it)."""
    return [layer.split("@")[0] for layer in traced_layers(fn, *inputs)]


def traced_layers(fn, *inputs, fullgraph: bool = True) -> list[str]:
    """One ``"backend@keys"`` per attention layer, in order, of the forward graphs ``torch.compile`` traces
    for ``fn(*inputs)`` (AOTAutograd's aten graphs; nothing is generated or run compiled beyond them): a
    fused op's key length from its key's shape, the math attention's from its softmax's input, so that
    layers of different passes (35-token captions, 128-token dense captions) can be told apart."""
    import torch
    from torch._dynamo.backends.common import aot_autograd

    seen: list[str] = []

    def record(graph_module, example_inputs):
        for node in graph_module.graph.nodes:
            name = str(node.target).removeprefix("aten.").split(".")[0]
            if node.op != "call_function" or name not in _TRACED:
                continue
            shaped = node.args[1] if name != "_safe_softmax" else node.args[0]
            value = shaped.meta.get("val") if isinstance(shaped, torch.fx.Node) else None
            seen.append(f"{_TRACED[name]}@{value.shape[-2] if name != '_safe_softmax' else value.shape[-1]}")
        return graph_module.forward

    torch._dynamo.reset()
    try:
        torch.compile(fn, backend=aot_autograd(fw_compiler=record), fullgraph=fullgraph)(*inputs)
    finally:
        torch._dynamo.reset()
    return seen


def dynamo_attention_calls(fn, *inputs) -> list[dict]:
    """Every ``F.scaled_dot_product_attention`` call in the graphs Dynamo captures for ``fn(*inputs)``, in
    order: its arguments as the trace holds them (fake tensors: shapes, strides, offsets, dtype, whether
    they require gradients), the backend ``torch._fused_sdp_choice`` picks for them, and where that is not
    a fused one, the fused backends' reasons (:func:`fused_checks`). On CUDA this is the choice
    AOTAutograd makes when it traces the call (the fake-tensor implementation of ``_fused_sdp_choice`` asks
    the CUDA checks), asked directly, so the reason is the one the compiled step met; on the CPU that
    implementation answers math while the trace asks the CPU's own checks (:func:`traced_layers` says
    what the trace chose there)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend

    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    calls: list[dict] = []

    def value(arg):  # graph nodes -> the fake tensors (or constants) Dynamo traced them as
        return torch.fx.node.map_arg(arg, lambda node: node.meta.get("example_value"))

    def record(graph_module, example_inputs):
        for node in graph_module.graph.nodes:
            if node.op != "call_function" or node.target is not F.scaled_dot_product_attention:
                continue

            given = dict(zip(names, value(node.args), strict=False)) | value(dict(node.kwargs))
            q, k, v, mask = (given.get(n) for n in names[:4])
            dropout, causal = float(given.get("dropout_p") or 0.0), bool(given.get("is_causal") or False)
            call = {
                "keys": _size(k.shape[-2]),
                "q": describe(q) | {"requires_grad": q.requires_grad},
                "k": describe(k),
                "v": describe(v),
                "mask": None if mask is None else describe(mask) | {"requires_grad": mask.requires_grad},
                "dropout": dropout,
                "is_causal": causal,
                "scale": given.get("scale"),
            }
            try:
                choice = torch._fused_sdp_choice(
                    q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal, scale=given.get("scale")
                )
                call["backend"] = SDPBackend(choice).name.lower()
            except Exception as err:  # noqa: BLE001 - the error is the result
                call["backend"] = f"error: {type(err).__name__}: {' '.join(str(err).split())[:300]}"
            if not call["backend"].endswith("attention"):  # math, or an error
                call["fused"] = fused_checks(q, k, v, mask, dropout, fake=False)
            calls.append(call)
        return graph_module.forward

    torch._dynamo.reset()
    try:
        torch.compile(fn, backend=record)(*inputs)
    finally:
        torch._dynamo.reset()
    return calls


def eager_backends(fn, *inputs) -> list[str]:
    """The attention backends, in order, that running ``fn(*inputs)`` eagerly dispatches."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: list[str] = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.__name__.split(".")[0]
            if name in _TRACED:
                seen.append(_TRACED[name])
            return func(*args, **(kwargs or {}))

    with Record():
        fn(*inputs)
    return seen


def first_attention_call(fn, *inputs) -> dict:
    """The arguments of the first ``F.scaled_dot_product_attention`` call of ``fn(*inputs)`` run
    eagerly (q, k, v, attn_mask, dropout_p), as the encoder passes them."""
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    calls: list[dict] = []

    class Capture(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is F.scaled_dot_product_attention and not calls:
                names = ("query", "key", "value", "attn_mask", "dropout_p")
                given = dict(zip(names, args, strict=False)) | kwargs
                calls.append({name: given.get(name) for name in names})
            return func(*args, **kwargs)

    with Capture():  # with gradients: the training forward (fused q/k/v share one product there)
        fn(*inputs)
    return calls[0] if calls else {}


def _size(value) -> int | str:
    """A size as a number, or a traced symbolic size as its expression (``s0``, ``2304*s0``)."""
    return value if isinstance(value, int) else str(value)


def describe(tensor) -> dict | None:
    """Shape, strides, storage offset and dtype: what the backends' checks read (symbolic sizes, of a
    trace with dynamic shapes, as their expressions)."""
    if tensor is None:
        return None
    return {
        "shape": [_size(n) for n in tensor.shape],
        "stride": [_size(n) for n in tensor.stride()],
        "offset": _size(tensor.storage_offset()),
        "dtype": str(tensor.dtype),
    }


def eager_backend(q, k, v, mask, dropout: float) -> str:
    import torch
    from torch.nn.attention import SDPBackend

    return SDPBackend(torch._fused_sdp_choice(q, k, v, attn_mask=mask, dropout_p=dropout)).name.lower()


#: the forms of the key padding mask probed (``--text-mask`` of ``ddp_bench.py gpu-step`` takes the same
#: names): ``expanded``, the text encoder's boolean (B, 1, L, L) view of (B, 1, 1, L); ``broadcast``, that
#: (B, 1, 1, L) mask itself; ``contiguous``, the (B, 1, L, L) mask materialised; ``additive``, 0 / the
#: dtype's minimum in (B, 1, L, L); ``none``, no mask
MASKS = ("expanded", "broadcast", "contiguous", "additive", "none")


def key_mask(form: str, keep, dtype):
    """The attention mask in ``form`` (one of :data:`MASKS`) of ``keep``, the (B, L) boolean keys to attend
    to; ``dtype`` is the additive mask's."""
    import torch

    if form == "none":
        return None
    if form == "broadcast":
        return keep[:, None, None, :]
    expanded = keep[:, None, None, :].expand(-1, 1, keep.shape[1], -1)
    if form == "contiguous":
        return expanded.contiguous()
    if form == "additive":
        zero = torch.zeros((), dtype=dtype, device=keep.device)
        return torch.where(expanded, zero, torch.finfo(dtype).min)
    return expanded


def make_mask(form: str, lens, length: int, dtype):
    """:func:`key_mask` of the first ``lens`` ((B,) valid lengths) of ``length`` keys."""
    import torch

    return key_mask(form, torch.arange(length, device=lens.device)[None, :] < lens[:, None], dtype)


def fused_checks(q, k, v, mask, dropout: float, fake: bool) -> dict:
    """Whether each fused backend accepts these inputs, and the reasons it gives when not
    (``torch.backends.cuda.can_use_*`` with ``debug=True``; on the CPU they answer False without a
    reason). ``fake``: asked of FakeTensor copies, as torch.compile's tracing sees the inputs."""
    import warnings

    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.backends import cuda

    checks = {
        "cudnn": cuda.can_use_cudnn_attention,
        "flash": cuda.can_use_flash_attention,
        "efficient": cuda.can_use_efficient_attention,
    }
    mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext()
    out = {}
    with mode:
        if fake:
            q, k, v = (mode.from_tensor(t) for t in (q, k, v))
            mask = None if mask is None else mode.from_tensor(mask)
        for name, check in checks.items():
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    ok = check(cuda.SDPAParams(q, k, v, mask, dropout, False, False), True)
                out[name] = True if ok else [" ".join(str(w.message).split())[:300] for w in caught]
            except Exception as err:  # noqa: BLE001 - the reason is the result
                out[name] = f"error: {type(err).__name__}: {str(err)[:200]}"
    return out


def setting_row(dev, row: dict) -> None:
    """Fill ``row`` with what decides the choice besides the inputs: the torch, CUDA and cuDNN versions,
    the GPU's compute capability, the backends enabled, whether the math backend may reduce in bfloat16,
    and PyTorch's priority order (set by the first selection: cuDNN first on some GPUs and cuDNN
    versions). Filled in place, so that what was read stays when a later field raises."""
    import torch
    from torch.backends import cuda
    from torch.nn.attention import SDPBackend

    row.update(torch=torch.__version__, cuda=torch.version.cuda)
    row["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    if dev.type == "cuda":
        major, minor = torch.cuda.get_device_capability(dev)
        row["capability"] = f"sm{major}{minor}"
    q = torch.zeros(1, 1, 8, 64, device=dev, dtype=torch.bfloat16)
    eager_backend(q, q, q, None, 0.0)  # a first selection, so that the order read next is the one used
    row["priority"] = [SDPBackend(int(b)).name.lower() for b in torch._C._get_sdp_priority_order()]
    enabled = {
        "cudnn": cuda.cudnn_sdp_enabled(),
        "flash": cuda.flash_sdp_enabled(),
        "efficient": cuda.mem_efficient_sdp_enabled(),
        "math": cuda.math_sdp_enabled(),
    }
    row["enabled"] = [name for name, on in enabled.items() if on]
    row["math_bf16_reduction"] = cuda.fp16_bf16_reduction_math_sdp_allowed()


#: attention dropout probed: BERT's 0.1 in training; 0.125, a multiple of 1/16 (the resolution of cuDNN's
#: dropout: builds with pytorch/pytorch#174245, merged 2026-02-26, refuse cuDNN for other values, older
#: ones round them silently); none (evaluation, the ViT)
DROPOUTS = (0.1, 0.125, 0.0)


def probe(device: str, quick: bool, emit) -> None:
    """Every case, each row handed to ``emit`` as soon as it exists."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dev = torch.device(device)
    row = {"case": "setting"}
    with _recorded_error(row):
        setting_row(dev, row)
    emit(row)
    _step_rows(dev, quick, emit)
    batch, heads, head_dim = (2, 2, 64) if quick else (64, 12, 64)
    g = torch.Generator().manual_seed(0)
    for length in (35, 48, 64, 128):
        shape = (batch, heads, length, head_dim)
        q, k, v = (torch.randn(shape, generator=g).to(dev, torch.bfloat16).requires_grad_() for _ in range(3))
        lens = torch.randint(3, length + 1, (batch,), generator=g).to(dev)
        for form in MASKS:
            for dropout in DROPOUTS if form == "expanded" else (0.1, 0.0):
                row = {"case": "sdpa", "keys": length, "mask": form, "dropout": dropout}
                row["eager"] = eager_backend(q, k, v, make_mask(form, lens, length, q.dtype), dropout)

                def attend(q, k, v, lens, form=form, dropout=dropout):  # the mask made inside, as the encoder
                    mask = make_mask(form, lens, q.shape[-2], q.dtype)
                    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)

                row["compiled"] = (traced_backends(attend, q, k, v, lens) or ["none traced"])[0]
                if row["compiled"] == "math":  # why not fused: eager and traced views, math disallowed
                    mask = make_mask(form, lens, length, q.dtype)
                    row["fused_eager"] = fused_checks(q, k, v, mask, dropout, fake=False)
                    row["fused_traced"] = fused_checks(q, k, v, mask, dropout, fake=True)
                    fused = [
                        SDPBackend.CUDNN_ATTENTION,
                        SDPBackend.FLASH_ATTENTION,
                        SDPBackend.EFFICIENT_ATTENTION,
                    ]
                    try:
                        with sdpa_kernel(fused):
                            row["compiled_without_math"] = traced_backends(attend, q, k, v, lens)[0]
                    except Exception as err:  # noqa: BLE001 - the reason is the result
                        while err.__cause__ or err.__context__:  # the innermost error says why
                            err = err.__cause__ or err.__context__
                        text = " ".join(str(err).split())
                        row["compiled_without_math"] = f"error: {type(err).__name__}: {text[:400]}"
                emit(row)
    _encoder_rows(dev, quick, emit)


def _step_rows(dev, quick: bool, emit) -> None:
    """The whole bfloat16 training step as ``ddp_bench.py gpu-step --precision bf16 --compile
    --compile-scope step`` compiles it (``seps-vit-b16-paper`` at batch 64; ``quick``: ``seps-tiny-paper``
    at batch 2): the backend of each layer of the forward graph AOTAutograd traces (:func:`traced_layers`);
    every attention call Dynamo captures with the backend chosen for its traced inputs and, where not
    fused, why (:func:`dynamo_attention_calls`), with the caption width as the batch has it and again
    symbolic (as torch.compile traces the step once batches of several widths have come); the traced
    layers again with the additive key padding mask (``--text-mask additive``). Each row records its
    error, if any, and the next one runs."""
    import argparse
    from collections import Counter

    import ddp_bench

    from patchword.encoders.hf import HFTextEncoder

    setting = argparse.Namespace(
        device=str(dev), quick=quick, model="seps-vit-b16-paper", batch=2 if quick else 64, unfused=False
    )
    setting.__dict__.update(precision="bf16", pair_chunk=0, compile=False, text_mask="default")
    row = {"case": "step, traced", "mask": "expanded"}
    with _recorded_error(row):
        _, _, step_module, _, shard, _ = ddp_bench.step_setup(setting)
    if "error" in row:  # no model: nothing below can run
        emit(row)
        return

    def step(shard):
        return step_module(shard, True, False, 1.0)

    with _recorded_error(row):
        row["compiled"] = dict(Counter(traced_layers(step, shard, fullgraph=False)))
    emit(row)
    # A real dataset's batches differ in caption width (the dense captions, cut at 128 tokens, are nearly
    # always 128 wide): from the second width on, torch.compile traces the step with the caption width
    # symbolic, and the backends' checks then see symbolic sizes.
    import torch

    dynamic = dataclasses.replace(shard, ids=shard.ids.clone())
    torch._dynamo.maybe_mark_dynamic(dynamic.ids, 1)
    for batch, widths in ((shard, {}), (dynamic, {"widths": "dynamic"})):
        row = {"case": "step, dynamo", "mask": "expanded", **widths}
        with _recorded_error(row):
            calls = dynamo_attention_calls(step, batch)
            row["compiled"] = dict(
                Counter(f"{c['backend'].removesuffix('_attention')}@{c['keys']}" for c in calls)
            )
            row["calls"] = calls
        emit(row)
    text = step_module.model.text_encoder
    if isinstance(text, HFTextEncoder):
        ddp_bench.use_text_mask(text, "additive")
        row = {"case": "step, traced", "mask": "additive"}
        with _recorded_error(row):
            row["compiled"] = dict(Counter(traced_layers(step, shard, fullgraph=False)))
        emit(row)


def _encoder_rows(dev, quick: bool, emit) -> None:
    """The encoders of the benchmark model (``seps-vit-b16-paper``: ViT-B/16 + BERT-base, random
    initialisation) as the bfloat16 training step runs them (``BF16Copy``, training mode): the backend
    counts of their traced attention layers, the text encoder at 35 and 128 tokens. ``quick``: a two-layer
    tiny BERT instead. A row that fails records its error; the next one runs."""
    import importlib.util
    from collections import Counter

    import torch

    if importlib.util.find_spec("transformers") is None:
        print("attention probe: transformers is not installed, no encoder rows", flush=True)
        return
    import transformers

    from patchword.encoders.hf import HFTextEncoder

    torch.manual_seed(0)
    if quick:
        config = transformers.BertConfig(
            num_hidden_layers=2, hidden_size=64, num_attention_heads=1, intermediate_size=128
        )
        text, image, vocab = HFTextEncoder(config).to(dev, torch.bfloat16), None, config.vocab_size
    else:
        from patchword.factory import create_model
        from patchword.train.master_weights import BF16Copy

        copy = BF16Copy(create_model("seps-vit-b16-paper", pretrained=False, device=dev)).module
        text, image, vocab = copy.text_encoder, copy.image_encoder, copy.text_encoder.vocab_size
    batch = 2 if quick else 64
    for length in (35, 128):
        g = torch.Generator().manual_seed(length)
        ids = torch.randint(1000, vocab, (batch, length), generator=g)
        lens = torch.randint(3, length + 1, (batch,), generator=g)
        lens[0] = length
        ids[torch.arange(length) >= lens[:, None]] = 0
        ids, lens = ids.to(dev), lens.to(dev)
        row = {"case": "text encoder, training", "keys": length}
        with _recorded_error(row):
            _text_row(row, text, ids, lens)
        emit(row)
    if image is not None:
        pixels = torch.randn(batch, 3, 224, 224).to(dev, torch.bfloat16)
        row = {"case": "image encoder, training", "keys": 197}
        with _recorded_error(row):
            row["eager"] = dict(Counter(eager_backends(image.train(), pixels)))
            row["compiled"] = dict(Counter(traced_backends(image, pixels)))
        emit(row)


@contextlib.contextmanager
def _recorded_error(row: dict):
    """Run the block; an exception becomes ``row["error"]`` instead of ending the probe."""
    try:
        yield
    except Exception as err:  # noqa: BLE001 - the error is the result
        row["error"] = f"{type(err).__name__}: {' '.join(str(err).split())[:400]}"


def _text_row(row: dict, text, ids, lens) -> None:
    """The text encoder's backends at these ids, eager and traced, and its first attention call."""
    from collections import Counter

    row["eager"] = dict(Counter(eager_backends(text.train(), ids, lens)))
    row["compiled"] = dict(Counter(traced_backends(text, ids, lens)))
    call = first_attention_call(text, ids, lens)  # the encoder's own q, k, v and mask, and why not fused
    if call:
        q, k, v, mask = (call[n] for n in ("query", "key", "value", "attn_mask"))
        dropout = float(call["dropout_p"] or 0.0)
        row["first_call"] = {
            "q": describe(q),
            "k": describe(k),
            "mask": describe(mask),
            "dropout": dropout,
        }
        row["fused_eager"] = fused_checks(q, k, v, mask, dropout, fake=False)
        row["fused_traced"] = fused_checks(q, k, v, mask, dropout, fake=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny shapes (a CPU smoke run)")
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    start, rows = time.perf_counter(), []

    def emit(row: dict) -> None:  # printed and written at once: a run cut short keeps what it found
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=2))

    probe(args.device, args.quick, emit)
    import torch

    if torch.device(args.device).type == "cuda":  # what it took beside the variants compiling (gpu-check)
        peak = torch.cuda.max_memory_reserved(torch.device(args.device)) / 2**30
        emit({"case": "memory", "peak_reserved_gb": round(peak, 2)})
    print(f"attention probe: {len(rows)} cases in {time.perf_counter() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
