"""The measured cost model of the one-process allreduce algorithms, which ``algorithm="auto"``
chooses from (:func:`multidev.collectives.choose_algorithm`): per backend, device kind and device
count, the time of one allreduce as ``alpha + beta * bytes per device`` for each algorithm.

Data, not code: written by ``python -m multidev.benchmarks.scaling fit RESULTS.json --write`` from
the collectives suite's rows (``SOURCE`` names the results and the command that made them). A model
for another machine goes in a file named by ``$MULTIDEV_COLLECTIVE_MODEL`` instead
(``... fit RESULTS.json --out model.json``): see docs/collectives.md.
"""
from __future__ import annotations

__all__ = ["MODEL_JSON", "SOURCE"]

#: The results the model was fitted from.
SOURCE = "(none yet: the built-in rule applies)"

#: The model, as JSON (``{"version": 1, "models": {backend: {kind: {n: {algorithm: [alpha, beta,
#: relative rms error, points]}}}}}``).
MODEL_JSON = r"""{"version": 1, "models": {}}"""
