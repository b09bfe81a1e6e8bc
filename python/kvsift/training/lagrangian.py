"""The Lagrangian sparsity constraint of LycheeDecode's role training (docs/algorithms/hardkuma.md §9).

The penalty is ``lambda * c`` with the constraint ``c_hat = (E||z||_0 - N_target) / N``: the expected
number of open gates beyond the target, in density units (N gates), as the reference writes it
(``density - rho*``), so that lambda's range (2 at the start, at most 20) means what it means there.

- ``one_sided=True`` (LycheeDecode): ``c_hat = relu(...)``, nothing pushes the gates once the expected
  count is at or below the target, and lambda never decreases;
- ``one_sided=False`` (Bastings' reference, Rezende & Viola's Algorithm 1): signed, so an expected
  count below the target pushes the gates open and lambda falls: the count is held *at* N_target.

``c_hat``'s value is replaced by a moving average (``c = c_hat + (c_ma - c_hat).detach()``: the value
``c_ma``, the gradient of ``c_hat``), and lambda follows gradient ascent on ``log lambda``:
``lambda <- clamp(lambda * exp(lr * c_ma), lambda_min, lambda_max)`` (the reference's multiplicative
step, which keeps lambda > 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class Lagrangian:
    """lambda and the constraint's moving average, updated once per training step.

    Attributes:
        target: N_target, the expected open gates wanted (retrieval heads beyond layer 0).
        gates: N, the number of gates (the density's denominator).
        lam: lambda (LycheeDecode: 2.0 at the start).
        lr: the step of log lambda (LycheeDecode: 1e-3).
        alpha: the moving average's weight of the past (0.9).
        lam_min, lam_max: the clamp of lambda ([1e-12, 20]).
        one_sided: LycheeDecode's relu constraint (True) or the signed one (False).
    """

    target: float
    gates: int
    lam: float = 2.0
    lr: float = 1e-3
    alpha: float = 0.9
    lam_min: float = 1e-12
    lam_max: float = 20.0
    one_sided: bool = True
    c_ma: float = 0.0

    def __post_init__(self) -> None:
        if self.gates < 1:
            raise ValueError(f"kvsift.training.Lagrangian: gates = {self.gates} must be >= 1")
        if not 0 <= self.target <= self.gates:
            raise ValueError(f"kvsift.training.Lagrangian: target = {self.target} must be in [0, gates = {self.gates}]")
        if not 0 < self.lam_min <= self.lam <= self.lam_max:
            raise ValueError(f"kvsift.training.Lagrangian: lam = {self.lam} must be in [lam_min, lam_max] = "
                             f"[{self.lam_min}, {self.lam_max}]")
        if not 0 <= self.alpha < 1:
            raise ValueError(f"kvsift.training.Lagrangian: alpha = {self.alpha} must be in [0, 1)")

    def penalty(self, expected_l0: torch.Tensor) -> torch.Tensor:
        """``lambda * c`` for this step (differentiable through ``expected_l0``), and the lambda update.

        ``expected_l0`` is E||z||_0 (a 0-dim tensor, e.g. ``kvsift.hardkuma_expected_l0(a, b)``). One
        host read per step (the moving average is a Python float, as in the reference).
        """
        c_hat = (expected_l0 - self.target) / self.gates
        if self.one_sided:
            c_hat = torch.relu(c_hat)
        self.c_ma = self.alpha * self.c_ma + (1 - self.alpha) * float(c_hat.detach())
        c = c_hat + (self.c_ma - c_hat).detach()
        # the reference updates lambda first and weighs this step's constraint with the new value
        self.lam = min(self.lam_max, max(self.lam_min, self.lam * math.exp(self.lr * self.c_ma)))
        return self.lam * c


__all__ = ["Lagrangian"]
