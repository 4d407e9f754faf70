"""Built-in adapters, one per framework (installed as ``multidev.adapters``).

A small adapter is one file (``numpy.py``). A larger one is a folder per framework whose files
hold the same concern under the same name in every framework, each file one class declaring the
protocol it implements, composed in the folder's ``__init__.py`` (the adapter class, what the
entry point names, and the mechanism in its docstring):

- ``core.py``: the core protocol (:class:`multidev.protocol.Backend`): identity, devices, dtypes,
  creation, placement, synchronize and its hooks, host copies, the collectives' arithmetic; its
  ``__init__`` imports the framework and makes the state every concern uses;
- ``transfers.py``: :class:`~multidev.protocol.SupportsNonBlocking`, and the streams, pinned buffers
  and staged uploads the blocking moves share;
- ``dlpack.py``: :class:`~multidev.protocol.SupportsDLPack`;
- ``collectives.py``: :class:`~multidev.protocol.SupportsNativeCollectives` (NCCL, psum, ...);
- ``training.py``: :class:`~multidev.protocol.SupportsTraining`;
- ``compile.py``: :class:`~multidev.protocol.SupportsCompile`;
- ``_common.py``: what several files of one framework share.

A folder has only the files of the concerns its framework has. Every adapter imports its framework
only when the adapter class is instantiated, and no adapter names another framework: a rule that
concerns two frameworks lives with the one it is about (torch's current-device rule for DLPack
exports is in ``torch/dlpack.py``, whoever consumes the export).
"""

# One path per module: this folder is the package 'multidev.adapters' (pyproject maps it), never a
# top-level 'backends' beside it (that would load every module a second time).
if __name__ != 'multidev.adapters':
    raise ImportError(f"backends/ is the package multidev.adapters; import it under that name "
                      f"(pip install -e . maps it), not as {__name__!r}")
