"""HardKuma gates (LycheeDecode's head-role training) over kvsift's gate code: differentiable sampling,
the closed-form expected L0, per-gate statistics, and the deterministic gate / roles after training.

One gate per element of ``a`` and ``b`` (a model's gates are ``[layers, kv_heads]``), float32 or
float64; kvsift's gate code is templated on the real type, so float64 calls run kvsift's own
computation in double. Gradients are kvsift's closed forms (``docs/algorithms/hardkuma.md`` §3-§4),
registered as the ops' autograd formulas (``kvsift/_gate_ops.py``). See docs/python.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional, Sequence, Union

import torch

from . import _gate_ops  # noqa: F401  (registers the fakes and the autograd formulas)
from ._ops import ops
from .roles import HeadRoles


@dataclass(frozen=True)
class HardKumaOptions:
    """The C++ ``kvsift::HardKumaOptions`` less ``sample_eps`` (here the caller draws u; see :func:`hardkuma_noise`).

    Attributes:
        l: lower end of the stretched support, < 0 (LycheeDecode: -0.1).
        r: upper end, > 1 (1.1).
        clamp_shape: clamp a and b to [1e-6, 100] before use, as LycheeDecode clamps its raw parameters;
            the gradient w.r.t. a raw value outside that range is 0. Off: a or b <= 0 is an error (CPU)
            or NaN (CUDA).
        clamp_prob_zero: clamp P(h=0) to [1e-6, 1 - 1e-6] wherever it is reported or enters the
            expected L0, with zero gradient where clamped (the reference's numerics).
    """

    l: float = -0.1
    r: float = 1.1
    clamp_shape: bool = True
    clamp_prob_zero: bool = True


_DEFAULT = HardKumaOptions()


def hardkuma_noise(
    shape: Union[int, Sequence[int], torch.Size],
    *,
    eps: float = 1e-3,
    dtype: torch.dtype = torch.float32,
    device: Optional[Union[str, torch.device]] = None,
    generator: Optional[torch.Generator] = None,
) -> torch.Tensor:
    """Uniform noise ``u ~ U(eps, 1 - eps)`` for :func:`hardkuma_sample`, as the reference's ``Kuma.sample``
    draws it (eps = 1e-3). From torch's generator, so a seed makes a training run reproducible."""
    if not 0.0 <= eps < 0.5:
        raise ValueError(f"kvsift.hardkuma_noise: eps = {eps} must be in [0, 0.5)")
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    v = torch.rand(shape, dtype=dtype, device=device, generator=generator)
    return v * (1.0 - 2.0 * eps) + eps


def hardkuma_sample(
    a: torch.Tensor, b: torch.Tensor, u: torch.Tensor, *, options: Optional[HardKumaOptions] = None
) -> torch.Tensor:
    """A reparameterised HardKuma draw per gate: ``h = clip(l + (r - l) (1 - (1 - u)^(1/b))^(1/a), 0, 1)``.

    Differentiable in ``a`` and ``b`` (kvsift's closed form ``dh/da``, ``dh/db``; 0 where h is clipped
    to 0 or 1, or where a raw shape parameter is outside the clamp); no gradient flows to ``u``.

    Args:
        a, b: the Kumaraswamy shapes, float32 or float64, one shape (any; ``[layers, kv_heads]`` for a
            model), the same device.
        u: uniforms in (0, 1), a's shape and dtype (e.g. :func:`hardkuma_noise`). The CPU path rejects
            a u outside (0, 1); the CUDA path cannot check device data and yields h in {0, 1} with NaN
            gradients there.
        options: the support and the clamps (:class:`HardKumaOptions`).

    Returns:
        h, a's shape and dtype, contiguous.
    """
    o = options or _DEFAULT
    return ops.hardkuma_sample(a, b, u, o.l, o.r, o.clamp_shape)


def hardkuma_expected_l0(
    a: torch.Tensor, b: torch.Tensor, *, reduction: str = "sum", options: Optional[HardKumaOptions] = None
) -> torch.Tensor:
    """The closed-form expected L0 of the gates, ``E||z||_0 = sum_i P(h_i != 0) = sum_i (1 - c0^a_i)^b_i``.

    Args:
        a, b: float32 or float64 gate parameters of one shape.
        reduction: ``"sum"`` (E||z||_0, a 0-dim tensor), ``"mean"`` (LycheeDecode's density: the sum / n,
            NaN for no gates) or ``"none"`` (P(h != 0) per gate, a's shape).
        options: the support and the clamps.

    Returns:
        Differentiable in a and b through kvsift's ``dP(h=0)/da``, ``dP(h=0)/db``.
    """
    o = options or _DEFAULT
    if reduction == "none":
        return ops.hardkuma_stats(a, b, o.l, o.r, o.clamp_shape, o.clamp_prob_zero)[3]
    total, density = ops.hardkuma_expected_l0(a, b, o.l, o.r, o.clamp_shape, o.clamp_prob_zero)
    if reduction == "sum":
        return total
    if reduction == "mean":
        return density
    raise ValueError(f"kvsift.hardkuma_expected_l0: reduction = '{reduction}' must be 'sum', 'mean' or 'none'")


class HardKumaStats(NamedTuple):
    """Per-gate statistics (C++ ``GateStatsOutputs``), each a's shape and dtype.

    ``prob_zero`` and ``expected_l0`` are differentiable (kvsift's gradient of P(h=0)); the others are
    returned without a gradient (kvsift has none for them).
    """

    prob_zero: torch.Tensor       #: P(h=0), clamped with options.clamp_prob_zero
    prob_one: torch.Tensor        #: P(h=1)
    prob_interior: torch.Tensor   #: P(0<h<1)
    expected_l0: torch.Tensor     #: P(h!=0)
    kuma_mean: torch.Tensor       #: E[K], LycheeDecode's role score
    mean: torch.Tensor            #: E[h], the true gate mean
    d_prob_zero_da: torch.Tensor  #: dP(h=0)/da (0 where a or P(h=0) is clamped)
    d_prob_zero_db: torch.Tensor  #: dP(h=0)/db


def hardkuma_stats(a: torch.Tensor, b: torch.Tensor, *, options: Optional[HardKumaOptions] = None) -> HardKumaStats:
    """P(h=0), P(h=1), P(0<h<1), P(h!=0), E[K], E[h] and dP(h=0)/d(a, b) per gate (``kvsift::hardkuma_stats``)."""
    o = options or _DEFAULT
    return HardKumaStats(*ops.hardkuma_stats(a, b, o.l, o.r, o.clamp_shape, o.clamp_prob_zero))


def hardkuma_eval_gate(
    a: torch.Tensor, b: torch.Tensor, *, threshold: float = 0.5, clamp_shape: bool = True
) -> torch.Tensor:
    """The deterministic (evaluation) gate: ``z = 1`` where ``E[K(a, b)] > threshold``, else 0.

    LycheeDecode's rule for a retrieval head (``docs/algorithms/hardkuma.md`` §8), computed by kvsift's
    ``extract_head_roles`` (NaN never passes). z is a's shape and dtype and carries no gradient: it is a
    step function of (a, b), so its derivative is zero wherever it exists. Layer 0 is not forced here;
    :func:`head_roles_from_gates` makes the roles table the policy reads.
    """
    if a.numel() == 0:
        return a.detach().new_zeros(a.shape)
    retrieval, _ = ops.extract_head_roles(a.detach().reshape(1, -1), b.detach().reshape(1, -1), "threshold",
                                          float(threshold), 0, False, clamp_shape)
    return retrieval.reshape(a.shape).to(a.dtype)


def head_roles_from_gates(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    selection: str = "threshold",
    threshold: float = 0.5,
    total_retrieval_heads: int = 0,
    force_layer0: bool = True,
    clamp_shape: bool = True,
) -> HeadRoles:
    """Roles from trained gates ``a, b [layers, kv_heads]`` (``kvsift::extract_head_roles``).

    ``selection="threshold"``: retrieval iff E[K] > threshold; ``"top_n"``: exactly
    ``total_retrieval_heads`` retrieval heads (the forced layer-0 heads included) by E[K], ties to the
    lower gate index. Layer 0 is all retrieval with ``force_layer0`` (LycheeDecode needs it). Host values
    out: call outside compiled code.
    """
    retrieval, _ = ops.extract_head_roles(a.detach(), b.detach(), selection, float(threshold),
                                          int(total_retrieval_heads), bool(force_layer0), clamp_shape)
    return HeadRoles.from_tensor(retrieval)
