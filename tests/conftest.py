"""Shared pytest fixtures, and the CI rule that nothing skips."""

from __future__ import annotations

import os

# No test touches the network, even by accident: huggingface_hub reads this once, when it is first
# imported, so it is set here, before any test module imports transformers (a test module setting it
# worked only when it happened to be collected first).
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pathlib import Path

import pytest
import torch
import transformers.utils.logging  # a dev dependency: a missing one fails collection, never skips

# transformers' library logger gets its stream handler on first use, bound to whatever sys.stderr is then: in
# a test with capsys, a stream closed after that test, which every later transformers warning then fails to
# write to ("--- Logging error ---" in another test's output, failing its one-line check when the two ran in
# that order). Bound here, once, to the session's stderr.
transformers.utils.logging.get_verbosity()

# The CI rule that nothing skips (tests/ci_guard.py): its hooks, registered here.
from ci_guard import (  # noqa: E402, F401
    IN_CI,
    pytest_make_collect_report,
    pytest_runtest_makereport,
    pytest_sessionfinish,
)

#: Modules whose verdicts rest on floating-point agreement between two computations: trajectories in
#: several processes or orders, resume, fast engines against forwards, rankings through two paths, numbers
#: recorded on another machine. ``.ci/run`` runs them a second time with the kernels restricted to AVX2
#: (``ATEN_CPU_CAPABILITY=avx2``, ``make test-numerics``), so that a tolerance that holds on one instruction
#: set only fails in CI, not on the next user's CPU.
NUMERICS_MODULES = {
    "test_compat",
    "test_patch_priors_checks",
    "test_score_matrix_arguments",
    "test_engine_input_checks",
    "test_score_dtypes",
    "test_distributed",
    "test_engine_block_syncs",
    "test_distributed_step",
    "test_distributed_agreement",
    "test_precision",
    "test_eval_helper_arguments",
    "test_train",
    "test_resume",
    "test_pretrained",
    "test_search",
    "test_serve",
    "test_engine",
    "test_engine_precision",
    "test_gallery",
    "test_device_work",
    "test_seps",
    "test_naaf",
    "test_scan",
    "test_tgdt",
    "test_matcher_contract",
    "test_two_stage",
    "test_metrics",
    "test_hashing_data",
    "test_compositional",
    "test_selection",
    "test_index",
    "test_codecs",
    "test_import_seps",
    "test_import_scan_naaf",
    "test_import_tgdt_ucmfh",
    "test_cuda",
    # engines against forwards, exported and re-evaluated models, references at 1e-5
    "test_pruning",
    "test_model_export",
    "test_bench",
    "test_device_paths",
    "test_filip",
    "test_seps_independent",
    "test_losses",
    "test_hashing_losses",
    "test_hashing_metrics",
    "test_encoders",
    "test_protocol_paths",
    # float32 against autocast / bfloat16 / float16 forwards of the matchers
    "test_reduced_precision",
    # the default score_pairs on the simulated device against the forward
    "test_gpu_path_syncs",
}

#: What makes a module numerics whatever its author remembered (``test_isolation.py`` checks it): it
#: compares a fast scoring engine, or a reference loop, with something else.
NUMERICS_SIGNS = (
    "score_matrix",
    "score_pairs",
    "eval.engine",
    "evaluate_matcher",
    "seps_reference",
    '/ "scores.pt"',  # scores recorded on another machine (tests/data/compat_f715cbc)
)


def pytest_addoption(parser):
    parser.addoption(
        "--expect-cpu-capability",
        default=None,
        help="fail at once unless torch's CPU kernels run with this capability (make test-numerics: AVX2)",
    )


def pytest_configure(config):
    """``make test-numerics`` restricts the kernels to AVX2 through environment variables a torch build
    might ignore; then the rerun would prove nothing about AVX2, so the run stops instead."""
    expected = config.getoption("--expect-cpu-capability")
    if expected:
        actual = torch.backends.cpu.get_cpu_capability()
        if actual.upper() != expected.upper():
            raise pytest.UsageError(
                f"--expect-cpu-capability {expected}: torch's CPU kernels run with {actual} "
                "(ATEN_CPU_CAPABILITY not honoured?)"
            )


