"""Runnable demos, installed as ``multidev.examples``: ``python -m multidev.examples.digits`` (a classifier
on 1 and N devices of every backend), ``python -m multidev.examples.data_parallel`` (the smallest step)."""

# One path per module: this folder is the package 'multidev.examples' (pyproject maps it), never a
# top-level 'examples' beside it (that would load every module a second time).
if __name__ != 'multidev.examples':
    raise ImportError(f"examples/ is the package multidev.examples; import it under that name "
                      f"(pip install -e . maps it), not as {__name__!r}")
