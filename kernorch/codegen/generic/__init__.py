"""Shape-generic code: a kernel rendered at probe sizes, unified into one source that takes the sizes at run time
(unify.py), the size-dependent literals as integer polynomials of the sizes (polynomial.py), behind the entry
point a plan calls (backend.py)."""

from kernorch.codegen.generic.backend import PLACEHOLDER, GenericCode, GenericKernelBackend, generic_backend
from kernorch.codegen.generic.polynomial import MAX_DEGREE, Polynomial, cross_monomials, fit
from kernorch.codegen.generic.unify import SIZE_SYMBOL, GenericSource, NotGeneric, polynomial_of, unify

__all__ = ["MAX_DEGREE", "PLACEHOLDER", "SIZE_SYMBOL", "GenericCode", "GenericKernelBackend", "GenericSource",
           "NotGeneric", "Polynomial", "cross_monomials", "fit", "generic_backend", "polynomial_of",
           "unify"]  # fmt: skip
