"""Reference implementations that the library is checked against, shipped so that the tests and the
benchmarks (``patchword bench``) use the same one.

They are deliberately slow and literal (loops written like the official code, one caption at a time):
use them to verify, never to score a dataset.
"""

from patchword.testing.seps_independent import independent_seps_scores
from patchword.testing.seps_reference import seps_reference_scores
from patchword.testing.simulated_device import DeviceCounts, MixedDeviceError, SimulatedDevice

__all__ = [
    "DeviceCounts",
    "MixedDeviceError",
    "SimulatedDevice",
    "independent_seps_scores",
    "seps_reference_scores",
]
