"""Native baselines for ``multidev bench``, one file per framework (``multidev.baselines`` entry points).

Each class is written directly against its framework: the figures multidev is measured against.
"""
