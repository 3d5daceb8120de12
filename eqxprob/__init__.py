"""eqxprob: probability in JAX + Equinox that behaves like ordinary PyTrees.

The whole public surface is listed here; every other module is private.
"""

from ._wrappers import FixedDistrax as FixedDistrax


__version__ = "0.1.0"

__all__ = [
    "__version__",
    # wrappers
    "FixedDistrax",
]
