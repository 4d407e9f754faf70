"""The benchmark definitions behind ``multidev.benchmarks``: goals, cases, variants, the registry
and the context a benchmark runs in."""
from __future__ import annotations

import importlib
import importlib.util
import pathlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from multidev import Device

__all__ = ["OPT_IN", "SUITES", "Benchmark", "Case", "Context", "GiB", "Goal", "KiB", "MiB", "Variant", "all_ok",
           "benchmark", "close", "fmt_bytes", "goals", "iter_cases", "load_all", "registry"]

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

#: Suite modules in report order (module name -> suite name).
SUITES = {"overhead": "overhead", "asynchronous": "async", "autoparallel": "autoparallel",
          "bandwidth": "bandwidth", "collectives": "collectives", "distributed": "distributed",
          "compilation": "compile", "models": "models"}
#: Suite modules loaded for ``--suite NAME`` and ``--list`` but not run by default (slow, or
#: about the machine rather than the calls): start-up times in fresh interpreters.
OPT_IN = {"startup": "startup", "mesh": "mesh"}


@dataclass(frozen=True)
class Goal:
    """A target a suite sets for its rows, checked on every result of ``group``.

    ``metric``:

    - ``"time_ratio"``: median(``num``) / max(median of ``den``) <= ``target`` (e.g. md / native);
    - ``"speedup"``: max(median of ``den``) / median(``num``) >= ``target`` (e.g. book / md);
    - ``"GBps"``: the payload rate of ``num`` >= ``target`` (GB/s, 10**9 bytes);
    - ``"GBps_ratio"``: GB/s of ``num`` / max(GB/s of ``den``) >= ``target``;
    - ``"time_ratio_best"``: median(``num``) / min(median of ``den``) <= ``target`` (e.g. md / the
      fastest native route);
    - ``"seconds"``: median(``num``) <= ``target`` seconds;
    - ``"bound_ratio"``: the row's bound time (``rec["bound"]["time_s"]``, from the hardware bound
      measured in the same run) / min(median of ``den``) >= ``target`` (1: at the bound).

    A ``den`` name ending in ``*`` stands for every variant of the row with that prefix
    (``"native:*"``), at least one.

    ``gpu_only``: judged only on rows that involve an accelerator; ``min_bytes``/``max_bytes``:
    only on rows with that payload. A row lacking a variant the goal needs is not judged.
    """

    name: str
    group: str
    target: float
    metric: str = "time_ratio"
    num: str = "md"
    den: tuple[str, ...] = ("native",)
    gpu_only: bool = False
    min_bytes: int | None = None
    max_bytes: int | None = None
    note: str = ""
    #: ``time_ratio`` goals of thin calls: also met where ``num`` costs at most this many seconds
    #: more than the slowest ``den`` (a ratio means little against a native call of 60 ns).
    slack_s: float | None = None
    #: judged only on rows whose ``params`` hold these items (e.g. ``{"n": 2}``)
    where: tuple[tuple[str, Any], ...] = ()

    def applies(self, rec: dict[str, Any]) -> bool:
        if rec.get("group") != self.group or not rec.get("variants"):
            return False
        if self.gpu_only and not any(str(d).startswith(("gpu", "mps")) for d in rec.get("devices", [])):
            return False
        params = rec.get("params") or {}
        if any(params.get(k) != v for k, v in self.where):
            return False
        n = rec.get("bytes")
        if self.min_bytes is not None and (n is None or n < self.min_bytes):
            return False
        return not (self.max_bytes is not None and (n is None or n > self.max_bytes))

    def variants_of(self, rec: dict[str, Any]) -> list[str]:
        """The variants of ``rec`` this goal reads (``num`` and the ``den`` names, patterns expanded)."""
        v = rec.get("variants") or {}
        out = [self.num]
        for d in self.den:
            out += sorted(k for k in v if k.startswith(d[:-1])) if d.endswith("*") else [d]
        return out

    def above_s(self, rec: dict[str, Any]) -> float | None:
        """Seconds ``num`` costs beyond the slowest ``den`` (time goals), or None."""
        v = rec.get("variants") or {}
        names = self.variants_of(rec)
        ms = [(v.get(k) or {}).get("median_s") for k in names]
        vals = [float(m) for m in ms if m is not None]
        if len(vals) != len(ms) or len(vals) < 2:
            return None
        return vals[0] - max(vals[1:])

    def judge(self, rec: dict[str, Any]) -> tuple[float, bool] | None:
        """``(value, met)`` on ``rec``, or None where a variant is missing: :meth:`met`, or for a
        goal with ``slack_s`` at most that many seconds above the native call."""
        value = self.value(rec)
        if value is None:
            return None
        ok = self.met(value)
        if not ok and self.slack_s is not None:
            above = self.above_s(rec)
            ok = above is not None and above <= self.slack_s
        return value, ok

    def value(self, rec: dict[str, Any]) -> float | None:
        """The measured figure this goal judges on ``rec``, or None where a variant is missing."""
        v = rec["variants"]

        def med(name: str) -> float | None:
            x = v.get(name) or {}
            return x.get("median_s")

        def rate(name: str) -> float | None:
            x = v.get(name) or {}
            return x.get("GBps")

        den: list[str] = []
        for d in self.den:
            den += sorted(k for k in v if k.startswith(d[:-1])) if d.endswith("*") else [d]
        if not den:
            return None
        if self.metric == "GBps":
            return rate(self.num)
        if self.metric == "seconds":
            return med(self.num)
        if self.metric == "bound_ratio":
            bt = (rec.get("bound") or {}).get("time_s")
            ms = [med(d) for d in den]
            if bt is None or any(m is None for m in ms):
                return None
            return float(bt) / min(float(m) for m in ms if m is not None)
        if self.metric == "GBps_ratio":
            a, bs = rate(self.num), [rate(d) for d in den]
            if a is None or any(b is None for b in bs) or not bs:
                return None
            return a / max(b for b in bs if b is not None)
        a, ms = med(self.num), [med(d) for d in den]
        if a is None or not ms or any(m is None for m in ms) or a <= 0:
            return None
        if self.metric == "time_ratio_best":
            return a / min(m for m in ms if m is not None)
        ref = max(m for m in ms if m is not None)
        return a / ref if self.metric == "time_ratio" else ref / a

    def met(self, value: float) -> bool:
        low = self.metric.startswith("time_ratio") or self.metric == "seconds"
        return value <= self.target if low else value >= self.target

    def describe(self) -> str:
        rel = "<=" if self.metric.startswith("time_ratio") or self.metric == "seconds" else ">="
        what = {"time_ratio": f"{self.num} / max({', '.join(self.den)})",
                "time_ratio_best": f"{self.num} / min({', '.join(self.den)})",
                "speedup": f"max({', '.join(self.den)}) / {self.num}",
                "GBps": f"{self.num} GB/s", "GBps_ratio": f"{self.num} GB/s / max({', '.join(self.den)} GB/s)",
                "bound_ratio": f"the row's bound time / min({', '.join(self.den)})",
                "seconds": f"{self.num} seconds"}
        extra = f", or at most {self.slack_s * 1e6:g} µs above" if self.slack_s is not None else ""
        return f"{what[self.metric]} {rel} {self.target:g}{extra}"


