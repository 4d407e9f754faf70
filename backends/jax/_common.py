"""What several files of the JAX adapter share."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from multidev import hostpool
from multidev.adapter import CapabilityError, aligned_empty

X64_DTYPES = frozenset({"int64", "uint64", "float64", "complex128"})


#: The 32-bit dtype JAX holds in place of each 64-bit one.
NARROW = {"int64": "int32", "uint64": "uint32", "float64": "float32", "complex128": "complex64"}


def x64_hint(dtype: str | None = None) -> str:
    """How to get ``dtype`` (a 64-bit dtype) onto JAX: 64-bit mode, or the 32-bit dtype asked for."""
    narrow = NARROW.get(dtype or "")
    also = (f", or ask for dtype={narrow!r} (a NumPy array is cast: md.asarray(a, dtype={narrow!r}, "
            "backend='jax'))") if narrow else ""
    return f"enable 64-bit types with jax.config.update('jax_enable_x64', True){also}"


def own_copy(a: np.ndarray, dtype: Any = None) -> np.ndarray:
    """A C-contiguous copy of the caller's NumPy array ``a`` (cast to ``dtype`` as ``astype`` casts)
    that only JAX will read: from 256 KiB aligned, which a CPU device shares, and from the host pool
    (no page faults); smaller, a plain copy (cheaper than the alignment; JAX's second copy costs
    little)."""
    dt = a.dtype if dtype is None else np.dtype(dtype)
    if a.size * dt.itemsize >= hostpool.MIN_BYTES:
        out = aligned_empty(a.shape, dt)
        np.copyto(out, a, casting="unsafe")
        return out
    return np.array(a, dtype=dt, order="C")


def own_host_arrays(jax: Any, batch: Any, leaves: Sequence[Any]) -> Any:
    """``batch`` (whose leaves are ``leaves``) with each NumPy array among them replaced by
    :func:`own_copy` of it, or ``batch`` itself where none is one. JAX reads a NumPy argument of a
    jitted step or ``device_put`` after the call returns (a CPU device shares an aligned one, an
    accelerator's transfer reads it when it runs): with its own copies, a step is done with the
    caller's arrays when it returns."""
    for x in leaves:
        if host_array(x):
            return jax.tree_util.tree_map(lambda v: own_copy(v) if host_array(v) else v, batch)
    return batch


def host_array(x: Any) -> bool:
    """Whether ``x`` is a NumPy array JAX would read as such (a subclass too: ``np.memmap``; not a
    masked array, which JAX refuses and a copy would unmask)."""
    return isinstance(x, np.ndarray) and not isinstance(x, np.ma.MaskedArray)


class LossCache:
    """The jitted functions made for each loss function, by the loss function: a plain function, a
    bound method (a new object on every attribute read, equal to the last: a weak-keyed cache lost
    it at once and recompiled every step) or any hashable callable. At most ``size`` entries, the
    oldest dropped first (a loss made anew every step, e.g. a lambda, compiles every step anyway);
    an unhashable callable is not cached."""

    def __init__(self, size: int = 64) -> None:
        self._fns: dict[Any, Any] = {}
        self._size = size

    def get(self, key: Any) -> Any:
        try:
            return self._fns.get(key)
        except TypeError:
            return None

    def put(self, key: Any, fn: Any) -> Any:
        try:
            if len(self._fns) >= self._size:
                self._fns.pop(next(iter(self._fns)))
            self._fns[key] = fn
        except TypeError:
            pass
        return fn


def is_train_state(obj: Any) -> bool:
    """A flax ``TrainState``, or any object like it."""
    return all(hasattr(obj, a) for a in ("params", "opt_state", "tx", "apply_gradients", "replace"))


def trainable(jax: Any, model: Any, optimizer: Any, call: str) -> tuple[bool, Any] | None:
    """``(is a TrainState, its parameter tree)`` of a model data_parallel takes (a tree of
    ``jax.Array`` with an optax transformation, or a TrainState without one); None where ``model``
    is no JAX tree; InvalidArgumentError for an optimizer that does not fit (``call``: how to call
    it with a TrainState)."""
    from multidev.adapter import InvalidArgumentError

    state = is_train_state(model)
    params = model.params if state else model
    arrays = jax.tree_util.tree_leaves(params)
    if not arrays or not all(isinstance(a, jax.Array) for a in arrays):
        return None
    if state and optimizer is not None:
        raise InvalidArgumentError(f"data_parallel: a TrainState carries its own optimizer (its tx): pass {call}")
    if not state and not (callable(getattr(optimizer, "init", None)) and callable(getattr(optimizer, "update", None))):
        raise InvalidArgumentError(f"data_parallel: JAX parameters train with an optax GradientTransformation "
                                   f"(init and update), got {type(optimizer).__name__}")
    return state, params


def refuse_uneven(layout: Any, shape: Any, hint: str = "") -> None:
    """CapabilityError where ``layout`` cuts a dimension of ``shape`` into pieces of several sizes
    (a ``NamedSharding`` places pieces of one size only)."""
    odd = layout.uneven(shape)
    if odd:
        d, n, k = odd[0]
        raise CapabilityError(f"jax backend: a NamedSharding cuts a dimension into pieces of one size, but "
                              f"dimension {d} of shape {tuple(shape)} has {n} elements for {k} pieces "
                              f"(layout {layout.spec_text()}); pad it to a multiple of {k}{hint}")


# -- an optax transformation over pieces (multidev.managed_sharding) ----------------------------------
# optax transformations do not declare whether their update is element by element (a piece of a
# parameter stepped alone gives that piece of the whole's step). So the update is traced over the
# pieces and its program read: every operation that touches the gradients, the parameters or the
# state's tensors must act element by element (arithmetic, comparisons, ``where``, casts), and every
# other operand a scalar that does not depend on the tensors' shapes, or such a scalar broadcast (a
# learning-rate schedule over the step count is scalar arithmetic). The update is also traced over
# the whole parameters' shapes (abstractly: no memory), and the two programs must be the same but
# for shapes: an update that decides by a shape (Adafactor factors large tensors only; a scale by
# ``x.shape[0]`` or ``x.size``) differs there. A reduction over a tensor (a global norm clip, LAMB's
# trust ratio), a reshape, a position-dependent array, a loop over tensors or a scalar computed from
# a shape refuses it with CapabilityError before anything moves.

#: lax primitives that act element by element (their operands of one shape, or rank-0)
ELEMENTWISE = frozenset({
    "abs", "acos", "acosh", "add", "add_any", "and", "asin", "asinh", "atan", "atan2", "atanh", "cbrt", "ceil",
    "clamp", "conj", "convert_element_type", "copy", "copy_p", "cos", "cosh", "div", "eq", "erf", "erf_inv", "erfc",
    "exp", "exp2", "expm1", "floor", "ge", "gt", "imag", "integer_pow", "is_finite", "le", "lgamma", "digamma",
    "log", "log1p", "logistic", "lt", "max", "min", "mul", "ne", "neg", "nextafter", "not", "optimization_barrier",
    "or", "pow", "real", "reduce_precision", "rem", "round", "rsqrt", "select_n", "sign", "sin", "sinh", "sqrt",
    "square", "stop_gradient", "sub", "tan", "tanh", "xor",
})
#: primitives whose result's shape comes from their operands' (no shape of their own): over constants
#: and scalars only, a constant (a schedule's table of boundaries, stacked and sliced)
_FROM_OPERANDS = frozenset({
    "argmax", "argmin", "concatenate", "cumlogsumexp", "cummax", "cummin", "cumprod", "cumsum", "dot_general",
    "dynamic_slice", "gather", "reduce_and", "reduce_max", "reduce_min", "reduce_or", "reduce_prod", "reduce_sum",
    "rev", "slice", "sort", "squeeze", "stack", "transpose", "expand_dims",
})
#: primitives that call a program on their operands as they are (walked into)
_CALLS = frozenset({"pjit", "jit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call",
                    "custom_vjp_call_jaxpr", "remat", "checkpoint", "remat2"})

# What a value of the traced program is:
_SCALAR = "scalar"  # rank 0, the same for a piece as for the whole (a step count, a learning rate)
_CONST = "const"  # a constant array of the program (a schedule's boundaries): not the tensors' shape
_UNIFORM = "uniform"  # a shape-independent scalar broadcast to a shape (zeros_like)
_SHAPED = "shaped"  # depends on the tensors' shapes or positions (an iota, a sum over a broadcast)
_TENSOR = "tensor"  # derived from the pieces' tensors, element by element


def _subprograms(params: dict[str, Any]) -> list[Any]:
    """The (open) jaxprs among an equation's parameters (a closed one's constants read by shape)."""
    out = []
    for v in params.values():
        for p in (v if isinstance(v, (tuple, list)) else (v,)):
            if hasattr(p, "jaxpr") and hasattr(p, "consts"):
                out.append(p.jaxpr)
            elif hasattr(p, "eqns") and hasattr(p, "invars"):
                out.append(p)
    return out


def _shape(v: Any) -> tuple[int, ...]:
    return tuple(getattr(getattr(v, "aval", None), "shape", ()))


def _refuse(what: str) -> CapabilityError:
    return CapabilityError(f"the update's {what}, so a piece would step differently")


def _merge(column: Sequence[str]) -> str:
    """One status for a value that branches give differently (``cond``)."""
    kinds = set(column)
    if len(kinds) == 1:
        return column[0]
    if _TENSOR in kinds:
        if kinds <= {_TENSOR, _UNIFORM, _SCALAR}:
            return _TENSOR
        raise _refuse("branches give a tensor or a shape-dependent array")
    return _UNIFORM if kinds <= {_SCALAR, _UNIFORM} else _SHAPED


def _walk(jaxpr: Any, ins: Sequence[str]) -> list[str]:
    """The statuses of ``jaxpr``'s outputs given its inputs'; CapabilityError naming the first
    operation that would step a piece otherwise than within the whole."""
    status: dict[Any, str] = {}
    for v in jaxpr.constvars:
        status[v] = _SCALAR if _shape(v) == () else _CONST
    for v, s in zip(jaxpr.invars, ins):
        status[v] = s

    def of(v: Any) -> str:
        if type(v).__name__ == "Literal":
            return _SCALAR if _shape(v) == () else _CONST
        return status.get(v, _SCALAR if _shape(v) == () else _CONST)

    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        ins_ = [of(v) for v in eqn.invars]
        subs = _subprograms(eqn.params)
        scalar_out = all(_shape(o) == () for o in eqn.outvars)
        if name == "cond" and subs:
            if ins_[0] != _SCALAR:
                raise _refuse(f"branch ({name}) is chosen by its tensors or their shapes")
            outs = [_merge(col) for col in zip(*(_walk(s, ins_[1:]) for s in subs))]
        elif name in _CALLS and len(subs) == 1 and len(subs[0].invars) == len(eqn.invars):
            outs = _walk(subs[0], ins_)
        elif _TENSOR in ins_:
            shapes = {_shape(v) for v, s in zip(eqn.invars, ins_) if s == _TENSOR}
            if (name not in ELEMENTWISE or any(s in (_CONST, _SHAPED) for s in ins_) or len(shapes) != 1
                    or any(_shape(o) not in shapes for o in eqn.outvars)):
                raise _refuse(f"{name} acts across elements of a tensor, or with a shape- or position-dependent "
                              "value")
            outs = [_TENSOR] * len(eqn.outvars)
        elif _SHAPED in ins_ or (_UNIFORM in ins_ and name not in ELEMENTWISE and name != "broadcast_in_dim"):
            outs = [_SHAPED] * len(eqn.outvars)  # (a sum over a broadcast counts its elements: a shape)
        elif name == "broadcast_in_dim" and ins_[0] == _SCALAR and not scalar_out:
            outs = [_UNIFORM]
        elif name in ELEMENTWISE:
            kind = _UNIFORM if _UNIFORM in ins_ else _CONST
            outs = [_SCALAR if _shape(o) == () else kind for o in eqn.outvars]
        elif name in _FROM_OPERANDS and ins_:  # (of scalars and constants only)
            outs = [_SCALAR if _shape(o) == () else _CONST for o in eqn.outvars]
        else:  # an iota, random bits, a reshape or broadcast of a constant, a loop: positions or shapes
            outs = [_SHAPED] * len(eqn.outvars)
        for o, st in zip(eqn.outvars, outs):
            status[o] = st
    return [of(v) for v in jaxpr.outvars]


def _program(jaxpr: Any) -> list[Any]:
    """``jaxpr``'s operations and literal values, nested programs included, without shapes: what must
    be alike for the pieces and the whole."""
    out: list[Any] = []
    for eqn in jaxpr.eqns:
        lits = tuple(repr(getattr(v, "val", None)) for v in eqn.invars if type(v).__name__ == "Literal")
        out.append((eqn.primitive.name, len(eqn.invars), len(eqn.outvars), lits,
                    [_program(s) for s in _subprograms(eqn.params)]))
    return out


def elementwise_refusal(jax: Any, tx: Any, pieces: Any, whole: Any) -> str | None:
    """Why ``tx`` (an optax transformation) cannot step ``pieces`` (a parameter tree of pieces of
    ``whole``, a tree of the same structure: arrays or ``jax.ShapeDtypeStruct``) as the whole
    parameters would be stepped; None where its init and update are element by element."""
    tu = jax.tree_util

    def status(tree: Any) -> list[str]:
        return [_SCALAR if getattr(x, "ndim", len(getattr(x, "shape", ()))) == 0 else _TENSOR
                for x in tu.tree_leaves(tree)]

    def update(g: Any, s: Any, p: Any) -> Any:
        return tx.update(g, s, p)
    try:
        init = jax.make_jaxpr(tx.init)(pieces)
        if any(s != _TENSOR and s not in (_SCALAR, _UNIFORM) for s in _walk(init.jaxpr, status(pieces))):
            return "its initial state holds a shape- or position-dependent array"
        state = jax.eval_shape(tx.init, pieces)
        program = jax.make_jaxpr(update)(pieces, state, pieces)
        _walk(program.jaxpr, [*status(pieces), *status(state), *status(pieces)])
    except CapabilityError as e:
        return str(e)
    try:
        whole_state = jax.eval_shape(tx.init, whole)
        same = (_program(jax.make_jaxpr(tx.init)(whole).jaxpr) == _program(init.jaxpr)
                and _program(jax.make_jaxpr(update)(whole, whole_state, whole).jaxpr) == _program(program.jaxpr))
    except Exception as e:  # noqa: BLE001 - an update that traces over the pieces but not over the whole
        return f"update traces over the pieces but not over the whole parameters ({type(e).__name__})"
    if not same:
        return ("update depends on the parameters' shapes (it is not the same program over a piece as over "
                "the whole: a shape-dependent choice or scale)")
    return None


class JaxPieces:
    """``tx`` over this rank's pieces (a parameter tree of them, ``treedef``), its state on their
    device; one jitted update a step. The replica's whole optimizer state is dropped at the first
    step (the pieces' is the state now: ZeRO's stage 1); a TrainState's step count follows."""

    def __init__(self, jax: Any, tx: Any, pieces: list[Any], treedef: Any, replica: Any) -> None:
        self.jax, self.tx, self.treedef, self.replica = jax, tx, treedef, replica
        tu = jax.tree_util
        self.state = jax.jit(tx.init)(tu.tree_unflatten(treedef, pieces))

        def step(g: Any, s: Any, p: Any) -> tuple[Any, Any]:
            u, s = tx.update(g, s, p)
            return tu.tree_map(lambda a, b: (a + b).astype(a.dtype), p, u), s
        self._step = jax.jit(step)
        self._whole_dropped = False

    def step(self, grads: Sequence[Any], values: Sequence[Any]) -> list[Any]:
        tu, rep = self.jax.tree_util, self.replica
        new, self.state = self._step(tu.tree_unflatten(self.treedef, list(grads)), self.state,
                                     tu.tree_unflatten(self.treedef, list(values)))
        if rep._state is not None:
            rep._state = rep._state.replace(step=rep._state.step + 1)
        if not self._whole_dropped:  # (made before rank 0's state was broadcast: dropped once training)
            rep.drop_whole_optimizer_state()
            self._whole_dropped = True
        return tu.tree_leaves(new)
