"""The one error taxonomy of multidev, and the one place where a framework's exception becomes one of
its errors (:class:`translate_errors`, :func:`framework_error`).

Every error multidev raises on purpose is a :class:`MultidevError`. Each class also derives from the
builtin exception a caller would naturally catch (``ValueError``, ``LookupError``, ...), so code that
does not know multidev still handles them sensibly.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal, NoReturn, TypeVar

__all__ = [
    "AdapterError",
    "BackendError",
    "BackendNotAvailableError",
    "CapabilityError",
    "CollectiveInputError",
    "CollectiveMismatchError",
    "DeviceMismatchError",
    "DeviceNotFoundError",
    "DistributedError",
    "DistributedSetupError",
    "DistributedTimeoutError",
    "InvalidArgumentError",
    "InvalidDeviceError",
    "InvalidDtypeError",
    "MultidevError",
    "OutOfMemoryError",
    "ReplicaMismatchError",
    "ScopeError",
    "UnsupportedTensorError",
]


class MultidevError(Exception):
    """Base class of every error multidev raises on purpose."""


class InvalidDeviceError(MultidevError, ValueError):
    """A device spelling or object that multidev cannot parse."""


class InvalidArgumentError(MultidevError, ValueError):
    """An argument multidev refuses before any framework sees it: a shape, fill value, range, seed
    or object it cannot represent exactly. The message names the argument, the value and what is
    accepted."""


class InvalidDtypeError(MultidevError, TypeError):
    """A dtype spelling multidev does not know, or one it refuses (strings, objects, datetimes)."""


class DeviceNotFoundError(MultidevError, LookupError):
    """A well-formed device that the backend does not have (``gpu:3`` on a machine with one GPU)."""


class DeviceMismatchError(MultidevError, ValueError):
    """Operands that must share a device do not."""


class BackendNotAvailableError(MultidevError, ImportError):
    """A backend that is unknown, or whose framework is not installed or cannot be imported."""


class AdapterError(BackendNotAvailableError, TypeError):
    """An adapter that does not follow the protocol (a missing method, attribute or capability): found
    when it is loaded, with one line per problem."""


class UnsupportedTensorError(MultidevError, TypeError):
    """An object that no registered backend recognises as its tensor."""


class CapabilityError(MultidevError, NotImplementedError):
    """The backend lacks a capability the call needs (in-place writes on JAX, float64 without x64, ...)."""


class CollectiveInputError(MultidevError, ValueError):
    """Invalid inputs to a collective: empty, mixed backends, shapes, dtypes or repeated devices."""


class BackendError(MultidevError, RuntimeError):
    """A framework raised an error multidev did not foresee; the framework's message is kept and the
    original exception is the ``__cause__``."""


class OutOfMemoryError(BackendError, MemoryError):
    """The framework could not allocate the memory a call needs (host or device); its message, with
    the size it tried, is kept and the original exception is the ``__cause__``."""


class DistributedError(MultidevError, RuntimeError):
    """A multi-process collective failed, or was called before ``distributed.init`` / after a failure."""


class CollectiveMismatchError(DistributedError, CollectiveInputError):
    """The ranks of a multi-process collective disagree: another collective, op, root, axis, dtype or
    shape on some rank. Raised on every rank, naming what each passed; the group stays usable."""


class DistributedTimeoutError(DistributedError, TimeoutError):
    """Another rank died, hung or never arrived: the collective (or init) gave up after its timeout,
    or as soon as the peer's connection closed."""


class DistributedSetupError(DistributedError, InvalidArgumentError):
    """A malformed or inconsistent setting of the process group: an argument of ``init``, a
    launcher's variable that is no integer or out of range, variables left by a launcher that did not
    start this process, a rendezvous port already taken. Raised at once, before anything waits,
    naming the setting and the fix; a ``ValueError`` as well as a ``DistributedError``."""


class ReplicaMismatchError(MultidevError, RuntimeError):
    """Data-parallel replicas that should be bitwise equal are not (``data_parallel(verify=True)``,
    :meth:`multidev.DataParallel.verify`): the message names the first parameter or buffer that
    differs and the devices or ranks holding the two values."""


class ScopeError(MultidevError, RuntimeError, ValueError):
    """A :func:`multidev.device_scope` used out of its order: exited twice, before a scope entered
    inside it (out of order), or from another thread or context than the one that entered it. The
    message names the scope; no thread's scope state is left changed by the refused exit."""


