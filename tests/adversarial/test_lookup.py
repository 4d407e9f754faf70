"""Identifying a tensor never starts another framework's adapter: with TensorFlow, JAX and torch
imported, NumPy arrays (plain and on virtual devices), NumPy scalars and Python objects are looked
up from 8 threads at a cold start without loading any adapter but NumPy's (a fresh process)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from multidev.registry import registered_backends

_CODE = textwrap.dedent("""
    import importlib.util, json, os, sys, threading
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    frameworks = [m for m in ("tensorflow", "jax", "torch") if importlib.util.find_spec(m)]
    for m in frameworks:
        __import__(m)
    import numpy as np
    import multidev as md
    from multidev import registry
    from multidev.adapters.numpy import VirtualDeviceArray

    v = np.arange(3.0).view(VirtualDeviceArray)
    objs = [np.ones(3), v, np.float32(1), np.ones((), np.int8)]
    errors, devices = [], []

    def work():
        try:
            devices.extend(str(md.device_of(o)) for o in objs)
            for o in (1.0, [1, 2], None, "x", object()):
                try:
                    md.device_of(o)
                except md.UnsupportedTensorError:
                    pass
                else:
                    errors.append(f"{o!r} was taken for a tensor")
        except Exception as e:
            errors.append(repr(e))

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps({"frameworks": frameworks, "loaded": sorted(b.name for b in registry.loaded_backends()), "errors": errors,
                      "devices": sorted(set(devices))}))
""")


def test_numpy_arrays_and_python_objects_load_no_other_adapter() -> None:
    p = subprocess.run([sys.executable, "-c", _CODE], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert not out["errors"], out["errors"]
    assert out["loaded"] == ["numpy"], f"identifying NumPy arrays loaded {out['loaded']} (imported: {out['frameworks']})"
    assert out["devices"] == ["cpu:0"], out["devices"]
    assert "numpy" in registered_backends()