def goals() -> list[tuple[Benchmark, Goal]]:
    """Every goal of the registered benchmarks, with its benchmark."""
    return [(b, g) for b in registry() for g in b.goals]


@dataclass
class Variant:
    """One way of doing the row's operation, timed as ``fn(*args)``.

    - ``finish(result)``: called on the last result, inside the clock (e.g. wait for that tensor).
    - ``sync``: synchronize every device of the case before stopping the clock (default). ``False``
      only for rows that measure dispatch on purpose; the runner then syncs after the clock stops.
    - ``inner``: calls per sample; ``None`` lets the runner batch fast calls up to ~1 ms a sample.
    - ``label``: the call, as a reader would write it (kept in the JSON).
    - ``self_timed``: ``fn(*args)`` returns the sample's seconds itself (a subprocess that times its
      own import, say): the runner's clock is not used, one call per sample.
    """

    fn: Callable[..., Any]
    args: tuple = ()
    finish: Callable[[Any], Any] | None = None
    sync: bool = True
    inner: int | None = None
    label: str = ""
    self_timed: bool = False


@dataclass
class Case:
    """One row: variants timed in the same run, devices synchronized around each sample.

    ``ratio`` names the variants whose median ratio is reported (numerator, denominator);
    ``bytes`` (payload per call) turns times into GB/s; ``busbw_factor`` turns algbw into busbw.
    ``check`` runs once, untimed, after warm-up; it returns ``(ok, detail)`` or a bool.
    """

    name: str
    variants: dict[str, Variant | None]
    devices: Sequence[Device] = ()
    check: Callable[[], Any] | None = None
    params: dict[str, Any] = field(default_factory=dict)
    bytes: int | None = None
    busbw_factor: float | None = None
    ratio: tuple[str, str] | None = ("md", "native")
    group: str | None = None  # plot/table grouping key within a benchmark (e.g. "H2D")
    key: str | None = None  # the row label in the side-by-side table (default: name); rows of
    # different backends with one key share a table row (e.g. "D2D 1 MiB" on cpu:0->cpu:1 and cpu:0)
    before: Callable[[], Any] | None = None  # called before every sample, untimed (e.g. a barrier)
    #: the least memory traffic the operation needs, in copies of ``bound_bytes`` (default
    #: ``bytes``): the runner turns it into the row's bound (``rec["bound"]``) with the memcpy
    #: bandwidth measured in the same run (:mod:`.bounds`); None: no such bound
    bound_copies: float | None = None
    bound_bytes: int | None = None