# -- framework errors that escape an adapter -------------------------------------------------------
_OOM_NAMES = {"ResourceExhaustedError", "OutOfMemoryError"}
_OOM_TEXT = ("resource_exhausted", "out of memory", "can't allocate memory", "oom when allocating",
             "failed to allocate", "cannot allocate memory", "std::bad_alloc")
_ARGUMENT_NAMES = {"InvalidArgumentError", "OutOfRangeError"}  # TF's OpError classes (no ValueError base)
_UNIMPLEMENTED_NAMES = {"UnimplementedError"}


def framework_error(e: BaseException, what: str) -> MultidevError:
    """The MultidevError for framework exception ``e`` that escaped an adapter during ``what``
    (``e`` itself when it is one already): running out of memory is OutOfMemoryError, a refused
    argument (ValueError, TypeError, IndexError, TF's InvalidArgumentError) InvalidArgumentError,
    a missing kernel (NotImplementedError, TF's UnimplementedError) CapabilityError, anything else
    BackendError. The message names the framework and keeps the framework's own; raise it ``from e``."""
    if isinstance(e, MultidevError):
        return e
    names = {c.__name__ for c in type(e).__mro__}
    framework = type(e).__module__.split(".")[0]
    text = str(e).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    first = lines[0] if lines else ""
    if first.startswith("Traceback") and len(lines) > 1:
        first = lines[-1]  # MXNet's messages carry a C++ stack first; the reason is its last line
    if len(first) > 400:
        first = first[:397] + "..."
    origin = type(e).__name__ if framework == "builtins" else f"{framework} {type(e).__name__}"
    msg = f"{what}: {origin}: {first}" if first else f"{what}: {origin}"
    low = text.lower()
    if isinstance(e, MemoryError) or names & _OOM_NAMES or any(t in low for t in _OOM_TEXT):
        return OutOfMemoryError(msg)
    if isinstance(e, NotImplementedError) or names & _UNIMPLEMENTED_NAMES:
        return CapabilityError(msg)
    if isinstance(e, (ValueError, TypeError, IndexError, OverflowError)) or names & _ARGUMENT_NAMES:
        return InvalidArgumentError(msg)
    return BackendError(msg)


F = TypeVar("F", bound=Callable[..., Any])


class translate_errors:
    """The one place where a framework exception escaping an adapter call becomes its
    MultidevError (:func:`framework_error`, raised ``from`` the original): a MultidevError passes
    as it is, and so do BaseExceptions that are not Exceptions (KeyboardInterrupt, SystemExit).

    As a context manager, ``with translate_errors("torch move"):``; as a decorator,
    ``@translate_errors("allreduce")`` (the function's name when ``what`` is omitted) or
    ``translate_errors(what)(fn)`` for a function made at run time. ``what`` names the call in the
    message; pass a zero-argument callable to build the name only when an error happens."""

    __slots__ = ("what",)

    def __init__(self, what: str | Callable[[], str] | None = None) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, tp: Any, e: BaseException | None, tb: Any) -> Literal[False]:
        if e is None or isinstance(e, MultidevError) or not isinstance(e, Exception):
            return False
        what = self.what
        raise framework_error(e, what() if callable(what) else str(what)) from e

    def reraise(self, e: BaseException) -> NoReturn:
        """Raise ``e`` as this context manager would at its exit: a MultidevError (or a BaseException
        that is no Exception) as it is, anything else as its MultidevError ``from e``.

        For hot paths (a no-op ``to``, ``synchronize`` of an idle tensor): they call the framework
        inside ``try: ... except Exception as e: T.reraise(e)``, which costs nothing until something
        raises, where entering and leaving the context manager costs two method calls per call. The
        translation itself stays here, in one place."""
        if isinstance(e, MultidevError) or not isinstance(e, Exception):
            raise e
        what = self.what
        raise framework_error(e, what() if callable(what) else str(what)) from e

    def __call__(self, fn: F) -> F:
        what = self.what if self.what is not None else getattr(fn, "__name__", "call")

        @functools.wraps(fn)
        def translated(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except MultidevError:
                raise
            except Exception as e:
                raise framework_error(e, what() if callable(what) else str(what)) from e
        return translated  # type: ignore[return-value]
