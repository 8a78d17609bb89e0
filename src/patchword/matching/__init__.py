"""Fine-grained similarity heads behind one contract (see :class:`~patchword.matching.base.Matcher`)."""

from patchword.matching.base import Matcher, MatcherOutput, TwoStagePlan
from patchword.matching.filip import FILIPConfig, FILIPMatcher
from patchword.matching.naaf import NAAFConfig, NAAFMatcher
from patchword.matching.registry import (
    UnknownMatcherError,
    build_matcher,
    list_matchers,
    matcher_config_class,
    matcher_reads_dense,
    matcher_spec,
    register_matcher,
)
from patchword.matching.scan import SCANConfig, SCANMatcher
from patchword.matching.seps import SEPSConfig, SEPSMatcher
from patchword.matching.tgdt import TGDTConfig, TGDTMatcher
from patchword.matching.vse import VSEConfig, VSEMatcher

#: The matcher a run config uses unless it names another (``model.matcher``).
DEFAULT_MATCHER = "seps"

__all__ = [
    "DEFAULT_MATCHER",
    "FILIPConfig",
    "FILIPMatcher",
    "Matcher",
    "MatcherOutput",
    "NAAFConfig",
    "NAAFMatcher",
    "SCANConfig",
    "SCANMatcher",
    "SEPSConfig",
    "SEPSMatcher",
    "TGDTConfig",
    "TGDTMatcher",
    "TwoStagePlan",
    "UnknownMatcherError",
    "VSEConfig",
    "VSEMatcher",
    "build_matcher",
    "list_matchers",
    "matcher_config_class",
    "matcher_reads_dense",
    "matcher_spec",
    "register_matcher",
]
