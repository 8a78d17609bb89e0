"""The names of the files a run directory holds, one constant each (the only place they are spelled).

A run directory (``patchword train``, ``patchword import``, the demo) holds its resolved config, its
vocabulary, checkpoints, logs and results; an exported model directory (``patchword export``) the subset
that loads a model. Writers and readers use these names; ``patchword.runs`` reads a directory back.
"""

from __future__ import annotations

__all__ = [
    "CONFIG_FILE",
    "VOCAB_FILE",
    "BERT_VOCAB_DIR",
    "BERT_VOCAB_FILE",
    "BACKBONES_FILE",
    "WEIGHTS_FILE",
    "BEST_CHECKPOINT",
    "LAST_CHECKPOINT",
    "METRICS_FILE",
    "METRICS_JSON",
    "SUMMARY_FILE",
    "RESUMES_FILE",
    "IMPORT_FILE",
    "EXPORT_DIR",
    "RUN_FILES",
]

CONFIG_FILE = "config.yaml"  # the resolved run config, written once and never rewritten
VOCAB_FILE = "vocab.json"  # the word vocabulary (word tokenizers)
BERT_VOCAB_DIR = "bert_vocab"  # vocab.txt + tokenizer_config.json: a BERT tokenizer's (a run's, an export's)
BERT_VOCAB_FILE = "bert_vocab.txt"  # an imported run's BERT vocabulary (the official checkpoint's vocab.txt)
BACKBONES_FILE = "backbones.json"  # the Hugging Face backbones' architectures (rebuilt without download)
WEIGHTS_FILE = "model.safetensors"  # the weights of an exported model directory
BEST_CHECKPOINT = "best.pt"  # the checkpoint of the best dev rSum (the one training evaluates)
LAST_CHECKPOINT = "last.pt"  # the latest state: weights, optimiser, RNGs, step (what --resume reads)
METRICS_FILE = "metrics.jsonl"  # one record per logged step and validation (append-only)
METRICS_JSON = "metrics.json"  # the test metrics of the evaluated checkpoint
SUMMARY_FILE = "summary.json"  # the run's result: test metrics, steps, times
RESUMES_FILE = "resumes.jsonl"  # one record per --resume: when, at which step, with which overrides
IMPORT_FILE = "import.json"  # what an imported official checkpoint held (patchword import)
EXPORT_DIR = "export"  # the weights-only export training writes inside the run directory

#: The files a run directory records its run in, which no command's output may replace (``--force`` or
#: not): every name of :mod:`patchword.runs.files`. Any checkpoint (``*.pt``) and the files of ``export/``
#: are the run's too (:func:`patchword.runs.load.refuse_run_output`).
RUN_FILES = frozenset(
    {
        CONFIG_FILE,
        VOCAB_FILE,
        BACKBONES_FILE,
        WEIGHTS_FILE,
        BEST_CHECKPOINT,
        LAST_CHECKPOINT,
        METRICS_FILE,
        METRICS_JSON,
        SUMMARY_FILE,
        RESUMES_FILE,
        IMPORT_FILE,
    }
)
