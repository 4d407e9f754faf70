"""D2L's GPU and "Computational Performance" programs, ported to multidev, one module per section
(written for multidev: the facts are the book's, the code is ours):

- ``use_gpu``: "GPUs" (try_gpu, tensors on a device, copyto vs as_in_ctx, a model on a device,
  native calls and framework code on a multidev device);
- ``async_computation``: 12.2, work queued and waited for, results dropped included;
- ``auto_parallelism``: 12.3, two devices at once, and copies to the host under the computation;
- ``multi_gpu_scratch``: 12.5, LeNet from scratch with ``split_batch``/``allreduce``/``replicate``
  and ``train_batch``;
- ``multi_gpu_concise``: 12.6, the framework's own model moved with ``md.to``, replicated and
  trained data-parallel.

Each runs on every installed backend (``--backend``), on 1 device and on N (``--devices 2,4``:
virtual CPU devices on a CPU, GPUs first where there are GPUs), checks what the book says
(N devices learn what one device learns, within the tolerances each module states) and exits
non-zero when a check fails::

    python -m multidev.examples.d2l.multi_gpu_scratch --backend jax --devices 2,4
    python -m multidev.examples.d2l --backend torch,jax --json book.json     # every section
"""

# One path per module: this folder is the package 'multidev.examples.d2l' (pyproject maps it).
if __name__ != "multidev.examples.d2l":
    raise ImportError(f"examples/d2l/ is the package multidev.examples.d2l; import it under that name "
                      f"(pip install -e . maps it), not as {__name__!r}")

#: The sections, in the book's order (module names).
SECTIONS = ("use_gpu", "async_computation", "auto_parallelism", "multi_gpu_scratch", "multi_gpu_concise")
