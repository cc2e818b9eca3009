"""``@cuda.jit`` kernels and device helpers only; host wrappers live one level up.

Import these modules only after the backend is fixed (:mod:`andromeda_nb.backend`): importing them
imports ``numba.cuda``.
"""
