"""Fake kernels and autograd formulas of the HardKuma gate ops (``csrc/gates_*.cpp``).

The backward of each differentiable op is another kvsift op (``hardkuma_sample_backward``,
``hardkuma_expected_l0_backward``, or the gradient outputs of ``hardkuma_stats``): kvsift's closed-form
gradients, not torch autograd through a re-implementation. Registered with
:func:`torch.library.register_autograd`, so ``torch.ops.kvsift.hardkuma_*`` themselves are
differentiable, ``torch.compile`` traces forward and backward, and ``torch.library.opcheck`` checks the
registration. The fakes must agree with ``csrc/gate_args.hpp`` (outputs contiguous, a's shape and dtype).
"""

from __future__ import annotations

from typing import Tuple

import torch

from ._ops import ops

_Pair = Tuple[torch.Tensor, torch.Tensor]


# ---- fake kernels ----

@torch.library.register_fake("kvsift::hardkuma_sample")
def _sample_fake(a, b, u, l=-0.1, r=1.1, clamp_shape=True) -> torch.Tensor:
    return a.new_empty(a.shape)


@torch.library.register_fake("kvsift::hardkuma_sample_backward")
def _sample_backward_fake(grad_h, a, b, u, l=-0.1, r=1.1, clamp_shape=True) -> _Pair:
    return a.new_empty(a.shape), a.new_empty(a.shape)


@torch.library.register_fake("kvsift::hardkuma_expected_l0")
def _expected_l0_fake(a, b, l=-0.1, r=1.1, clamp_shape=True, clamp_prob_zero=True) -> _Pair:
    return a.new_empty(()), a.new_empty(())


@torch.library.register_fake("kvsift::hardkuma_expected_l0_backward")
def _expected_l0_backward_fake(grad_scale, a, b, l=-0.1, r=1.1, clamp_shape=True, clamp_prob_zero=True) -> _Pair:
    return a.new_empty(a.shape), a.new_empty(a.shape)


@torch.library.register_fake("kvsift::hardkuma_stats")
def _stats_fake(a, b, l=-0.1, r=1.1, clamp_shape=True, clamp_prob_zero=True):
    return tuple(a.new_empty(a.shape) for _ in range(8))


@torch.library.register_fake("kvsift::extract_head_roles")
def _extract_head_roles_fake(a, b, selection="threshold", threshold=0.5, total_retrieval_heads=0,
                             force_layer0=True, clamp_shape=True) -> _Pair:
    torch._check(a.dim() == 2, lambda: f"kvsift.extract_head_roles: a must have 2 dimensions (got {tuple(a.shape)})")
    return a.new_empty(a.shape, dtype=torch.bool), a.new_empty(a.shape)


# ---- autograd: the backward is kvsift's ----

def _sample_setup(ctx, inputs, output) -> None:
    a, b, u, l, r, clamp_shape = inputs
    ctx.save_for_backward(a, b, u)
    ctx.options = (l, r, clamp_shape)


def _sample_backward(ctx, grad_h):
    a, b, u = ctx.saved_tensors
    grad_a, grad_b = ops.hardkuma_sample_backward(grad_h, a, b, u, *ctx.options)
    # No gradient to u: it is the noise of the reparameterisation (kvsift has no d h / d u).
    return grad_a, grad_b, None, None, None, None


torch.library.register_autograd("kvsift::hardkuma_sample", _sample_backward, setup_context=_sample_setup)


def _expected_l0_setup(ctx, inputs, output) -> None:
    a, b, l, r, clamp_shape, clamp_prob_zero = inputs
    ctx.save_for_backward(a, b)
    ctx.options = (l, r, clamp_shape, clamp_prob_zero)
    ctx.n = a.numel()


def _expected_l0_backward(ctx, grad_sum, grad_density):
    a, b = ctx.saved_tensors
    # kvsift's backward gives grad_scale * d density / d(a, b); sum = n * density, so one scale
    # carries both outputs' incoming gradients. It stays a device tensor: no host sync.
    scale = a.new_zeros(())
    if grad_sum is not None:
        scale = scale + grad_sum * ctx.n
    if grad_density is not None:
        scale = scale + grad_density
    grad_a, grad_b = ops.hardkuma_expected_l0_backward(scale, a, b, *ctx.options)
    return grad_a, grad_b, None, None, None, None


torch.library.register_autograd("kvsift::hardkuma_expected_l0", _expected_l0_backward, setup_context=_expected_l0_setup)

# Outputs of hardkuma_stats with a gradient in kvsift: P(h=0) (dP0/da, dP0/db) and P(h!=0) = 1 - P(h=0).
_STATS_DIFFERENTIABLE = (0, 3)


def _stats_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(output[6], output[7])
    ctx.mark_non_differentiable(*(t for i, t in enumerate(output) if i not in _STATS_DIFFERENTIABLE))


def _stats_backward(ctx, *grads):
    d_da, d_db = ctx.saved_tensors
    g = None
    for i, sign in zip(_STATS_DIFFERENTIABLE, (1.0, -1.0)):
        if grads[i] is not None:
            g = grads[i] * sign if g is None else g + grads[i] * sign
    if g is None:
        return None, None, None, None, None, None
    return g * d_da, g * d_db, None, None, None, None


torch.library.register_autograd("kvsift::hardkuma_stats", _stats_backward, setup_context=_stats_setup)
