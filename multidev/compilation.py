"""``multidev.compile``: one call for every framework's compiler (D2L 12.1, imperative vs compiled).

``md.compile(fn, backend=...)`` returns a :class:`Compiled` that is called exactly as ``fn`` is and
returns what ``fn`` returns, on the inputs' device. The framework's routes (``compile_routes`` of its
adapter) are the framework's own compilers: ``torch.jit.script``, ``jax.jit``, ``tf.function``,
Gluon's ``hybridize``, the identity for NumPy, and ``eager`` (``fn`` as it is).

``route="auto"`` (the default) chooses by measurement, once, on the first call: every route the
adapter marks for measuring is compiled and timed on that call's arguments (calls pipelined in
batches, each batch waited for), and the fastest is kept; the route taken and the timings are
recorded on the result (``.route``, ``.timings``; routes that cannot compile ``fn`` in ``.errors``).
Measuring calls ``fn`` a few dozen times on those arguments, so ``fn`` must be free of side effects
(as every compiler assumes); name a route (``route="jax.jit"``) to compile without measuring.
Written once over the adapter protocol: nothing here names a framework.
"""
from __future__ import annotations

import functools
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from .errors import CapabilityError, InvalidArgumentError, UnsupportedTensorError
from .protocol import Backend
from .registry import backend_of, get_backend

__all__ = ["MEASURE_BUDGET_S", "Compiled", "compile"]

#: Seconds of timed calls per measured route (after two warm-up calls), at least three batches.
MEASURE_BUDGET_S = 0.05
_MAX_BATCHES = 15
_BATCH_S = 1e-3  # calls are pipelined in batches of about this long, then waited for


def compile(fn: Any, backend: str | None = None, *, route: str = "auto") -> Compiled:
    """``fn`` compiled by the framework's own compiler, called and returning as ``fn`` does.

    - ``backend``: the framework (default: the backend of the first call's first tensor argument,
      else the default backend).
    - ``route``: ``"auto"`` (measure the adapter's candidates on the first call, keep the fastest;
      ``fn`` must be free of side effects) or one of the backend's routes
      (``md.backend(name).compile_routes(fn)``), compiled without measuring.

    Raises CapabilityError where the framework cannot compile ``fn`` (saying why), and
    InvalidArgumentError for an unknown route. Compilation is lazy: it happens on the first call
    (tracing compilers need its arguments); later calls go straight to the compiled function.
    """
    if not callable(fn):
        raise InvalidArgumentError(f"compile takes a function or a framework module, got {type(fn).__name__}")
    if not isinstance(route, str) or not route:
        raise InvalidArgumentError(f"compile: route must be a route name or 'auto', got {route!r:.40}")
    c = Compiled(fn, route)
    if backend is not None:
        c._bind(get_backend(backend))
    return c


