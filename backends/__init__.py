"""Built-in adapters, one file per framework (installed as ``multidev.adapters``).

Each file implements :class:`multidev.protocol.Backend` with the same method names in the same
order, and imports its framework only when the adapter class is instantiated.
"""

# One path per module: this folder is the package 'multidev.adapters' (pyproject maps it), never a
# top-level 'backends' beside it (that would load every module a second time).
if __name__ != 'multidev.adapters':
    raise ImportError(f"backends/ is the package multidev.adapters; import it under that name "
                      f"(pip install -e . maps it), not as {__name__!r}")
