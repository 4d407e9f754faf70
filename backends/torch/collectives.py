"""The native allreduce for PyTorch (:class:`~multidev.adapter.SupportsNativeCollectives`): NCCL
through ``torch.cuda.nccl``, ``torch.cuda.comm`` for sums where torch has no NCCL."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from multidev.adapter import CapabilityError, Concern, SupportsNativeCollectives

from .core import TorchCore

# ncclRedOp_t values (nccl.h: ncclSum=0, ncclProd=1, ncclMax=2, ncclMin=3); torch.cuda.nccl only
# exports SUM and passes the int straight through to NCCL.
_NCCL_OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3}
# Element types torch.cuda.nccl converts (torch/csrc/cuda/nccl.cpp: to_nccl_data_type).
_NCCL_DTYPES = ("bool", "int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32",
                "float64")


class TorchCollectives(Concern, SupportsNativeCollectives):
    """NCCL allreduce over one CUDA tensor per GPU."""

    core: TorchCore

    @classmethod
    def available_on(cls, core: Any) -> bool:
        """NCCL needs two CUDA GPUs."""
        return sum(d.kind == "gpu" for d in core.devices()) >= 2

    def native_allreduce(self, xs: Sequence[Any], op: str) -> list[Any]:
        """NCCL allreduce over one CUDA tensor per GPU (``torch.cuda.comm`` for sums without NCCL).

        Out of place, on each device's current stream (asynchronous): contiguous inputs are reduced
        by NCCL straight into new outputs; other layouts (strided, conj/neg views, int16, complex)
        are first copied into private buffers that NCCL reduces in place. bool reduces as or/and (sum/prod),
        int16 through int32 (exact modulo 2**16), complex sums as pairs of reals.
        """
        torch = self.core.torch
        xs = list(xs)
        if any(x.device.type != "cuda" for x in xs):
            where = ", ".join(str(x.device) for x in xs)
            raise CapabilityError(
                f"torch backend: the native allreduce (NCCL) takes CUDA tensors on distinct GPUs; "
                f"got tensors on {where}. Use algorithm='naive' or 'auto'.")
        idx = [x.device.index for x in xs]
        if op not in _NCCL_OPS:
            raise CapabilityError(f"torch backend: native allreduce has no op {op!r}; use sum, max, min or prod")
        dtype = self.core.dtype_of(xs[0])
        base = op
        complex_ = dtype.startswith("complex")
        if complex_ and base != "sum":
            raise CapabilityError(f"torch backend: {base} is not defined for complex tensors")
        if not complex_ and dtype not in _NCCL_DTYPES and dtype != "int16":
            raise CapabilityError(f"torch backend: NCCL cannot reduce {dtype}; use algorithm='naive'")
        work_dt = torch.int32 if dtype == "int16" else xs[0].dtype  # NCCL has no int16
        code = _NCCL_OPS[base]
        if dtype == "bool":
            # NCCL reduces bool as uint8: a sum could store 2 in a bool; or/and are max/min.
            code = _NCCL_OPS["max"] if base in ("sum", "max") else _NCCL_OPS["min"]
        # Plain contiguous inputs go to NCCL out of place (no staging copy: as fast as in place).
        direct = (not complex_ and dtype != "int16" and len(xs) > 1
                  and all(x.is_contiguous() and not x.is_conj() and not x.is_neg() for x in xs))
        with torch.no_grad():
            bufs = []
            for x in xs:
                b = torch.empty(tuple(x.shape), dtype=work_dt, device=x.device)
                if not direct:
                    b.copy_(x.detach())  # materializes conj/neg views and strides; inputs never written
                bufs.append(b)
            if len(bufs) > 1 and bufs[0].numel() > 0:
                views = [torch.view_as_real(b) for b in bufs] if complex_ else bufs
                srcs = [x.detach() for x in xs] if direct else views
                if hasattr(torch._C, "_nccl_all_reduce") and torch.cuda.nccl.is_available(srcs):
                    try:
                        torch.cuda.nccl.all_reduce(srcs, views, op=code)
                    except RuntimeError as e:
                        if "Unconvertible NCCL type" in str(e):  # e.g. bfloat16 with an old NCCL
                            raise CapabilityError(f"torch backend: this NCCL cannot reduce {dtype}; "
                                                  "use algorithm='naive'") from e
                        raise
                elif base == "sum":
                    # No NCCL in this build: torch.cuda.comm sums onto one GPU and broadcasts back.
                    total = torch.cuda.comm.reduce_add([x.detach() for x in xs] if direct else bufs,
                                                       destination=idx[0])
                    bufs = list(torch.cuda.comm.broadcast(total, idx))
                else:
                    raise CapabilityError(f"torch backend: {base} allreduce needs NCCL, which this "
                                          "torch build lacks; use algorithm='naive'")
            if dtype == "int16":
                bufs = [b.to(torch.int16) for b in bufs]
        return bufs