@dataclass
class Benchmark:
    suite: str
    name: str
    fn: Callable[[Context], Iterable[Case]]
    precision: bool  # runs once per requested precision mode (matmul-heavy)
    doc: str
    goals: tuple[Goal, ...] = ()


_REGISTRY: list[Benchmark] = []


def benchmark(suite: str, *, name: str | None = None, precision: bool = False, goals: Sequence[Goal] = ()
              ) -> Callable[[Callable[[Context], Iterable[Case]]], Callable[[Context], Iterable[Case]]]:
    """Register ``fn(ctx) -> Iterable[Case]`` in ``suite``. ``precision=True`` for matmul-bound
    benchmarks: they run once per precision mode (fp32, tf32), each labelled. ``goals``: the
    targets its rows are judged by (:class:`Goal`)."""
    def deco(fn: Callable[[Context], Iterable[Case]]) -> Callable[[Context], Iterable[Case]]:
        bname = name or fn.__name__
        for i, b in enumerate(_REGISTRY):
            if b.suite == suite and b.name == bname:
                del _REGISTRY[i]  # re-registration (reloaded file) replaces
                break
        _REGISTRY.append(Benchmark(suite, bname, fn, precision, (fn.__doc__ or "").strip().split("\n")[0],
                                   tuple(goals)))
        return fn
    return deco


def load_all(extra_files: Sequence[str] = ()) -> list[Benchmark]:
    """Import every built-in suite module (and extra definition files); return the registry."""
    for mod in (*SUITES, *OPT_IN):
        importlib.import_module(f"{__package__}.{mod}")
    for path in extra_files:
        p = pathlib.Path(path)
        spec = importlib.util.spec_from_file_location(f"multidev_bench_user_{p.stem}", p)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load benchmark file {path}")
        m = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(m)
    return registry()


def registry() -> list[Benchmark]:
    """Every registered benchmark, in report order of its suite (:data:`SUITES`)."""
    order = list(SUITES.values())
    return sorted(_REGISTRY, key=lambda b: (order.index(b.suite) if b.suite in order else len(order)))


