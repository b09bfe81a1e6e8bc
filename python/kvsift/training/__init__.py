"""End-to-end HardKuma role training for LycheeDecode (docs/python.md, "Role training").

- :class:`GatedStudent`: a frozen transformers Llama whose decode-step attention mixes each KV head's
  dense and sparse outputs by a gate (``student.py``);
- :class:`Lagrangian`: the sparsity constraint and lambda's update (``lagrangian.py``);
- :func:`train_roles` / :class:`RoleTrainingConfig` / :class:`RoleTrainingResult`: the loop, the
  distillation objective on the teacher-forced answer's logits, the roles (``trainer.py``);
- :func:`read_passkey_prompts`, :func:`passkey_accuracy`: the passkey protocol through ``kvsift.hf``
  for measuring roles (``passkey.py``).

Needs transformers (the model); ``kvsift`` itself does not import this package.
"""

from .lagrangian import Lagrangian
from .passkey import passkey_accuracy, passkey_outputs, read_passkey_prompts
from .student import GatedStudent, PromptState
from .trainer import CHAINS, CONSTRAINTS, LOSS_NORMS, RoleTrainingConfig, RoleTrainingResult, prepare_prompts, train_roles

__all__ = [
    "CHAINS",
    "CONSTRAINTS",
    "GatedStudent",
    "LOSS_NORMS",
    "Lagrangian",
    "PromptState",
    "RoleTrainingConfig",
    "RoleTrainingResult",
    "passkey_accuracy",
    "passkey_outputs",
    "prepare_prompts",
    "read_passkey_prompts",
    "train_roles",
]
