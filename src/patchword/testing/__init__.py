"""Reference implementations that the library is checked against, shipped so that the tests and the
benchmarks (``patchword bench``) use the same one.

They are deliberately slow and literal (loops written like the official code, one caption at a time):
use them to verify, never to score a dataset.

``SEPSOptions`` here is the options type :func:`independent_seps_scores` takes (the official ``opt``
fields plus the reference's switches). It is not :class:`patchword.model.SEPSOptions`, the run config's
``model.seps`` section that ``build_matcher`` / ``create_model`` read: use this one with the independent
reference only (``from patchword.testing import SEPSOptions, independent_seps_scores``).
"""

from patchword.testing.seps_independent import SEPSOptions, independent_seps_scores
from patchword.testing.seps_reference import seps_reference_scores
from patchword.testing.simulated_device import DeviceCounts, MixedDeviceError, SimulatedDevice

__all__ = [
    "DeviceCounts",
    "MixedDeviceError",
    "SEPSOptions",
    "SimulatedDevice",
    "independent_seps_scores",
    "seps_reference_scores",
]
