"""Built-in engines of :mod:`multidev.distributed`, one file per runtime (installed as
``multidev.adapters.engines``): ``torch`` (torch.distributed), ``mpi`` (mpi4py), ``jax`` (JAX's
multi-controller runtime). Each implements :class:`multidev.distributed.engine.Engine`, is
registered under the ``multidev.engines`` entry-point group, and imports its framework only when a
group starts.
"""
