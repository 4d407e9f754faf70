"""What several files of the JAX adapter share."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from multidev.adapter import CapabilityError

X64_DTYPES = frozenset({"int64", "uint64", "float64", "complex128"})


#: The 32-bit dtype JAX holds in place of each 64-bit one.
NARROW = {"int64": "int32", "uint64": "uint32", "float64": "float32", "complex128": "complex64"}


def x64_hint(dtype: str | None = None) -> str:
    """How to get ``dtype`` (a 64-bit dtype) onto JAX: 64-bit mode, or the 32-bit dtype asked for."""
    narrow = NARROW.get(dtype or "")
    also = (f", or ask for dtype={narrow!r} (a NumPy array is cast: md.asarray(a, dtype={narrow!r}, "
            "backend='jax'))") if narrow else ""
    return f"enable 64-bit types with jax.config.update('jax_enable_x64', True){also}"


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
# An optax transformation over one rank's pieces of the parameters, for multidev's own sharding of
# the optimizer's state (:mod:`multidev.managed_sharding`: JAX trees over a process mesh under an
# engine other than jax, where JAX's own global arrays do not exist).
#
# optax transformations do not declare whether their update is element by element (a piece of a
# parameter stepped alone gives that piece of the whole's step). So the update is traced once over the
# pieces and its program read: every operation that touches the gradients, the parameters or the
# state's tensors must act element by element (arithmetic, comparisons, ``where``, casts), and every
# other operand a scalar or a scalar broadcast (a learning-rate schedule over the step count is
# scalar arithmetic). A reduction over a tensor (a global norm clip, LAMB's trust ratio, Adafactor's
# factored moments), a reshape, a position-dependent constant or a loop over tensors refuses it with
# CapabilityError before anything moves.

#: lax primitives that act element by element (their operands of one shape, or rank-0)
ELEMENTWISE = frozenset({
    "abs", "acos", "acosh", "add", "add_any", "and", "asin", "asinh", "atan", "atan2", "atanh", "cbrt", "ceil",
    "clamp", "conj", "convert_element_type", "copy", "copy_p", "cos", "cosh", "div", "eq", "erf", "erf_inv", "erfc",
    "exp", "exp2", "expm1", "floor", "ge", "gt", "imag", "integer_pow", "is_finite", "le", "lgamma", "digamma",
    "log", "log1p", "logistic", "lt", "max", "min", "mul", "ne", "neg", "nextafter", "not", "optimization_barrier",
    "or", "pow", "real", "reduce_precision", "rem", "round", "rsqrt", "select_n", "sign", "sin", "sinh", "sqrt",
    "square", "stop_gradient", "sub", "tan", "tanh", "xor",
})

# what a value of the traced program is: a scalar, a scalar broadcast to a shape, derived from the
# pieces' tensors (element by element), or another tensor (a constant array, an iota: positions)
_SCALAR, _UNIFORM, _TENSOR, _OTHER = "scalar", "uniform", "tensor", "other"


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


def _walk(jaxpr: Any, ins: Sequence[str]) -> list[str]:
    """The statuses of ``jaxpr``'s outputs given its inputs'; CapabilityError naming the first
    operation that would step a piece otherwise than within the whole."""
    status: dict[Any, str] = {}
    for v in jaxpr.constvars:
        status[v] = _SCALAR if _shape(v) == () else _OTHER
    for v, s in zip(jaxpr.invars, ins):
        status[v] = s

    def of(v: Any) -> str:
        if type(v).__name__ == "Literal":
            return _SCALAR if _shape(v) == () else _OTHER
        return status.get(v, _SCALAR if _shape(v) == () else _OTHER)

    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        ins_ = [of(v) for v in eqn.invars]
        subs = _subprograms(eqn.params)
        if name == "cond" and subs:
            if ins_[0] == _TENSOR:
                raise CapabilityError(f"the update branches on its tensors ({name})")
            branches = [_walk(s, ins_[1:]) for s in subs]
            outs = [max(col, key=[_SCALAR, _UNIFORM, _OTHER, _TENSOR].index) for col in zip(*branches)]
        elif len(subs) == 1 and len(subs[0].invars) == len(eqn.invars):  # jit, custom_jvp/vjp, remat, closed_call
            outs = _walk(subs[0], ins_)
        elif _TENSOR in ins_:
            shapes = {_shape(v) for v, s in zip(eqn.invars, ins_) if s == _TENSOR}
            if (name not in ELEMENTWISE or _OTHER in ins_ or len(shapes) != 1
                    or any(_shape(o) not in shapes for o in eqn.outvars)):
                raise CapabilityError(f"the update's {name} acts across elements of a tensor (or with a "
                                      "position-dependent array), so a piece would step differently")
            outs = [_TENSOR] * len(eqn.outvars)
        elif all(_shape(o) == () for o in eqn.outvars):
            outs = [_SCALAR] * len(eqn.outvars)
        elif name == "broadcast_in_dim" and ins_[0] == _SCALAR:
            outs = [_UNIFORM]
        elif name in ELEMENTWISE and _OTHER not in ins_:
            outs = [_UNIFORM] * len(eqn.outvars)
        else:
            outs = [_OTHER] * len(eqn.outvars)
        for o, s in zip(eqn.outvars, outs):
            status[o] = s
    return [of(v) for v in jaxpr.outvars]


def elementwise_refusal(jax: Any, tx: Any, pieces: Any) -> str | None:
    """Why ``tx`` (an optax transformation) cannot step ``pieces`` (a parameter tree of pieces) as the
    whole parameters would be stepped; None where its init and update are element by element."""
    tu = jax.tree_util

    def status(tree: Any) -> list[str]:
        return [_SCALAR if getattr(x, "ndim", 0) == 0 else _TENSOR for x in tu.tree_leaves(tree)]
    try:
        init = jax.make_jaxpr(tx.init)(pieces)
        bad = [s for s in _walk(init.jaxpr, status(pieces)) if s == _OTHER]
        if bad:
            return "its initial state holds a position-dependent tensor"
        state = jax.eval_shape(tx.init, pieces)
        update = jax.make_jaxpr(lambda g, s, p: tx.update(g, s, p))(pieces, state, pieces)
        _walk(update.jaxpr, [*status(pieces), *status(state), *status(pieces)])
    except CapabilityError as e:
        return str(e)
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
