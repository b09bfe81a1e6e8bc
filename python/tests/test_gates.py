"""The HardKuma gate ops (kvsift.hardkuma_*): values against the spec's test vectors and a plain torch
reference written here, gradients by torch.autograd.gradcheck in float64 (kvsift's gate code is
templated on the real type, so float64 is kvsift's own computation in double), against torch autograd
through the reference, bad input, opcheck and torch.compile. CUDA cases are skipped without a GPU."""

from __future__ import annotations

import math

import pytest
import torch

import kvsift
from conftest import CUDA_SKIP

F64 = torch.float64
L, R = -0.1, 1.1
C0, C1 = -L / (R - L), (1 - L) / (R - L)


# ---- the plain torch reference (docs/algorithms/hardkuma.md §1-§5), float64 ----

def clamp_shape(x):
    return x.clamp(1e-6, 100.0)


def ref_sample(a, b, u):
    a, b = clamp_shape(a), clamp_shape(b)
    k = (1 - (1 - u) ** (1 / b)) ** (1 / a)
    return (L + (R - L) * k).clamp(0.0, 1.0)


def ref_prob_zero(a, b, clamp=True):
    a, b = clamp_shape(a), clamp_shape(b)
    p0 = 1 - (1 - C0 ** a) ** b
    return p0.clamp(1e-6, 1 - 1e-6) if clamp else p0


def ref_prob_one(a, b):
    a, b = clamp_shape(a), clamp_shape(b)
    return (1 - C1 ** a) ** b


def ref_kuma_mean(a, b):
    a, b = clamp_shape(a), clamp_shape(b)
    return b * torch.exp(torch.lgamma(1 + 1 / a) + torch.lgamma(b) - torch.lgamma(1 + 1 / a + b))


def ref_mean(a, b, points=200001):
    """E[h] = int_0^1 P(h > x) dx = int_0^1 (1 - ((x - l)/(r - l))^a)^b dx, by the trapezoid rule."""
    a, b = clamp_shape(a).reshape(-1, 1), clamp_shape(b).reshape(-1, 1)
    x = torch.linspace(0, 1, points, dtype=F64)
    k = (x - L) / (R - L)
    return torch.trapezoid((1 - k ** a) ** b, x, dim=1)


