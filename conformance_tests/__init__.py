"""The shared conformance suite, installed as ``multidev.conformance``.

Written once, parametrized over backend x device by the pytest plugin in :mod:`.plugin`. Run it
against any registered or importable adapter::

    multidev conformance --backend torch            # or --backend mypkg.adapter:MyBackend
    pytest --pyargs multidev.conformance --multidev-backend=torch
"""
