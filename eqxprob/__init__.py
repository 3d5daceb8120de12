"""eqxprob: probability in JAX + Equinox that behaves like ordinary PyTrees.

The whole public surface is listed here; every other module is private.
"""

import warnings as _warnings


# tfp-nightly's import warns about JAX APIs it uses, a `DeprecationWarning` that
# `python -W error` (or `filterwarnings = error`) makes an ImportError: imported
# first, under a filter restored afterwards, so no warning of the user's is hidden.
with _warnings.catch_warnings():
    _warnings.simplefilter("ignore", DeprecationWarning)
    import distrax as _distrax  # noqa: F401
    from tensorflow_probability.substrates import jax as _tfp  # noqa: F401

from . import constraints as constraints
from ._constraint import (
    default_bijector as default_bijector,
    register_bijector as register_bijector,
)
from ._fit import FitState as FitState, fit as fit
from ._fit_checks import NonFiniteLossError as NonFiniteLossError
from ._metadata import (
    ParamSpec as ParamSpec,
    bijector_tree as bijector_tree,
    constrain as constrain,
    field as field,
    log_prior as log_prior,
    parameterize as parameterize,
    prior_tree as prior_tree,
    spec_tree as spec_tree,
    unconstrain as unconstrain,
)
from ._natgrad import natural_gradient as natural_gradient
from ._parameter import (
    Bijector as Bijector,
    Frozen as Frozen,
    bounded as bounded,
    corr_cholesky as corr_cholesky,
    frozen as frozen,
    is_bijector as is_bijector,
    log_det_jacobian as log_det_jacobian,
    lower_cholesky as lower_cholesky,
    nonnegative as nonnegative,
    partition as partition,
    positive as positive,
    positive_definite as positive_definite,
    resolve as resolve,
    simplex as simplex,
    trainable as trainable,
)
from ._state import UpdateOnEvent as UpdateOnEvent
from ._summary import Summary as Summary, summary as summary
from ._variational import Guide as Guide, elbo as elbo, guide as guide
from ._where import (
    WhereDict as WhereDict,
    tree_at_all as tree_at_all,
    where_labels as where_labels,
    where_paths as where_paths,
)
from ._wrappers import FixedDistrax as FixedDistrax


__version__ = "0.1.0"

__all__ = ["__version__", *(n for n in dir() if not n.startswith("_"))]
