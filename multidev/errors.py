"""The one error taxonomy of multidev.

Every error multidev raises on purpose is a :class:`MultidevError`. Each class also derives from the
builtin exception a caller would naturally catch (``ValueError``, ``LookupError``, ...), so code that
does not know multidev still handles them sensibly.
"""
from __future__ import annotations

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
