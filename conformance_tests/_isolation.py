"""The suite's child interpreter: checks that hand buffers to another framework run here.

A framework that is given a buffer it cannot take may abort the whole interpreter (a failed C++
``CHECK``, a segmentation fault) instead of raising. Such checks (the ``@isolated`` tests of the
suite) run in one long-lived child interpreter, one request at a time: the child loads the same
adapters (``module:attr`` specs included, with the parent's ``sys.path`` and virtual device
counts), runs the test body and answers with its outcome. When the child dies, the check in
flight fails with the signal and the child's last output, and the next check starts a fresh child;
the parent's run, its matrix and its JSON go on. A check that outlives :data:`TIMEOUT_S` fails as a
hang.

Run as ``python -m multidev.conformance._isolation FD``: requests are JSON lines on stdin, answers
JSON lines on file descriptor ``FD`` (frameworks' own prints on stdout cannot garble them).
"""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import traceback
from typing import Any

from ._state import STATE

#: Seconds one check may take in the child (the first one includes the frameworks' imports).
TIMEOUT_S = 300.0

_BACKEND, _DEVICE, _DEVICES = "__md_backend__", "__md_device__", "__md_devices__"


def encode(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Test arguments as JSON: adapters by name, devices by spelling, the rest as they are."""
    from multidev import Device

    out: dict[str, Any] = {}
    for k, v in kwargs.items():
        if isinstance(v, Device):
            out[k] = {_DEVICE: str(v)}
        elif isinstance(v, list) and v and all(isinstance(d, Device) for d in v):
            out[k] = {_DEVICES: [str(d) for d in v]}
        elif hasattr(v, "capabilities") and isinstance(getattr(v, "name", None), str):
            out[k] = {_BACKEND: v.name}
        else:
            out[k] = v
    return out


def _decode(kwargs: dict[str, Any], specs: dict[str, str]) -> dict[str, Any]:
    import multidev as md

    out: dict[str, Any] = {}
    for k, v in kwargs.items():
        if isinstance(v, dict) and _BACKEND in v:
            out[k] = md.backend(specs.get(v[_BACKEND], v[_BACKEND]))
        elif isinstance(v, dict) and _DEVICE in v:
            out[k] = md.device(v[_DEVICE])
        elif isinstance(v, dict) and _DEVICES in v:
            out[k] = [md.device(d) for d in v[_DEVICES]]
        else:
            out[k] = v
    return out


class Child:
    """The parent's handle on the child interpreter (started on first use, restarted after a death)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.proc: subprocess.Popen[bytes] | None = None
        self.fd: int | None = None
        self.err: Any = None
        self.buf = b""
        self.eof = False

    def _start(self) -> None:
        r, w = os.pipe()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # the parent may hold most of a GPU
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        for k, n in self.config.get("counts", {}).items():
            env[k] = str(n)
        self.err = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the child; closed in _reset
        self.proc = subprocess.Popen([sys.executable, "-m", __name__, str(w)], stdin=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, stderr=self.err, pass_fds=(w,), env=env)
        os.close(w)
        self.fd, self.buf = r, b""
        self._send(self.config)

    def _send(self, obj: dict[str, Any]) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(obj) + "\n").encode())
        self.proc.stdin.flush()

    def _read_line(self, timeout: float) -> bytes | None:
        """One answer line; None when the child closed its end (it died: ``self.eof``) or timed out."""
        assert self.fd is not None
        self.eof = False
        while b"\n" not in self.buf:
            ready, _, _ = select.select([self.fd], [], [], timeout)
            if not ready:
                return None
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                self.eof = True  # the process may not be reaped yet (a core being written): not a hang
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line

    def _tail(self) -> str:
        if self.err is None:
            return ""
        self.err.seek(0)
        return self.err.read().decode(errors="replace")[-3000:]

    def call(self, request: dict[str, Any]) -> dict[str, Any]:
        """Run one check in the child; its answer, or a failure saying how the child ended."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        what = f"{request['function']}({', '.join(f'{k}={v}' for k, v in request['kwargs'].items())})"
        try:
            self._send(request)
        except (BrokenPipeError, OSError):
            return self._died(what)
        line = self._read_line(TIMEOUT_S)
        if line is None:
            if not self.eof and self.proc is not None and self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
                tail = self._tail()
                self._reset()
                return {"outcome": "failed", "longrepr":
                        f"the check did not finish within {TIMEOUT_S:g} s in the suite's child interpreter "
                        f"(a hang): {what}\n--- child's last output ---\n{tail}"}
            return self._died(what)
        res: dict[str, Any] = json.loads(line)
        if res.get("restart"):  # the check left its framework unusable (a sticky device error)
            self.close()
        return res

    def _died(self, what: str) -> dict[str, Any]:
        assert self.proc is not None
        try:
            rc = self.proc.wait(timeout=60)  # it closed its end: exiting (writing a core can take a while)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        how = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit status {rc}"
        tail = self._tail()
        self._reset()
        return {"outcome": "failed", "longrepr":
                f"the interpreter running this check died ({how}): a framework aborted instead of raising "
                f"an error. Check: {what}\n--- child's last output ---\n{tail}"}

    def _reset(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
        if self.err is not None:
            self.err.close()
        self.proc, self.fd, self.err, self.buf = None, None, None, b""

    def close(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reset()


# == child side ====================================================================================
def _run(req: dict[str, Any], specs: dict[str, str]) -> dict[str, Any]:
    import pytest

    from multidev.registry import prefer

    STATE["found"] = {}
    STATE["restart"] = False
    try:
        kwargs = _decode(req["kwargs"], specs)
        fn: Any = importlib.import_module(req["module"])
        for part in req["function"].split("."):
            fn = getattr(fn, part)
        fn = getattr(fn, "__wrapped__", fn)
        b = kwargs.get("md_backend")
        with prefer(b.name) if b is not None else contextlib.nullcontext():
            fn(**kwargs)
        res: dict[str, Any] = {"outcome": "passed"}
    except pytest.skip.Exception as e:
        res = {"outcome": "skipped", "reason": str(e.msg)}
    except (Exception, pytest.fail.Exception):  # noqa: BLE001 - every failure is reported to the parent
        res = {"outcome": "failed", "longrepr": traceback.format_exc()[-8000:]}
    res["found"] = STATE.get("found", {})
    res["restart"] = bool(STATE.get("restart"))
    return res


def main(argv: list[str]) -> int:
    fd = int(argv[0])
    cfg = json.loads(sys.stdin.readline())
    for mod in cfg.get("imports", []):
        importlib.import_module(mod)
    from multidev.registry import configure_virtual_devices

    configure_virtual_devices(int(cfg.get("virtual_devices", 4)))
    specs = cfg.get("specs", {})
    for line in sys.stdin:
        if not line.strip():
            continue
        res = _run(json.loads(line), specs)
        os.write(fd, (json.dumps(res, default=str) + "\n").encode())
        if res["restart"]:
            break
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
