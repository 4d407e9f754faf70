"""Runnable demos, installed as ``multidev.examples``: ``python -m multidev.examples.data_parallel``."""
