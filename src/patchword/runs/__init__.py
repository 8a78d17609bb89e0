"""The run directory, in one package: what it is made of, how it is configured, read back, checked,
evaluated and exported.

* :mod:`~patchword.runs.files`: the names of its files, one constant each;
* :mod:`~patchword.runs.config`: :class:`RunConfig` (data, model, train, eval sections) and the shipped
  recipes (``--config demo``);
* :mod:`~patchword.runs.load`: :func:`load_run` (config, tokenizer, weights, model on a device);
* :mod:`~patchword.runs.weights`: which weights file a run directory loads, and whether an export's weights
  are still those it wrote;
* :mod:`~patchword.runs.checks`: whether prepared data fits a model (shared by training and evaluation);
* :mod:`~patchword.runs.evaluate`: evaluating a run and writing its JSON (recall, ensembles, the suites);
* :mod:`~patchword.runs.ensemble`: what an ensemble's members must be (distinct weights, comparable scales);
* :mod:`~patchword.runs.recorded`: which recorded evaluation describes a given checkpoint;
* :mod:`~patchword.runs.export`: a run as a self-contained model directory with its card
  (:mod:`~patchword.runs.card` writes the card, :mod:`~patchword.runs.origins` says where each encoder's
  weights came from).
* :mod:`~patchword.runs.claim`: a run directory while a command trains it (claimed, locked, a killed
  start cleared), one :class:`~patchword.runs.claim.RunKind` per training command.

The package sits above evaluation in the layers (docs/architecture.md): it uses ``patchword.eval``, which
never reads a run directory. ``from patchword.runs import load_run`` is the usual entry.
"""

from patchword.runs.config import RunConfig, TrainConfig, load_run_config
from patchword.runs.files import (
    BACKBONES_FILE,
    BERT_VOCAB_DIR,
    CONFIG_FILE,
    METRICS_FILE,
    RESUMES_FILE,
    VOCAB_FILE,
    WEIGHTS_FILE,
)
from patchword.runs.load import (
    LoadedRun,
    build_run_model,
    config_hash,
    load_run,
    load_run_tokenizer,
    read_run_config,
    resolve_checkpoint,
    resume_overrides,
    save_backbones,
)
from patchword.runs.origins import pin_hub_revisions

__all__ = [
    "BACKBONES_FILE",
    "CONFIG_FILE",
    "METRICS_FILE",
    "RESUMES_FILE",
    "BERT_VOCAB_DIR",
    "VOCAB_FILE",
    "WEIGHTS_FILE",
    "LoadedRun",
    "RunConfig",
    "TrainConfig",
    "build_run_model",
    "config_hash",
    "load_run",
    "load_run_config",
    "load_run_tokenizer",
    "read_run_config",
    "resolve_checkpoint",
    "pin_hub_revisions",
    "resume_overrides",
    "save_backbones",
]