def random_gates(shape, seed, lo=0.3, hi=4.0, dtype=F64, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    a = lo + (hi - lo) * torch.rand(shape, generator=g, dtype=F64)
    b = lo + (hi - lo) * torch.rand(shape, generator=g, dtype=F64)
    u = kvsift.hardkuma_noise(shape, dtype=F64, generator=g)
    return [t.to(dtype=dtype, device=device) for t in (a, b, u)]


# ---- spec test vectors (§11) ----

def test_sample_vector(device):
    a = torch.tensor([1.3], dtype=F64, device=device, requires_grad=True)
    b = torch.tensor([0.7], dtype=F64, device=device, requires_grad=True)
    u = torch.tensor([0.3], dtype=F64, device=device)
    h = kvsift.hardkuma_sample(a, b, u)
    # k = 0.4934519, so h = l + (r - l) k and dh/d(a, b) = (r - l) dk/d(a, b).
    assert h.item() == pytest.approx(0.4921423, abs=1e-7)
    h.sum().backward()
    assert a.grad.item() == pytest.approx(1.2 * 0.2681076, abs=2e-7)
    assert b.grad.item() == pytest.approx(1.2 * -0.4157873, abs=2e-7)


SPEC_TABLE = [  # a, b, P(h=0), P(h=1), P(0<h<1), 1 - P0, E[K], E[h]
    (1.0, 1.0, 0.083333, 0.083333, 0.833333, 0.916667, 0.500000, 0.500000),
    (0.5, 2.0, 0.494017, 0.001812, 0.504171, 0.505983, 0.166667, 0.134264),
    (3.0, 0.7, 0.000405, 0.357168, 0.642427, 0.999595, 0.799756, 0.838237),
    (2.0, 5.0, 0.034243, 0.000104, 0.965653, 0.965757, 0.369408, 0.344436),
    (0.3, 0.3, 0.175541, 0.333666, 0.490793, 0.824459, 0.592431, 0.598252),
    (5.0, 0.2, 0.000001, 0.811893, 0.188106, 0.999999, 0.950150, 0.971489),
]


@pytest.mark.parametrize("dtype,atol", [(torch.float64, 1.5e-6), (torch.float32, 1e-5)], ids=["f64", "f32"])
def test_stats_table(device, dtype, atol):
    t = torch.tensor(SPEC_TABLE, dtype=F64)
    a, b = t[:, 0].to(device, dtype), t[:, 1].to(device, dtype)
    s = kvsift.hardkuma_stats(a, b, options=kvsift.HardKumaOptions(clamp_prob_zero=False))
    for got, col in zip((s.prob_zero, s.prob_one, s.prob_interior, s.expected_l0, s.kuma_mean, s.mean), range(2, 8)):
        assert got.dtype == dtype and got.device.type == device
        torch.testing.assert_close(got.cpu().double(), t[:, col], rtol=0, atol=atol)
    total = kvsift.hardkuma_expected_l0(a, b, options=kvsift.HardKumaOptions(clamp_prob_zero=False))
    assert total.shape == () and total.item() == pytest.approx(float(t[:, 5].sum()), abs=6 * atol)


def test_density_at_init(device):
    ones = torch.ones(4, 8, dtype=F64, device=device)
    assert kvsift.hardkuma_expected_l0(ones, ones, reduction="mean").item() == pytest.approx(11 / 12, abs=1e-12)
    assert kvsift.hardkuma_expected_l0(ones, ones).item() == pytest.approx(32 * 11 / 12, abs=1e-10)


# ---- against the plain torch reference on random inputs ----

@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_values_match_reference(device, dtype):
    a, b, u = random_gates((6, 5), seed=1, lo=0.2, hi=6.0, dtype=dtype, device=device)
    # A few clamped shapes and clipped draws: the reference clamps and clips the same way.
    a[0, 0], b[0, 1], u[1, 0], u[1, 1] = 150.0, 1e-8, 1e-3, 1 - 1e-3
    ad, bd, ud = a.cpu().double(), b.cpu().double(), u.cpu().double()
    tol = dict(rtol=0, atol=1e-12) if dtype == F64 else dict(rtol=0, atol=2e-5)
    torch.testing.assert_close(kvsift.hardkuma_sample(a, b, u).cpu().double(), ref_sample(ad, bd, ud), **tol)
    s = kvsift.hardkuma_stats(a, b)
    torch.testing.assert_close(s.prob_zero.cpu().double(), ref_prob_zero(ad, bd), **tol)
    torch.testing.assert_close(s.expected_l0.cpu().double(), 1 - ref_prob_zero(ad, bd), **tol)
    torch.testing.assert_close(s.prob_one.cpu().double(), ref_prob_one(ad, bd), **tol)
    torch.testing.assert_close(s.kuma_mean.cpu().double(), ref_kuma_mean(ad, bd),
                               rtol=0, atol=1e-10 if dtype == F64 else 2e-5)
    torch.testing.assert_close(s.mean.cpu().double(), ref_mean(ad, bd).reshape(ad.shape),
                               rtol=0, atol=1e-8 if dtype == F64 else 2e-5)
    total = kvsift.hardkuma_expected_l0(a, b)
    torch.testing.assert_close(total.cpu().double(), (1 - ref_prob_zero(ad, bd)).sum(), rtol=0,
                               atol=1e-11 if dtype == F64 else 1e-4)


def test_gradients_match_reference_autograd(device):
    """kvsift's closed-form gradients equal torch autograd through the plain reference (float64)."""
    a, b, u = random_gates((4, 6), seed=2, device=device)
    a[0, 0] = 150.0  # clamped: no gradient for this a on either side
    w = torch.randn(a.shape, dtype=F64, generator=torch.Generator().manual_seed(3)).to(device)

    ak, bk = a.clone().requires_grad_(), b.clone().requires_grad_()
    lk = (kvsift.hardkuma_sample(ak, bk, u) * w).sum() + 0.7 * kvsift.hardkuma_expected_l0(ak, bk, reduction="mean")
    got = torch.autograd.grad(lk, (ak, bk))
    ar, br = a.cpu().clone().requires_grad_(), b.cpu().clone().requires_grad_()
    lr = (ref_sample(ar, br, u.cpu()) * w.cpu()).sum() + 0.7 * (1 - ref_prob_zero(ar, br)).mean()
    want = torch.autograd.grad(lr, (ar, br))
    for g, e in zip(got, want):
        torch.testing.assert_close(g.cpu(), e, rtol=1e-10, atol=1e-12)
    assert got[0][0, 0].item() == 0.0


# ---- gradcheck in float64 ----

def gradcheck_inputs(device):
    a, b, u = random_gates((3, 5), seed=4, device=device)
    a[0, 0] = 150.0  # above the shape clamp: zero gradient (flat there, so finite differences agree)
    u[0, 1], u[0, 2] = 1e-3, 1 - 1e-3  # with a = b = 1.5 these draws clip to h = 0 and h = 1
    a[0, 1:3], b[0, 1:3] = 1.5, 1.5
    return a.requires_grad_(), b.requires_grad_(), u


def test_gradcheck_sample(device):
    a, b, u = gradcheck_inputs(device)
    h = kvsift.hardkuma_sample(a, b, u)
    assert h[0, 1].item() == 0.0 and h[0, 2].item() == 1.0
    assert torch.autograd.gradcheck(lambda a, b: kvsift.hardkuma_sample(a, b, u), (a, b))


@pytest.mark.parametrize("reduction", ["sum", "mean", "none"])
def test_gradcheck_expected_l0(device, reduction):
    a, b, _ = gradcheck_inputs(device)
    assert torch.autograd.gradcheck(lambda a, b: kvsift.hardkuma_expected_l0(a, b, reduction=reduction), (a, b))


def test_gradcheck_both_reduction_outputs(device):
    # One backward carrying both the sum's and the density's incoming gradients.
    a, b, _ = gradcheck_inputs(device)
    assert torch.autograd.gradcheck(lambda a, b: torch.ops.kvsift.hardkuma_expected_l0(a, b), (a, b))


def test_gradcheck_prob_zero(device):
    a, b, _ = gradcheck_inputs(device)
    assert torch.autograd.gradcheck(lambda a, b: kvsift.hardkuma_stats(a, b).prob_zero, (a, b))


def test_gradcheck_unclamped(device):
    a, b, u = random_gates((7,), seed=5, lo=0.5, hi=3.0, device=device)
    o = kvsift.HardKumaOptions(l=-0.2, r=1.3, clamp_shape=False, clamp_prob_zero=False)
    a.requires_grad_(), b.requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: kvsift.hardkuma_sample(a, b, u, options=o), (a, b))
    assert torch.autograd.gradcheck(lambda a, b: kvsift.hardkuma_expected_l0(a, b, options=o), (a, b))