def pytest_report_header(config):
    """Which kernels this run uses (``make test-numerics`` restricts them to AVX2)."""
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, {cpu}"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.stem in NUMERICS_MODULES:
            item.add_marker(pytest.mark.numerics)


@pytest.fixture(scope="session", autouse=True)
def private_caches(tmp_path_factory):
    """Every cache patchword keeps (``$PATCHWORD_CACHE``: the synthetic scenes) in this session's temporary
    directory, for the tests and the processes they start: a test never reads what another session (or the
    user) left in ``~/.cache/patchword``, and never writes there. Matplotlib's font cache too."""
    import os

    root = tmp_path_factory.mktemp("caches")
    saved = {key: os.environ.get(key) for key in ("PATCHWORD_CACHE", "MPLCONFIGDIR")}
    os.environ["PATCHWORD_CACHE"] = str(root / "patchword")
    os.environ["MPLCONFIGDIR"] = str(root / "matplotlib")
    yield root
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session", autouse=True)
def one_thread_session():
    """One torch thread for the whole session, module-scoped fixtures (trained runs) included: the tests'
    tensors are tiny, and with two threads the OpenMP barriers cost more than the work (several times more
    when other jobs load the machine). A test of ``--threads`` sets its own count; the processes a test
    starts keep torch's default."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def seeded_global_rngs():
    """Seed the global random streams (torch's, numpy's legacy one, Python's) before every test: a test
    that draws from them (shapes and error checks that need any tensor) sees the same numbers whatever ran
    before it in its process, so its verdict never depends on the order, the selection (``-k``) or which
    xdist worker took its module. Module fixtures are built before this runs and seed their own."""
    import random

    import numpy as np

    torch.manual_seed(0)
    np.random.seed(0)  # noqa: NPY002 - the legacy global stream is the one tests may draw from
    random.seed(0)


@pytest.fixture
def one_thread():
    """Run a test with one torch thread, restoring the previous count afterwards (a test that changed the
    count, or runs before the session's setting; modules opt in with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# A WordPiece vocabulary small enough to read: the BERT caption tokenizer's tests build on it.
TINY_WORDPIECE = [
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
    "a", "man", "rid", "##ing", "horse", "##s", ".", ",", "the", "dog", "is", "run", "##ning",
]  # fmt: skip


# A tiny dataset in the official LAPS / SEPS layout, written with real PNG files: like the SEPS release it
# has dense captions for train and test but none for dev.
LAPS_SIZES = {"train": 8, "dev": 3, "test": 4}
_WORDS = ["red", "blue", "green", "circle", "square", "triangle", "small", "large", "left", "right"]


def write_laps_dataset(root, sizes=None, image_size=32, seed=0):
    """-> dict of the paths (root, image_root, dense_train, dense_test); every split has 2 captions/image."""
    import json

    import numpy as np
    from PIL import Image

    sizes = sizes or LAPS_SIZES
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    images = root / "images"
    images.mkdir(exist_ok=True)
    mapping = {}
    paths = {"root": root, "image_root": images}
    for split, n in sizes.items():
        ids, caps, dense = [], [], []
        for i in range(n):
            image_id = f"{split}{i}"
            mapping[image_id] = f"{image_id}.png"
            pixels = (rng.random((image_size, image_size, 3)) * 255).astype(np.uint8)
            Image.fromarray(pixels).save(images / f"{image_id}.png")
            for _ in range(2):
                ids.append(image_id)
                caps.append(" ".join(rng.choice(_WORDS, size=4)))
            dense.append(json.dumps({"text": " ".join(rng.choice(_WORDS, size=12)), "model_id": "test"}))
        (root / f"{split}_ids.txt").write_text("\n".join(ids) + "\n")
        (root / f"{split}_caps.txt").write_text("\n".join(caps) + "\n")
        if split != "dev":
            (root / f"{split}.jsonl").write_text("\n".join(dense) + "\n")
            paths[f"dense_{split}"] = root / f"{split}.jsonl"
    (root / "id_mapping.json").write_text(json.dumps(mapping))
    return paths


@pytest.fixture
def laps_dataset(tmp_path):
    return write_laps_dataset(tmp_path / "laps")


def one_error_line(stderr: str) -> str:
    """The single ``error: ...`` line a user error must produce (log lines may precede it, a traceback
    may not)."""
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, stderr
    return errors[0]


# The tiny synthetic-scenes model most tests train: the named model seps-tiny-32 (32 px images in 8 px
# patches, 32-d tokens, one block each) on 32-pixel scenes.
TINY_MODEL_32 = ["data.synthetic_image_size=32", "model.name=seps-tiny-32"]

# A tiny SEPS run on 20 / 8 / 8 synthetic scenes, one thread, every step logged (add steps and intervals).
TINY_RUN_32 = [
    *TINY_MODEL_32,
    "data.num_train=20",
    "data.num_dev=8",
    "data.num_test=8",
    "train.batch_size=16",
    "train.log_every=1",
    "train.num_threads=1",
]

# A VSE model on a one-layer 32-pixel ViT and a one-layer text transformer, one training step: the model of
# the real-format (LAPS) reader tests, where what matters is the data, not the model.
TINY_VIT_VSE_16 = [
    "model.embed_dim=16",
    "model.tiny_vit.image_size=32",
    "model.tiny_vit.patch_size=8",
    "model.tiny_vit.width=16",
    "model.tiny_vit.depth=1",
    "model.tiny_vit.heads=2",
    "model.tiny_text_width=16",
    "model.tiny_text_depth=1",
    "model.max_text_len=64",
    "model.matcher=vse",
    "train.batch_size=4",
    "train.max_steps=1",
    "train.num_threads=1",
    "data.num_workers=0",
]


def laps_args(paths: dict[str, Path], *extra: str) -> list[str]:
    """:data:`TINY_VIT_VSE_16` on the LAPS-layout dataset ``paths`` (``root``, ``image_root``), 32 pixels."""
    return [
        *TINY_VIT_VSE_16,
        "data.dataset=laps",
        f"data.root={paths['root']}",
        f"data.image_root={paths['image_root']}",
        "data.image_size=32",
        *extra,
    ]


@pytest.fixture(scope="module")
def trained_tiny_run(tmp_path_factory) -> Path:
    """A tiny SEPS run (:data:`TINY_RUN_32`, two steps), trained once per test module."""
    from patchword.cli import main

    runs = tmp_path_factory.mktemp("runs")
    assert main(["train", *TINY_RUN_32, "train.max_steps=2", f"output_dir={runs}", "name=tiny"]) == 0
    return runs / "tiny"


# The tiny region-feature model (SCAN / NAAF / TGDT) on synthetic regions: 14 regions of 16-d, BiGRU words.
TINY_REGION_MODEL = [
    "data.dataset=synthetic_regions",
    "data.synthetic_image_size=16",
    "data.num_regions=14",
    "data.region_dim=16",
    "model.image_encoder=precomp",
    "model.text_encoder=gru",
    "model.embed_dim=16",
    "model.precomp.region_dim=16",
    "model.precomp.num_regions=14",
    "model.gru.word_dim=8",
]

# TGDT on the tiny region model: one small transformer layer over the regions and one over the words.
TINY_TGDT = [
    "model.matcher=tgdt",
    "model.precomp.context.layers=1",
    "model.precomp.context.heads=2",
    "model.precomp.context.ffn_dim=16",
    "model.text_context.layers=1",
    "model.text_context.heads=2",
    "model.text_context.ffn_dim=16",
]

# A tiny run of the region model: 20 / 8 / 8 synthetic region sets, batches of 16, every step logged.
TINY_REGIONS = [*TINY_REGION_MODEL, "data.num_train=20", "data.num_dev=8", "data.num_test=8"]
TINY_REGIONS += ["train.batch_size=16", "train.log_every=1", "train.num_threads=1"]


@pytest.fixture(scope="module")
def trained_region_run(tmp_path_factory) -> Path:
    """A tiny SCAN run on region features (:data:`TINY_REGIONS`, one step), trained once per test module."""
    from patchword.cli import main

    runs = tmp_path_factory.mktemp("runs")
    overrides = [*TINY_REGIONS, "model.matcher=scan", "train.max_steps=1", f"output_dir={runs}", "name=scan"]
    assert main(["train", *overrides]) == 0
    return runs / "scan"


# A tiny run of every family's training step: the patch-token matchers on the tiny ViT (SEPS with its
# dense captions; LAPS, VSE, CLIP and FILIP without) and the region matchers on the GRU's words.
TRAINING_FAMILIES = {
    "seps_paper": [*TINY_RUN_32, "model.seps.variant=paper"],
    "seps_code_caption": [*TINY_RUN_32, "model.seps.variant=code", "model.seps.dense_pairing=caption"],
    "laps": [*TINY_RUN_32, "model.matcher=laps"],
    "vse": [*TINY_RUN_32, "model.matcher=vse"],
    "clip_infonce": [*TINY_RUN_32, "model.matcher=clip", "train.loss=infonce"],
    "filip": [*TINY_RUN_32, "model.matcher=filip", "train.loss=infonce"],
    "scan": [*TINY_REGIONS, "model.matcher=scan"],
    "naaf": [*TINY_REGIONS, "model.matcher=naaf", "model.naaf.min_samples=20"],
    "tgdt": [*TINY_REGIONS, *TINY_TGDT],
}

# The tiny hashing (UCMFH) run: synthetic CLIP-like features, a one-layer fusion transformer.
TINY_HASH = [
    "data.num_train=64",
    "data.num_query=16",
    "data.synthetic_num_retrieval=96",
    "data.synthetic_image_dim=32",
    "data.synthetic_text_dim=32",
    "model.hidden=32",
    "model.dim_feedforward=32",
    "model.num_layers=1",
    "train.batch_size=32",
    "eval.ks=[1,5]",
]


def write_pair_hash_run(tmp: Path) -> Path:
    """A trained 16-bit UCMFH run on 40 random 16-d feature pairs written to ``tmp`` (``image.npy``,
    ``text.npy``; 20 query = retrieval pairs, 20 training pairs): its directory, ``tmp/runs/p``."""
    import numpy as np

    from patchword.cli.hash import main

    rng = np.random.default_rng(0)
    for name in ("image", "text"):
        np.save(tmp / f"{name}.npy", rng.standard_normal((40, 16)).astype(np.float32))
    model = ["model.hidden=32", "model.dim_feedforward=32", "model.num_layers=1", "train.batch_size=16"]
    data = ["--data", "pairs", "--image", str(tmp / "image.npy"), "--text", str(tmp / "text.npy")]
    argv = ["train", "--bits", "16", "--epochs", "1", "--output-dir", str(tmp / "runs"), "--name", "p"]
    assert main([*argv, *model, *data, "data.num_query=20", "data.num_train=20", "eval.ks=[1,5]"]) == 0
    return tmp / "runs" / "p"


@pytest.fixture(scope="module")
def pair_run(tmp_path_factory) -> Path:
    """:func:`write_pair_hash_run` of the module (its data beside it: ``pair_run.parent.parent``)."""
    return write_pair_hash_run(tmp_path_factory.mktemp("pairs"))


@pytest.fixture(scope="module")
def hash_run(tmp_path_factory):
    """A trained 16-bit UCMFH run (``TINY_HASH``, one epoch, one thread) of the module: its directory."""
    from patchword.cli.hash import main

    out = tmp_path_factory.mktemp("hash") / "runs"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        argv = ["train", "--bits", "16", "--epochs", "1", "--output-dir", str(out), "--name", "r", *TINY_HASH]
        assert main(argv) == 0
    finally:
        torch.set_num_threads(threads)
    return out / "r"


def tiny_model(vocab, **model_args):
    """The TINY_MODEL_32 retrieval model built in-process (seed 0, eval mode); ``variant`` and
    ``dense_pairing`` go to the SEPS section, every other keyword to the model section."""
    from patchword.config import apply_overrides
    from patchword.model import build_model
    from patchword.runs.config import RunConfig

    seps = ("variant", "dense_pairing")
    overrides = [f"model.{'seps.' if k in seps else ''}{k}={v}" for k, v in model_args.items()]
    cfg = apply_overrides(RunConfig(), [*TINY_MODEL_32, *overrides])
    torch.manual_seed(0)
    return build_model(cfg.model, vocab_size=len(vocab)).eval()


def tiny_shard_batch(device):
    """The fixed training batch of the tiny SEPS step tests (tests/eval/test_cuda.py,
    tests/train/test_master_weights.py): 6 captions of 6 32-px images, ids below 40, a dense caption per
    image, on ``device``."""
    from patchword.data.batches import ShardBatch

    g = torch.Generator().manual_seed(1)
    lens = torch.tensor([7, 3, 9, 5, 9, 4])
    dense_lens = torch.tensor([12, 20, 8, 20, 15, 10])
    return ShardBatch(
        images=torch.randn(6, 3, 32, 32, generator=g),
        ids=torch.randint(5, 40, (6, 9), generator=g),
        lens=lens,
        lens_all=lens,
        img_ids=torch.arange(6),
        dense_ids=torch.randint(5, 40, (6, 20), generator=g),
        dense_lens=dense_lens,
        dense_lens_all=dense_lens,
    ).to(torch.device(device))


def trainer_losses(
    overrides: list[str], tmp_path, steps: int, device: str = "cpu", same_batch: bool = False
) -> list[float]:
    """The logged losses of the first ``steps`` training steps of a run with ``overrides`` (seed 0 for
    the model, run directory ``tmp_path``, every step logged when ``train.log_every=1``), trained by the
    Trainer in-process on ``device``; ``same_batch``: every step on the epoch's first batch (one shape)."""
    from patchword.config import apply_overrides
    from patchword.data.prepare import prepare_data
    from patchword.model import build_model
    from patchword.runs.config import RunConfig
    from patchword.train.trainer import Trainer

    cfg = apply_overrides(RunConfig(), [*overrides, f"data.cache_dir={tmp_path / 'cache'}"])
    data = prepare_data(cfg.data)
    torch.manual_seed(0)
    model = build_model(cfg.model, vocab_size=data.vocab_size)
    trainer = Trainer(
        cfg,
        model,
        data.splits["train"],
        data.splits["dev"],
        tmp_path,
        device=device,
        tokenizer=data.tokenizer,
    )
    batches = trainer._epoch_batches(0)
    loaded = list(trainer._loader(batches))[:steps]
    for batch in loaded[:1] * steps if same_batch else loaded:  # as Trainer._fit steps through an epoch
        trainer._train_step(batch, len(batches))
        trainer.batch_in_epoch += 1
        trainer.step += 1
    return [r["loss"] for r in trainer.history]


def tiny_hf_laps_overrides(tiny_hf_dirs, laps_dataset, tmp_path) -> list[str]:
    """Overrides of a LAPS run on the :func:`tiny_hf` backbones (BERT text, ViT images) over
    ``laps_dataset``: 32 px images, 12-token captions, 16-d joint space, batch 4, one thread."""
    bert, vit = tiny_hf_dirs
    return [
        "data.dataset=laps",
        f"data.root={laps_dataset['root']}",
        f"data.image_root={laps_dataset['image_root']}",
        "data.image_size=32",
        "data.max_caption_len=12",
        "data.tokenizer=bert",
        f"data.bert_vocab={tmp_path / 'vocab20.txt'}",
        "model.text_encoder=bert",
        f"model.hf_text={bert}",
        "model.image_encoder=hf",
        f"model.hf_vision={vit}",
        "model.embed_dim=16",
        "model.matcher=laps",
        "train.batch_size=4",
        "train.num_threads=1",
    ]


@pytest.fixture
def tiny_hf(tmp_path):
    """Local tiny BERT (vocab 20, 16 positions) and ViT (32 px) directories, as save_pretrained writes;
    ``vocab.txt`` has 35 words, ``vocab20.txt`` beside them the 20 the BERT embeds."""
    transformers = pytest.importorskip("transformers")
    bert = tmp_path / "bert"
    transformers.BertModel(
        transformers.BertConfig(
            vocab_size=20,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=16,
        )
    ).save_pretrained(bert)
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(30))]
    (bert / "vocab.txt").write_text("\n".join(words) + "\n")
    (tmp_path / "vocab20.txt").write_text("\n".join(words[:20]) + "\n")
    vit = tmp_path / "vit"
    transformers.ViTModel(
        transformers.ViTConfig(
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            image_size=32,
            patch_size=8,
        ),
        add_pooling_layer=False,
    ).save_pretrained(vit)
    return bert, vit


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """The tiny SEPS run trained, exported and indexed once per session (tests/search_support.py)."""
    from search_support import search_env

    return search_env(tmp_path_factory)


@pytest.fixture(scope="module")
def searcher(env):
    """A :class:`~patchword.search.query.Searcher` over :func:`env`'s index."""
    from patchword.search.query import Searcher
    from patchword.search.store import SearchIndex

    return Searcher(SearchIndex.open(env.index_dir), env.run)
