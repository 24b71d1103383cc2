"""How generated C receives the sizes of a shape-generic kernel (codegen/generic/): an int64_t array of them,
named SIZES_POINTER in the function that reads them. A function of a kernel's code may take it from its caller as
its last parameter (SIZES_PARAMETER: a library call created per shape, codegen/library/run_sizes.py); the entry
point a plan calls reads it from behind the kernel's buffers (codegen/generic/backend.py)."""

SIZES_POINTER = "ko_sizes"
SIZES_PARAMETER = f"const int64_t *{SIZES_POINTER}"
