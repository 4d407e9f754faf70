"""Runnable demos, installed as ``multidev.examples``: ``python -m multidev.examples.digits`` (a classifier
on 1 and N devices of every backend), ``python -m multidev.examples.data_parallel`` (the smallest step)."""
