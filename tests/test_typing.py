"""The public calls keep a tensor's type for a type checker (issue 31): ``md.to`` and ``md.copy``
return what they were given, ``md.to(..., non_blocking=True)`` a ``Transfer`` of it, and
``md.convert`` the target framework's tensor type (or the container it was given). Checked by
running mypy on a small program (mypy is in the ``lint`` extra)."""
from __future__ import annotations

import importlib.util
import re
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("mypy") is None,
                                reason="mypy is not installed (pip install 'multidev[lint]')")

ROOT = Path(__file__).resolve().parents[1]

PROGRAM = textwrap.dedent("""
    import numpy as np
    import multidev as md

    x = np.zeros(3, dtype=np.float32)
    reveal_type(x)
    reveal_type(md.to(x, "cpu"))
    reveal_type(md.to(x, "cpu", non_blocking=True))
    reveal_type(md.to([x, x], "cpu"))
    reveal_type(md.copy(x))
    reveal_type(md.copy({"w": x}))
    reveal_type(md.convert(x, "numpy"))
    reveal_type(md.convert([x], "numpy"))
    reveal_type(md.convert({"w": x}, "torch"))
    reveal_type(md.convert(x, "some_backend"))
""")


def test_to_copy_and_convert_keep_types(tmp_path: Path) -> None:
    from mypy import api

    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    out, err, _ = api.run([str(prog), "--no-incremental", "--follow-imports=silent",
                           "--ignore-missing-imports", "--no-error-summary"])
    notes = re.findall(r'Revealed type is "([^"]+)"', out)
    assert len(notes) == 10, out + err
    nd = notes.pop(0)  # the array's own type, as this NumPy's stubs spell it
    assert nd.startswith("numpy.ndarray["), nd
    lst, dct = ("list", "dict") if "builtins." not in out else ("builtins.list", "builtins.dict")
    assert notes[0] == nd, notes[0]
    assert notes[1] == f"multidev.transfer.Transfer[{nd}]", notes[1]
    assert notes[2] == f"{lst}[{nd}]", notes[2]
    assert notes[3] == nd, notes[3]
    assert notes[4].startswith(dct + "[") and notes[4].endswith(f", {nd}]"), notes[4]
    assert notes[5].startswith("numpy.ndarray["), notes[5]
    assert notes[6] == f"{lst}[Any]", notes[6]
    assert notes[7].startswith(dct + "[") and notes[7].endswith(", Any]"), notes[7]
    assert notes[8] == "Any", notes[8]