def test_clamped_prob_zero_has_no_gradient(device):
    # P(h=0) of a = 5, b = 0.2 is below 1e-6: clamped, so no gradient flows (the reference's numerics).
    a = torch.tensor([5.0, 1.0], dtype=F64, device=device, requires_grad=True)
    b = torch.tensor([0.2, 1.0], dtype=F64, device=device, requires_grad=True)
    kvsift.hardkuma_expected_l0(a, b).backward()
    assert a.grad[0].item() == 0.0 and b.grad[0].item() == 0.0
    assert a.grad[1].item() != 0.0 and b.grad[1].item() != 0.0


def test_no_gradient_for_other_stats(device):
    a, b, _ = gradcheck_inputs(device)
    s = kvsift.hardkuma_stats(a, b)
    assert s.prob_zero.requires_grad and s.expected_l0.requires_grad
    assert not any(t.requires_grad for t in (s.prob_one, s.prob_interior, s.kuma_mean, s.mean))


# ---- the deterministic gate and the roles ----

def test_eval_gate(device):
    a, b, _ = random_gates((4, 8), seed=6, lo=0.2, hi=5.0, device=device)
    z = kvsift.hardkuma_eval_gate(a.requires_grad_(), b)
    assert z.dtype == F64 and not z.requires_grad
    want = (ref_kuma_mean(a.detach().cpu(), b.cpu()) > 0.5).double()
    assert 0 < want.sum() < want.numel()
    assert torch.equal(z.cpu(), want)
    z3 = kvsift.hardkuma_eval_gate(a.detach(), b, threshold=0.3)
    assert torch.equal(z3.cpu(), (ref_kuma_mean(a.detach().cpu(), b.cpu()) > 0.3).double())


