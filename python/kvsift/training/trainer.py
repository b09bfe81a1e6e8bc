"""End-to-end HardKuma role training with LycheeDecode's objective (docs/python.md, "Role training").

One HardKuma gate per (layer >= 1, KV head); layer 0 is always a retrieval head and is never mixed, so
it has no gate (N = (layers - 1) * kv_heads gates; N_target counts retrieval heads beyond layer 0, the
reading of the spec's 24 learned + 8 forced heads). Each step:

1. draw one gate vector ``z = kvsift.hardkuma_sample(a, b, u)``, shared by the step's prompts;
2. run the gated student (:class:`GatedStudent`) over the teacher-forced passkey digits of the step's
   prompts and compare its logits with the dense teacher's at those positions:
   ``task = mean_t ||logits_student - logits_teacher||^2 / mean_t ||logits_teacher - mean||^2``
   (``loss_norm="teacher"``: relative to the teacher's centred logits, so the task is O(1) on any
   model and lambda's range is meaningful; ``"none"``: the plain squared distance, mean over positions);
3. add the Lagrangian term ``lambda * (E||z||_0 - N_target) / N`` (:class:`Lagrangian`; one-sided, a
   relu, as in LycheeDecode, or signed) with the
   closed-form ``kvsift.hardkuma_expected_l0``; backpropagate (torch autograd through the model,
   kvsift's gate gradients into a, b) and take an AdamW step.

Hyper-parameters default to LycheeDecode's (docs/algorithms/hardkuma.md §10.5): a = b = 1, AdamW lr
0.01 without weight decay, 20% linear warm-up and decay floored at 0.1x, lambda 2 (lr 1e-3, moving
average 0.9, at most 20), a and b clamped to [1e-6, 100] by the gate ops. Roles: E[Kuma(a, b)] > 0.5,
layer 0 forced (``kvsift.head_roles_from_gates``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ..gates import hardkuma_expected_l0, hardkuma_noise, hardkuma_sample, hardkuma_stats, head_roles_from_gates
from ..roles import HeadRoles
from .lagrangian import Lagrangian
from .student import GatedStudent, PromptState

LOSS_NORMS = ("teacher", "none")
CHAINS = ("retrieval", "previous_layer")
CONSTRAINTS = ("one_sided", "two_sided")


@dataclass(frozen=True)
class RoleTrainingConfig:
    """What :func:`train_roles` does; defaults are LycheeDecode's recipe except where noted.

    Attributes:
        target_heads: N_target, retrieval heads wanted beyond layer 0 (the density target is
            target_heads / N).
        steps: optimisation steps (LycheeDecode: 3000).
        prompts_per_step: prompts per step, all under the step's one gate draw (LycheeDecode: 1).
        budget, sink, recent: LycheeDecode's token selection in the student (sink and recent inside the budget).
        lr, warmup: AdamW's learning rate and the warm-up / decay fraction of the steps.
        lambda_init, lambda_lr, lambda_max, alpha: the Lagrangian (:class:`Lagrangian`).
        constraint: ``"one_sided"`` (LycheeDecode: E||z||_0 <= N_target) or ``"two_sided"`` (signed:
            E||z||_0 = N_target, lambda can fall).
        loss_norm: ``"teacher"`` (relative squared distance, the default here) or ``"none"``.
        chain: which heads write their index row in the student: ``"retrieval"`` (inference semantics)
            or ``"previous_layer"`` (LycheeDecode's training code).
        seed: the gate noise and the prompt draws (torch generators on the CPU, so a run is the same
            on every device up to floating-point differences).
        log_every: print a progress line every this many steps (0: never).
    """

    target_heads: int = 2
    steps: int = 3000
    prompts_per_step: int = 1
    budget: int = 128
    sink: int = 8
    recent: int = 16
    lr: float = 0.01
    warmup: float = 0.2
    lambda_init: float = 2.0
    lambda_lr: float = 1e-3
    lambda_max: float = 20.0
    alpha: float = 0.9
    constraint: str = "one_sided"
    loss_norm: str = "teacher"
    chain: str = "retrieval"
    seed: int = 1
    log_every: int = 0

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"kvsift.training: steps = {self.steps} must be >= 1")
        if self.prompts_per_step < 1:
            raise ValueError(f"kvsift.training: prompts_per_step = {self.prompts_per_step} must be >= 1")
        if self.target_heads < 0:
            raise ValueError(f"kvsift.training: target_heads = {self.target_heads} must be >= 0")
        if not self.lr > 0:
            raise ValueError(f"kvsift.training: lr = {self.lr} must be > 0")
        if not 0 < self.warmup <= 0.5:
            raise ValueError(f"kvsift.training: warmup = {self.warmup} must be in (0, 0.5]")
        if self.loss_norm not in LOSS_NORMS:
            raise ValueError(f"kvsift.training: loss_norm = '{self.loss_norm}' must be one of {LOSS_NORMS}")
        if self.constraint not in CONSTRAINTS:
            raise ValueError(f"kvsift.training: constraint = '{self.constraint}' must be one of {CONSTRAINTS}")
        if self.chain not in CHAINS:
            raise ValueError(f"kvsift.training: chain = '{self.chain}' must be one of {CHAINS}")

    def lr_factor(self, step: int) -> float:
        """LycheeDecode's (and DuoAttention's) schedule: linear warm-up and decay, floored at 0.1."""
        span = max(1.0, self.steps * self.warmup)
        return min(1.0, max((step + 1) / span, 0.1), max((self.steps - step) / span, 0.1))


@dataclass
class RoleTrainingResult:
    """What :func:`train_roles` learned.

    Attributes:
        roles: the learned :class:`kvsift.HeadRoles` (layer 0 forced to retrieval).
        a, b: the trained gate parameters ``[layers - 1, kv_heads]`` (layers >= 1).
        kuma_mean: E[Kuma(a, b)] per gate, the role score (> 0.5: retrieval), ``[layers - 1, kv_heads]``.
        history: one dict per logged step (and the last): step, loss, task, expected_l0, lam.
        prepare_seconds: the dense prefills and teacher logits; train_seconds: the optimisation.
    """

    roles: HeadRoles
    a: torch.Tensor
    b: torch.Tensor
    kuma_mean: torch.Tensor
    history: List[Dict[str, float]] = field(default_factory=list)
    prepare_seconds: float = 0.0
    train_seconds: float = 0.0
    config: Optional[RoleTrainingConfig] = None

    def learned_heads(self) -> List[Tuple[int, int]]:
        """(layer, KV head) of the retrieval heads beyond layer 0."""
        return [(l, h) for l in range(1, self.roles.layers) for h in range(self.roles.kv_heads)
                if self.roles.is_retrieval(l, h)]

    def roles_file_text(self, provenance: Sequence[str] = ()) -> str:
        """The roles file (kvsift's format) with ``#`` comment lines saying how it was made."""
        cfg = self.config
        last = self.history[-1] if self.history else {}
        lines = list(provenance)
        if cfg is not None:
            lines.append(
                f"End-to-end HardKuma role training (kvsift.training): {cfg.steps} steps x {cfg.prompts_per_step} prompt(s), "
                f"target {cfg.target_heads} heads beyond layer 0 of {self.a.numel()} gates, budget {cfg.budget} "
                f"(sink {cfg.sink}, recent {cfg.recent}), {cfg.constraint} constraint, loss_norm {cfg.loss_norm}, chain {cfg.chain}, seed {cfg.seed}.")
        if last:
            lines.append(f"Final E||z||_0 {last['expected_l0']:.4f}, lambda {last['lam']:.3f}, task {last['task']:.4f}.")
        learned = ", ".join(f"{l}.{h}" for l, h in self.learned_heads()) or "none"
        lines.append(f"Retrieval iff E[Kuma(a, b)] > 0.5, layer 0 forced. Learned: layer 0 + {learned}.")
        header = "".join(f"# {line}\n" for line in lines)
        return header + self.roles.format()

    def save(self, path: str, provenance: Sequence[str] = ()) -> None:
        """Writes :meth:`roles_file_text` (``kvsift.HeadRoles.load`` reads it back)."""
        with open(path, "w", encoding="ascii", newline="\n") as f:
            f.write(self.roles_file_text(provenance))


def _task_norm(state: PromptState, loss_norm: str) -> float:
    if loss_norm == "none":
        return 1.0
    t = state.teacher_logits
    return float((t - t.mean(-1, keepdim=True)).square().sum(-1).mean())


def prepare_prompts(student: GatedStudent, prompts: Sequence[Tuple[Sequence[int], Sequence[int]]]) -> List[PromptState]:
    """Dense prefill and teacher logits of each ``(answer digits, prompt ids)``; the student decodes the
    answer teacher-forced: inputs d1 .. d_{n-1} (d1 is the prefill's own prediction in the protocol, so
    the prompt's last position is dense in both and carries no loss)."""
    states = []
    for i, (answer, ids) in enumerate(prompts):
        if len(answer) < 2:
            raise ValueError(f"kvsift.training: prompts[{i}] answer has {len(answer)} tokens; at least 2 are needed")
        states.append(student.prepare(torch.tensor(list(ids)), torch.tensor(list(answer[:-1]))))
    return states


def train_roles(
    model: torch.nn.Module,
    prompts: Sequence[Tuple[Sequence[int], Sequence[int]]],
    config: RoleTrainingConfig = RoleTrainingConfig(),
    *,
    log: Callable[[str], None] = print,
) -> RoleTrainingResult:
    """Learns LycheeDecode head roles for ``model`` (a transformers Llama / Qwen3, float32 advised).

    Args:
        model: the frozen model, on the device to train on (its parameters get no gradient).
        prompts: ``(answer digits, prompt ids)`` pairs: the prompt ends where the answer starts (the
            passkey files' format, :func:`kvsift.training.read_passkey_prompts`).
        config: :class:`RoleTrainingConfig`.
        log: where progress lines go (``config.log_every``).
    """
    if len(prompts) == 0:
        raise ValueError("kvsift.training: prompts is empty")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    requires = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():  # no parameter gradients: only the activations' graph is needed
        p.requires_grad_(False)
    try:
        student = GatedStudent(model, budget=config.budget, sink=config.sink, recent=config.recent)
        if config.target_heads > (student.layers - 1) * student.kv_heads:
            raise ValueError(f"kvsift.training: target_heads = {config.target_heads} must be <= the gates "
                             f"(layers - 1) * kv_heads = {(student.layers - 1) * student.kv_heads}")
        t0 = time.perf_counter()
        states = prepare_prompts(student, prompts)
        norms = [_task_norm(s, config.loss_norm) for s in states]
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        prepare_seconds = time.perf_counter() - t0
        return _optimise(student, states, norms, config, log, prepare_seconds)
    finally:
        for p, r in zip(model.parameters(), requires):
            p.requires_grad_(r)
        model.train(was_training)


def _optimise(student: GatedStudent, states: List[PromptState], norms: List[float], config: RoleTrainingConfig,
              log: Callable[[str], None], prepare_seconds: float) -> RoleTrainingResult:
    device = states[0].tokens.device
    shape = (student.layers - 1, student.kv_heads)
    gates = shape[0] * shape[1]
    a = torch.ones(shape, device=device, requires_grad=True)   # Kuma(1, 1) = uniform, LycheeDecode's init
    b = torch.ones(shape, device=device, requires_grad=True)
    opt = torch.optim.AdamW([a, b], lr=config.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, config.lr_factor)
    lagrangian = Lagrangian(float(config.target_heads), gates, lam=config.lambda_init, lr=config.lambda_lr,
                            alpha=config.alpha, lam_max=config.lambda_max,
                            one_sided=config.constraint == "one_sided")
    gen = torch.Generator().manual_seed(config.seed)
    ones = torch.ones(1, student.kv_heads, device=device)
    history: List[Dict[str, float]] = []
    t0 = time.perf_counter()
    for step in range(config.steps):
        u = hardkuma_noise(shape, generator=gen).to(device)
        z = torch.cat([ones, hardkuma_sample(a, b, u)], 0)       # layer 0: always retrieval
        picks = torch.randint(len(states), (config.prompts_per_step,), generator=gen).tolist()
        task = 0.0
        for i in picks:
            s = states[i]
            diff = student.decode_logits(s, z, chain=config.chain) - s.teacher_logits
            task = task + diff.square().sum(-1).mean() / norms[i]
        task = task / len(picks)
        expected_l0 = hardkuma_expected_l0(a, b)                  # closed form, kvsift's gradient
        loss = task + lagrangian.penalty(expected_l0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        last = step == config.steps - 1
        if (config.log_every and step % config.log_every == 0) or last:
            rec = {"step": float(step), "loss": float(loss.detach()), "task": float(task.detach()),
                   "expected_l0": float(expected_l0.detach()), "lam": lagrangian.lam}
            history.append(rec)
            if config.log_every:
                log(f"step {step:5d}  loss {rec['loss']:.4f}  task {rec['task']:.4f}  "
                    f"E||z||_0 {rec['expected_l0']:.3f}  lambda {rec['lam']:.3f}")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    train_seconds = time.perf_counter() - t0
    a, b = a.detach(), b.detach()
    full_a = torch.cat([torch.ones_like(ones), a], 0)  # layer 0's row is forced to retrieval anyway
    full_b = torch.cat([torch.ones_like(ones), b], 0)
    roles = head_roles_from_gates(full_a, full_b)
    kuma_mean = hardkuma_stats(a, b).kuma_mean
    return RoleTrainingResult(roles, a.cpu(), b.cpu(), kuma_mean.cpu(), history, prepare_seconds, train_seconds, config)


__all__ = ["CHAINS", "CONSTRAINTS", "LOSS_NORMS", "RoleTrainingConfig", "RoleTrainingResult", "prepare_prompts", "train_roles"]
