"""Running on the device: the backend choice (GPU or Numba's simulator), launch helpers, device
functions shared by the kernels, the simulator shim and the sm_90 compile check.

Importing this package does not import ``numba.cuda``; ``intrinsics`` and ``bits`` do.
"""
