"""What several files of the MXNet adapter share."""
from __future__ import annotations

#: What MXNet 1.9.1 can create, compute with (through the casts the package docstring lists) and read back.
#: Not here: int16, uint16/32/64, complex (no such NDArray dtypes) and bfloat16 (no NumPy-visible
#: bfloat16 in 1.9.1: a DLPack import gives a structured uint16 dtype).
MX_DTYPES = frozenset({"bool", "int8", "int32", "int64", "uint8", "float16", "float32", "float64"})
FLOATS = ("float16", "float32", "float64")