def test_head_roles_from_gates(device):
    a, b, _ = random_gates((3, 4), seed=7, lo=0.2, hi=5.0, device=device)
    score = ref_kuma_mean(a.cpu(), b.cpu())
    roles = kvsift.head_roles_from_gates(a, b)
    want = score > 0.5
    want[0] = True  # layer 0 forced to retrieval
    assert torch.equal(roles.to_tensor(), want)
    top = kvsift.head_roles_from_gates(a, b, selection="top_n", total_retrieval_heads=6)
    rest = score[1:].flatten()
    chosen = torch.zeros_like(rest, dtype=torch.bool)
    chosen[torch.sort(-rest, stable=True).indices[:2]] = True
    assert torch.equal(top.to_tensor()[1:].flatten(), chosen) and top.to_tensor()[0].all()


def test_noise_range():
    u = kvsift.hardkuma_noise((1000,), generator=torch.Generator().manual_seed(0))
    assert u.min() >= 1e-3 and u.max() < 1 - 1e-3 + 1e-7
    assert torch.equal(u, kvsift.hardkuma_noise(1000, generator=torch.Generator().manual_seed(0)))


@pytest.mark.skipif(CUDA_SKIP is not None, reason=CUDA_SKIP or "")
def test_cuda_matches_cpu():
    a, b, u = random_gates((32, 8), seed=8, lo=0.1, hi=8.0)
    for f in (lambda a, b, u: kvsift.hardkuma_sample(a, b, u), lambda a, b, u: torch.stack(kvsift.hardkuma_stats(a, b)),
              lambda a, b, u: kvsift.hardkuma_expected_l0(a, b)):
        # The backends run the same per-gate code; they differ only by the ulps of each libm.
        torch.testing.assert_close(f(a.cuda(), b.cuda(), u.cuda()).cpu(), f(a, b, u), rtol=1e-10, atol=1e-12)


# ---- bad input ----

class TestErrors:
    def test_dtype(self):
        x = torch.ones(3, dtype=torch.float16)
        with pytest.raises(ValueError, match=r"kvsift\.hardkuma_sample: a\.dtype = Half must be Float or Double"):
            kvsift.hardkuma_sample(x, x, x)

    def test_mismatched_dtype(self):
        a = torch.ones(3, dtype=F64)
        with pytest.raises(ValueError, match=r"b\.dtype = Float must equal a\.dtype = Double"):
            kvsift.hardkuma_expected_l0(a, a.float())

    def test_u_shape(self):
        a = torch.ones(2, 3, dtype=F64)
        with pytest.raises(ValueError, match=r"kvsift\.hardkuma_sample: u shape \[3\] must equal a shape \[2, 3\]"):
            kvsift.hardkuma_sample(a, a, torch.full((3,), 0.5, dtype=F64))

    def test_b_shape(self):
        with pytest.raises(ValueError, match=r"kvsift\.hardkuma_stats: b shape \[4\] must equal a shape \[3\]"):
            kvsift.hardkuma_stats(torch.ones(3), torch.ones(4))

    def test_u_out_of_range(self):
        a = torch.ones(3, dtype=F64)
        with pytest.raises(ValueError, match=r"u\[1\] = 1 must be in \(0, 1\)"):
            kvsift.hardkuma_sample(a, a, torch.tensor([0.5, 1.0, 0.2], dtype=F64))

    def test_nan_shape(self):
        a = torch.tensor([1.0, math.nan])
        with pytest.raises(ValueError, match=r"a\[1\] = nan must be a number"):
            kvsift.hardkuma_expected_l0(a, torch.ones(2))

    def test_nonpositive_shape_without_clamp(self):
        b = torch.tensor([1.0, -2.0])
        with pytest.raises(ValueError, match=r"b\[1\] = -2 must be finite and > 0"):
            kvsift.hardkuma_stats(torch.ones(2), b, options=kvsift.HardKumaOptions(clamp_shape=False))

    def test_bad_support(self):
        with pytest.raises(ValueError, match=r"options\.l = 0\.1 must be finite and < 0"):
            kvsift.hardkuma_expected_l0(torch.ones(2), torch.ones(2), options=kvsift.HardKumaOptions(l=0.1))

    def test_bad_reduction(self):
        with pytest.raises(ValueError, match=r"reduction = 'max' must be 'sum', 'mean' or 'none'"):
            kvsift.hardkuma_expected_l0(torch.ones(2), torch.ones(2), reduction="max")

    def test_roles_shape_and_top_n(self):
        with pytest.raises(ValueError, match=r"extract_head_roles: a must have 2 dimensions"):
            kvsift.head_roles_from_gates(torch.ones(4), torch.ones(4))
        with pytest.raises(ValueError, match=r"total_retrieval_heads = 2 must be in \[4, 12\]"):
            kvsift.head_roles_from_gates(torch.ones(3, 4), torch.ones(3, 4), selection="top_n", total_retrieval_heads=2)
        with pytest.raises(ValueError, match=r"selection = 'best' must be 'threshold' or 'top_n'"):
            kvsift.head_roles_from_gates(torch.ones(3, 4), torch.ones(3, 4), selection="best")

    def test_grad_scale_shape(self):
        a = torch.ones(3, dtype=F64)
        with pytest.raises(ValueError, match=r"grad_scale shape \[1\] must equal"):
            torch.ops.kvsift.hardkuma_expected_l0_backward(torch.ones(1, dtype=F64), a, a)

    @pytest.mark.skipif(CUDA_SKIP is not None, reason=CUDA_SKIP or "")
    def test_device_mismatch(self):
        a = torch.ones(3, dtype=F64, device="cuda")
        with pytest.raises(ValueError, match=r"u is on cpu but a is on cuda:0"):
            kvsift.hardkuma_sample(a, a, torch.full((3,), 0.5, dtype=F64))


