"""Native baselines for ``multidev bench``, one file per framework (``multidev.baselines`` entry points).

Each class is written directly against its framework: the figures multidev is measured against.
Beside them, two framework-specific probes for GPU runs: ``call_profile`` (thin calls, md against
native, step by step) and ``jax_upload_tuning`` (ways to upload pageable memory with JAX); and
``data_parallel_ddp``: ``md.data_parallel`` against torch's DistributedDataParallel;
``data_parallel_jax``: against JAX's own sharded ``jit`` over several devices of one process;
``data_parallel_mpi``: against a Horovod-style loop (one flattened mpi4py allreduce per step).
"""
