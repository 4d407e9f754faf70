"""The shared conformance suite, installed as ``multidev.conformance``.

Written once, parametrized over backend x device by the pytest plugin in :mod:`.plugin`. Run it
against any registered or importable adapter::

    multidev conformance --backend torch            # or --backend mypkg.adapter:MyBackend
    pytest --pyargs multidev.conformance --multidev-backend=torch
"""

# One path per module: this folder is the package 'multidev.conformance' (pyproject maps it), never a
# top-level 'conformance_tests' beside it (that would load every module a second time).
if __name__ != 'multidev.conformance':
    raise ImportError(f"conformance_tests/ is the package multidev.conformance; import it under that name "
                      f"(pip install -e . maps it), not as {__name__!r}")
