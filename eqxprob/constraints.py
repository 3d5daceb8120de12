"""Constraints: the supports a parameter may be constrained to.

Instances to pass as `ep.field(constraint=...)` or `Bijector.from_value(...,
constraint=...)`: `real`, `positive`, `nonnegative`, `unit_interval`, `simplex`,
`lower_cholesky`, `positive_definite`, `corr_cholesky`; builders
`greater_than(low)`, `less_than(high)`, `interval(low, high)`; and the classes, to
subclass (`Constraint`) or to register bijectors for (`ep.register_bijector`).

**Example:**

```python
import jax.numpy as jnp
import eqxprob as ep

assert bool(ep.constraints.positive.check(jnp.array(2.0)))
assert not bool(ep.constraints.interval(0.0, 1.0).check(jnp.array(1.5)))
assert ep.constraints.interval(0.0, jnp.inf) == ep.constraints.greater_than(0.0)
```
"""

from ._constraint import (
    Constraint as Constraint,
    CorrCholesky as CorrCholesky,
    GreaterThan as GreaterThan,
    Interval as Interval,
    LessThan as LessThan,
    LowerCholesky as LowerCholesky,
    Nonnegative as Nonnegative,
    Positive as Positive,
    PositiveDefinite as PositiveDefinite,
    Real as Real,
    Simplex as Simplex,
    corr_cholesky as corr_cholesky,
    greater_than as greater_than,
    interval as interval,
    less_than as less_than,
    lower_cholesky as lower_cholesky,
    nonnegative as nonnegative,
    positive as positive,
    positive_definite as positive_definite,
    real as real,
    simplex as simplex,
    unit_interval as unit_interval,
)


__all__ = [n for n in dir() if not n.startswith("_")]
