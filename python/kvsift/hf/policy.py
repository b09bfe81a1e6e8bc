"""What ``kvsift.hf.enable(model, policy=...)`` accepts: one decoding policy, validated up front.

A policy says what the cache does after prefill (keep everything, or compress each layer's prompt
cache with ``kvsift.compress_prompt``) and how a decode step attends (dense, or LycheeDecode's mixed
heads). Everything is checked when the policy is made, so a bad value fails before the model runs,
with a ``ValueError`` naming the argument.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Union

from ..ops import PromptCompressionConfig
from ..roles import HeadRoles

POLICY_NAMES = ("dense", "clusterattn", "snapkv", "streamingllm", "h2o", "lycheedecode")
"""The ``name`` values of :class:`Policy` (lower case; ``enable`` also takes them in any case)."""

# The compress_prompt policy each compressing name runs.
_COMPRESSION_POLICY = {
    "clusterattn": "ClusterAttn",
    "snapkv": "SnapKV",
    "streamingllm": "StreamingLLM",
    "h2o": "H2O-prefill",
}


@dataclass(frozen=True)
class LycheeDecodeOptions:
    """LycheeDecode's token-mode selection (``kvsift::LycheeDecodeSelection::kToken``).

    Attributes:
        roles: which KV heads are retrieval heads; layer 0 must be all retrieval (it seeds every index row).
        budget: tokens a sparse head attends to per step, sink and recent included.
        sink: the first ``sink`` tokens, always selected.
        recent: the last ``recent`` tokens (the new one included), always selected.
    """

    roles: HeadRoles
    budget: int = 128
    sink: int = 8
    recent: int = 16


@dataclass(frozen=True)
class Policy:
    """One decoding policy for a Hugging Face model.

    Attributes:
        name: one of :data:`POLICY_NAMES`.
        compression: for the compressing policies, the ``kvsift.compress_prompt`` configuration run on
            every layer's cache once, right after the prefill's attention of that layer.
        lycheedecode: for ``"lycheedecode"``, the roles and the selection.
    """

    name: str
    compression: Optional[PromptCompressionConfig] = None
    lycheedecode: Optional[LycheeDecodeOptions] = None

    @property
    def compresses(self) -> bool:
        """Whether the prompt cache is compressed after prefill."""
        return self.compression is not None

    def describe(self) -> str:
        """A one-line description (for reports and tables)."""
        if self.compression is not None:
            c = self.compression
            extra = {
                "ClusterAttn": f", theta {c.theta}, num_block {c.num_block}",
                "SnapKV": f", {c.pool}-pool {c.pool_kernel}",
                "StreamingLLM": f", {c.sinks} sinks",
                "H2O-prefill": "",
            }[c.policy]
            return f"{c.policy} (capacity {c.capacity}, window {c.window}{extra})"
        if self.lycheedecode is not None:
            o = self.lycheedecode
            extra = [f"{l}.{h}" for l in range(1, o.roles.layers) for h in o.roles.retrieval_heads(l)]
            return (f"LycheeDecode (budget {o.budget}, sink {o.sink}, recent {o.recent}; "
                    f"retrieval: layer 0{' + ' + ', '.join(extra) if extra else ' only'})")
        return "dense"


def _positive(name: str, value: int, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"kvsift.hf: {name} = {value!r} must be an int >= {minimum}")
    return value


def make_policy(
    policy: Union[str, Policy] = "dense",
    *,
    capacity: int = 1024,
    window: int = 32,
    roles: Union[None, str, "os.PathLike[str]", HeadRoles] = None,
    budget: int = 128,
    sink: Optional[int] = None,
    recent: int = 16,
    **compression_options,
) -> Policy:
    """Builds a :class:`Policy` from a name and options (what ``enable`` calls).

    Args:
        policy: a :class:`Policy` (returned as is; no other option may be given) or a name of
            :data:`POLICY_NAMES`.
        capacity: compressing policies: tokens kept per KV head (the window included).
        window: compressing policies: the observation window W (the last W prompt tokens, always kept).
        roles: ``"lycheedecode"``: a roles file path or a :class:`kvsift.HeadRoles` (required).
        budget: ``"lycheedecode"``: tokens per sparse head per step.
        sink: ``"lycheedecode"``: forced first tokens (default 8); ``"streamingllm"``: sink tokens
            (default 4, the ``PromptCompressionConfig`` default).
        recent: ``"lycheedecode"``: forced last tokens.
        compression_options: further :class:`kvsift.PromptCompressionConfig` fields (``theta``,
            ``num_block``, ``pool_kernel``, ...).

    Raises:
        ValueError: an unknown name, an option the policy does not take, or a bad value (naming it).
    """
    if isinstance(policy, Policy):
        return policy
    if not isinstance(policy, str):
        raise ValueError(f"kvsift.hf: policy must be a name in {POLICY_NAMES} or a kvsift.hf.Policy (got {policy!r})")
    name = policy.lower().replace("-", "").replace("_", "")
    if name == "h2oprefill":
        name = "h2o"
    if name not in POLICY_NAMES:
        raise ValueError(f"kvsift.hf: policy = {policy!r} is not one of {POLICY_NAMES}")
    if name != "lycheedecode" and roles is not None:
        raise ValueError(f"kvsift.hf: roles is only for policy 'lycheedecode' (policy = {policy!r})")
    if name == "dense":
        if compression_options:
            raise ValueError(f"kvsift.hf: policy 'dense' takes no options (got {sorted(compression_options)})")
        return Policy("dense")
    if name == "lycheedecode":
        if compression_options:
            raise ValueError(f"kvsift.hf: policy 'lycheedecode' takes roles, budget, sink, recent "
                             f"(got {sorted(compression_options)})")
        if roles is None:
            raise ValueError("kvsift.hf: roles is required for policy 'lycheedecode' (a roles file path or a kvsift.HeadRoles)")
        loaded = roles if isinstance(roles, HeadRoles) else HeadRoles.load(roles)
        s = 8 if sink is None else sink
        _positive("budget", budget)
        _positive("sink", s, 0)
        _positive("recent", recent, 0)
        if budget < s + recent:
            raise ValueError(f"kvsift.hf: budget = {budget} must be >= sink + recent = {s + recent}")
        if not all(loaded.retrieval[0]):
            raise ValueError("kvsift.hf: roles: layer 0 must be all retrieval heads ('R'): it seeds every index row")
        return Policy("lycheedecode", lycheedecode=LycheeDecodeOptions(loaded, budget, s, recent))
    options = dict(compression_options)
    if sink is not None:
        if name != "streamingllm":
            raise ValueError(f"kvsift.hf: sink is for 'lycheedecode' and 'streamingllm' (policy = {policy!r})")
        options["sinks"] = sink
    known = set(PromptCompressionConfig.__dataclass_fields__) - {"policy", "capacity", "window"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"kvsift.hf: unknown option(s) {unknown} for policy {policy!r}; "
                         f"PromptCompressionConfig fields are {sorted(known)}")
    _positive("capacity", capacity, 2)
    _positive("window", window)
    if capacity <= window:
        raise ValueError(f"kvsift.hf: capacity = {capacity} must be > window = {window}")
    config = PromptCompressionConfig(_COMPRESSION_POLICY[name], capacity=capacity, window=window, **options)
    return Policy(name, compression=config)


def check_policy_for_model(policy: Policy, num_layers: int, num_kv_heads: int) -> None:
    """Rejects a roles table made for another model shape (both shapes in the message)."""
    if policy.lycheedecode is None:
        return
    r = policy.lycheedecode.roles
    if (r.layers, r.kv_heads) != (num_layers, num_kv_heads):
        raise ValueError(
            f"kvsift.hf: roles are for {r.layers} layers x {r.kv_heads} KV heads, the model has "
            f"{num_layers} layers x {num_kv_heads} KV heads"
        )


__all__ = ["LycheeDecodeOptions", "POLICY_NAMES", "Policy", "check_policy_for_model", "make_policy"]