@dataclass
class Context:
    """What a benchmark function gets: the backend under test, its devices and the run's settings."""

    backend: str
    b: Any  # the adapter (multidev.protocol.Backend)
    native: Any  # a _native.Native for the framework, or None (third-party backend: md rows only)
    devices: list[Device]
    quick: bool
    precision: str  # "fp32", "tf32" or "default": the mode this benchmark runs under
    options: dict[str, Any] = field(default_factory=dict)
    #: the run's measured bounds (``{"memcpy": ...}``, :mod:`.bounds`)
    bounds: dict[str, Any] = field(default_factory=dict)
    #: the largest payload a size sweep goes to (``--max-bytes``), or None for the suite's own
    max_bytes: int | None = None

    def sweep(self, sizes: Sequence[int]) -> list[int]:
        """``sizes`` up to ``--max-bytes`` (all of them without it)."""
        return [n for n in sizes if self.max_bytes is None or n <= self.max_bytes]

    @property
    def gpus(self) -> list[Device]:
        return [d for d in self.devices if d.is_gpu]

    @property
    def cpus(self) -> list[Device]:
        return [d for d in self.devices if not d.is_gpu]

    @property
    def dev(self) -> Device:
        """The primary device: the first GPU if any, else the first CPU device."""
        return (self.gpus or self.devices)[0]

    @property
    def host(self) -> Device:
        return Device("cpu", 0)

    @property
    def accelerated(self) -> bool:
        return bool(self.gpus)

    def pick(self, quick: Any, cpu: Any, gpu: Any) -> Any:
        """A size by scale: tiny for --quick, scaled down on CPU-only runs, full on a GPU."""
        return quick if self.quick else gpu if self.accelerated else cpu

    def ndev(self, d: Device | None) -> Device | None:
        """``d`` for checking where a native result lives, or None where the native side has no
        devices multidev can read back (NumPy)."""
        return d if self.native is not None and self.native.tracks_devices else None

    def native_call(self, op: str, *args: Any) -> Variant | None:
        """A Variant for the framework's own ``op`` (see _native), or None where it has none."""
        if self.native is None:
            return None
        spec = self.native.call(op, *args)
        if spec is None:
            return None
        fn, a, label = spec
        return Variant(fn, a, label=label)


def close(x: Any, ref: np.ndarray, *, rtol: float = 1e-5, atol: float | None = None,
          device: Device | None = None) -> tuple[bool, str]:
    """Untimed check: ``x`` (any backend's tensor, or ndarray) equals ``ref`` within tolerance,
    and lives on ``device`` when given. ``atol`` defaults to ``rtol * max|ref|``."""
    import multidev as md

    try:
        # A host array is read as is (asking md would load the NumPy adapter into a run that
        # times md.synchronize over the loaded backends); plain view: no virtual-device tag.
        got = (x if isinstance(x, np.ndarray) else np.asarray(md.to_numpy(x))).view(np.ndarray)
        if device is not None:
            where = md.device_of(x)
            if where != device:
                return False, f"on {where}, expected {device}"
    except Exception as e:  # noqa: BLE001 - a check reports, never raises
        return False, f"{type(e).__name__}: {e}"
    ref = np.asarray(ref).view(np.ndarray)
    if got.shape != ref.shape:
        return False, f"shape {got.shape} != {ref.shape}"
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    tol = atol if atol is not None else rtol * max(scale, 1.0)
    err = float(np.max(np.abs(got.astype(np.float64) - ref.astype(np.float64)))) if ref.size else 0.0
    ok = bool(err <= tol)
    return ok, f"max abs err {err:.3g} (tol {tol:.3g})"


def all_ok(*checks: tuple[bool, str]) -> tuple[bool, str]:
    """Combine several ``(ok, detail)`` checks; the details of failing ones come first."""
    ok = all(c[0] for c in checks)
    bad = [c[1] for c in checks if not c[0]]
    return ok, "; ".join(bad or [c[1] for c in checks])


def fmt_bytes(n: int) -> str:
    """``n`` bytes as a short label (``"16 MiB"`` where it is a whole number of them, else bytes)."""
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def iter_cases(bm: Benchmark, ctx: Context) -> Iterator[Case]:
    """The cases benchmark ``bm`` yields on context ``ctx``."""
    yield from bm.fn(ctx)
