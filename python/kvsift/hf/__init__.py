"""kvsift for Hugging Face transformers: ``kvsift.hf.enable(model, policy=...)``, then ``model.generate``.

Import it explicitly (``import kvsift.hf``): it needs transformers, which ``kvsift`` itself does not.

- :func:`enable` / :func:`disable`: the model's attention through kvsift, generate with a kvsift cache;
- :class:`KvsiftCache`: the ``Cache`` that owns the KV (contiguous buffers, or page pools with a block
  table: ``page_size=...``, with int32 lengths) and runs the policy: prompt compression after prefill,
  or LycheeDecode in decode steps;
- :func:`make_policy` / :class:`Policy`: the policies and their options.

See docs/python.md, "Hugging Face".
"""

from __future__ import annotations

from .attention import ATTENTION_NAME, kvsift_attention, register
from .cache import KvsiftCache, KvsiftCacheLayer
from .enable import disable, enable, make_cache
from .policy import POLICY_NAMES, LycheeDecodeOptions, Policy, make_policy
from .versions import REQUIREMENT, TESTED_MAX, TESTED_MIN

__all__ = [
    "ATTENTION_NAME",
    "KvsiftCache",
    "KvsiftCacheLayer",
    "LycheeDecodeOptions",
    "POLICY_NAMES",
    "Policy",
    "REQUIREMENT",
    "TESTED_MAX",
    "TESTED_MIN",
    "disable",
    "enable",
    "kvsift_attention",
    "make_cache",
    "make_policy",
    "register",
]
