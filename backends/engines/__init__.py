"""The engine of :mod:`multidev.distributed` that belongs to no framework adapter (installed as
``multidev.adapters.engines``): ``mpi`` (mpi4py), a runtime that carries every framework's host
arrays. The framework engines live in their adapter's folder: ``torch/engine.py``
(torch.distributed), ``jax/engine.py`` (JAX's multi-controller runtime). Each implements
:class:`multidev.distributed.engine.Engine`, is registered under the ``multidev.engines``
entry-point group, and imports its framework only when a group starts.
"""