def test_empty(device):
    e = torch.empty(0, 4, dtype=F64, device=device)
    assert kvsift.hardkuma_sample(e, e, e).shape == (0, 4)
    assert kvsift.hardkuma_expected_l0(e, e).item() == 0.0
    assert math.isnan(kvsift.hardkuma_expected_l0(e, e, reduction="mean").item())
    assert kvsift.hardkuma_eval_gate(e, e).shape == (0, 4)


# ---- opcheck and torch.compile ----

def test_opcheck(device):
    a, b, u = random_gates((3, 4), seed=9, device=device)
    ops = torch.ops.kvsift
    grad = (a.clone().requires_grad_(), b.clone().requires_grad_())
    torch.library.opcheck(ops.hardkuma_sample.default, (*grad, u))
    torch.library.opcheck(ops.hardkuma_sample_backward.default, (torch.ones_like(a), a, b, u))
    torch.library.opcheck(ops.hardkuma_expected_l0.default, grad)
    torch.library.opcheck(ops.hardkuma_expected_l0_backward.default, (a.new_tensor(2.0), a, b))
    torch.library.opcheck(ops.hardkuma_stats.default, grad)
    torch.library.opcheck(ops.extract_head_roles.default, (a, b))


def test_compile_training_step(device):
    """A gate-training step (sampled gates mix two outputs, plus the Lagrangian term on the density)
    compiled with fullgraph: forward and backward equal eager."""
    torch._dynamo.reset()
    a, b, u = random_gates((2, 4), seed=10, dtype=torch.float32, device=device)
    dense, sparse = torch.randn(2, 4, 8, device=device), torch.randn(2, 4, 8, device=device)

    def step(a, b, u):
        z = kvsift.hardkuma_sample(a, b, u)
        mixed = z[..., None] * dense + (1 - z[..., None]) * sparse
        return mixed.square().mean() + 2.0 * (kvsift.hardkuma_expected_l0(a, b, reduction="mean") - 0.25)

    results = []
    for f in (step, torch.compile(step, fullgraph=True)):
        ar, br = a.clone().requires_grad_(), b.clone().requires_grad_()
        loss = f(ar, br, u)
        loss.backward()
        results.append((loss.detach(), ar.grad, br.grad))
    for x, y in zip(*results):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)