class Compiled:
    """``fn`` behind the route chosen for it (see :func:`compile`). Call it as ``fn``.

    Attributes: ``fn`` (the original), ``backend`` (the backend's name; None until known),
    ``route`` (the route taken; None before the first call under ``auto``), ``timings`` (route ->
    seconds per call, as measured by ``auto``), ``errors`` (route -> why it could not compile
    ``fn``), ``routes`` (every route the backend offers for ``fn`` -> whether ``auto`` measures it).
    """

    def __init__(self, fn: Any, route: str) -> None:
        functools.update_wrapper(self, fn, updated=())  # name and doc; fn's own __dict__ stays its own
        self.fn = fn
        self.backend: str | None = None
        self.route: str | None = None
        self.timings: dict[str, float] = {}
        self.errors: dict[str, str] = {}
        self.routes: dict[str, bool] = {}
        self._wanted = route
        self._b: Any = None  # the adapter, a SupportsCompile
        self._call: Callable[..., Any] | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        name = getattr(self.fn, "__qualname__", type(self.fn).__name__)
        return f"<multidev.Compiled {name} backend={self.backend} route={self.route or self._wanted}>"

    def _bind(self, b: Backend) -> None:
        compiler = b.compiler
        if compiler is None:
            raise CapabilityError(f"{b.name} backend has no compiler (its compiler concern is None); "
                                  "call the function as it is")
        self.routes = dict(compiler.compile_routes(self.fn))
        if self._wanted != "auto" and self._wanted not in self.routes:
            raise InvalidArgumentError(f"compile: {b.name} has no route {self._wanted!r} for this function; "
                                       f"its routes: {', '.join(self.routes)} (or 'auto')")
        self._b = b
        self.backend = b.name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        call = self._call
        if call is not None:
            return call(*args, **kwargs)
        with self._lock:
            if self._call is None:
                self._first(args, kwargs)
        assert self._call is not None
        return self._call(*args, **kwargs)

    # -- the first call ------------------------------------------------------------------------
    def _first(self, args: tuple, kwargs: dict[str, Any]) -> None:
        if self._b is None:
            self._bind(_infer_backend(args, kwargs))
        b = self._b
        assert b is not None
        if self._wanted != "auto":
            self._call = b.compiler.compile(self.fn, self._wanted, args)
            self.route = self._wanted
            return
        candidates = [r for r, measured in self.routes.items() if measured]
        if not candidates:
            raise CapabilityError(f"{b.name} backend marks no route of {', '.join(self.routes)} for "
                                  "measuring; pass route= explicitly")
        if len(candidates) == 1:
            self._call = b.compiler.compile(self.fn, candidates[0], args)
            self.route = candidates[0]
            return
        compiled: dict[str, Callable[..., Any]] = {}
        failures: dict[str, BaseException] = {}
        applied = None  # the last route that reconfigured fn itself (hybridize)
        for r in candidates:
            try:
                f = b.compiler.compile(self.fn, r, args)
                if f is self.fn:
                    applied = r
                self.timings[r] = _time(b, f, args, kwargs)
            except CapabilityError as e:
                self.errors[r] = str(e)
                continue
            except Exception as e:  # noqa: BLE001 - a route that fails on these arguments is skipped;
                # fn's own error is raised below when no route runs it
                self.errors[r] = f"{type(e).__name__}: {e}"
                failures[r] = e
                continue
            compiled[r] = f
        if not [r for r in compiled if r != "eager"]:
            if "eager" in failures:
                raise failures["eager"]  # fn itself fails on these arguments: its own error
            prefix = f"{b.name} backend: "
            why = "; ".join(f"{r}: {m.removeprefix(prefix)}" for r, m in self.errors.items())
            name = getattr(self.fn, "__qualname__", type(self.fn).__name__)
            raise CapabilityError(f"{b.name} backend cannot compile {name} ({why}); call it as it is, "
                                  "or pass route='eager'") from next(iter(failures.values()), None)
        best = min(compiled, key=lambda r: self.timings[r])
        f = compiled[best]
        if f is self.fn and applied != best:
            f = b.compiler.compile(self.fn, best, args)  # reapply the chosen configuration
        self.route = best
        self._call = f


def _infer_backend(args: tuple, kwargs: dict[str, Any]) -> Backend:
    for a in list(args) + list(kwargs.values()):
        try:
            return backend_of(a)
        except UnsupportedTensorError:
            continue
    return get_backend(None)


def _wait(b: Backend, out: Any) -> None:
    """Wait for every tensor of ``b`` in ``out`` (nested lists, tuples and dicts)."""
    if isinstance(out, (list, tuple)):
        for o in out:
            _wait(b, o)
    elif isinstance(out, dict):
        for o in out.values():
            _wait(b, o)
    elif isinstance(out, b.tensor_types()):
        b.wait(out)


def _time(b: Backend, f: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> float:
    """Seconds per call of ``f(*args, **kwargs)``: two warm-up calls (compilation), then the median of
    batches of pipelined calls, each batch waited for, within :data:`MEASURE_BUDGET_S`."""
    _wait(b, f(*args, **kwargs))
    t0 = time.perf_counter()
    _wait(b, f(*args, **kwargs))
    one = max(time.perf_counter() - t0, 1e-7)
    k = int(min(100, max(1, math.ceil(_BATCH_S / one))))
    samples: list[float] = []
    end = time.perf_counter() + MEASURE_BUDGET_S
    while len(samples) < 3 or (len(samples) < _MAX_BATCHES and time.perf_counter() < end):
        t0 = time.perf_counter()
        out = None
        for _ in range(k):
            out = f(*args, **kwargs)
        _wait(b, out)
        samples.append((time.perf_counter() - t0) / k)
    samples.sort()
    return samples[len(samples) // 2]
