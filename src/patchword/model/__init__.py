"""A retrieval model: image encoder + text encoder + matcher, built from one :class:`ModelConfig`.

Three modules, each importing only those before it:

* :mod:`~patchword.model.config`: :class:`ModelConfig` (the run config's ``model`` section), the typed
  options sections of the built-in matchers (:class:`SEPSOptions`, ...), which section a matcher reads;
* :mod:`~patchword.model.matcher_options`: a matcher's options against its registration: the arguments it
  is built with, :func:`check_matcher_options` (every build runs it), the options resolved to their values
  (what a run records and saves), the keys an evaluation may not override;
* :mod:`~patchword.model.build`: :class:`RetrievalModel` and :func:`build_model`.

Every name is importable from ``patchword.model`` itself, as before these were one module.
"""

from __future__ import annotations

from patchword.model.build import RetrievalModel, build_model, started_pretrained
from patchword.model.config import (
    FILIPOptions,
    ModelConfig,
    NAAFOptions,
    SCANOptions,
    SEPSOptions,
    TGDTOptions,
    VSEOptions,
    matcher_section,
    typed_sections,
)
from patchword.model.matcher_options import (
    check_matcher_options,
    check_option_overrides,
    matcher_arguments,
    model_reads_dense,
    reported_options,
    resolve_plugin_options,
    resolved_matcher_options,
    training_only_keys,
    unread_option_overrides,
)

__all__ = [
    "typed_sections",
    "ModelConfig",
    "FILIPOptions",
    "NAAFOptions",
    "SCANOptions",
    "SEPSOptions",
    "TGDTOptions",
    "VSEOptions",
    "RetrievalModel",
    "build_model",
    "check_matcher_options",
    "check_option_overrides",
    "matcher_arguments",
    "reported_options",
    "resolve_plugin_options",
    "resolved_matcher_options",
    "matcher_section",
    "model_reads_dense",
    "training_only_keys",
    "unread_option_overrides",
    "started_pretrained",
]
