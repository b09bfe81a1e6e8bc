"""``enable(model, policy=...)``: switch a transformers Llama / Qwen3 model to kvsift attention.

It registers the ``"kvsift"`` attention function, sets it as the model's implementation, and wraps
the instance's ``generate`` so that every call without a cache of its own gets a fresh
:class:`KvsiftCache` under the policy. ``model.generate(...)`` is otherwise unchanged.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Optional

import torch

from .attention import ATTENTION_NAME, register
from .cache import DEFAULT_RESERVE, KvsiftCache
from .policy import Policy, check_policy_for_model, make_policy

SUPPORTED_MODEL_TYPES = ("llama", "qwen3")
"""``config.model_type`` values whose attention layers follow the pattern kvsift.hf relies on
(post-RoPE q/k, ``cache.update`` then the attention interface, no sliding window, no attention sinks)."""

HEAD_DIMS = (64, 128, 256)
"""The head dims kvsift's decode attention is built for."""


def _text_config(model: torch.nn.Module) -> Any:
    config = model.config
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def check_model(model: torch.nn.Module) -> Any:
    """Checks the model is one kvsift.hf handles; returns its text config. Raises ValueError / NotImplementedError."""
    if not hasattr(model, "config"):
        raise ValueError(f"kvsift.hf: model must be a transformers PreTrainedModel (got {type(model).__name__})")
    config = _text_config(model)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise NotImplementedError(f"kvsift.hf: model_type = {model_type!r} is not supported (supported: "
                                  f"{SUPPORTED_MODEL_TYPES})")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head_dim not in HEAD_DIMS:
        raise NotImplementedError(f"kvsift.hf: head_dim = {head_dim} is not supported (kvsift's decode attention: "
                                  f"{HEAD_DIMS})")
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        raise NotImplementedError("kvsift.hf: sliding-window attention (use_sliding_window) is not supported")
    if config.num_attention_heads % (getattr(config, "num_key_value_heads", None) or config.num_attention_heads):
        raise ValueError("kvsift.hf: num_attention_heads must be a multiple of num_key_value_heads")
    return config


def _cache_argument(model: torch.nn.Module) -> str:
    # transformers 5.x renamed forward's past_key_values to cache (5.24 takes both, with a warning).
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _check_unpadded(attention_mask: Optional[torch.Tensor]) -> None:
    # One host read per generate call (not per step): kvsift masks by position, so a padded batch
    # would attend to its pad tokens silently.
    if attention_mask is not None and not bool(attention_mask.bool().all()):
        raise ValueError("kvsift.hf: attention_mask has padding; kvsift.hf decodes batches of equal-length prompts "
                         "only (generate them separately, or batch prompts of one length)")


_UNSET: Any = object()


def make_cache(model: torch.nn.Module, policy: Any = None, *, reserve: int = DEFAULT_RESERVE, keep_queries: int = 0,
               page_size: Optional[int] = _UNSET, **policy_options: Any) -> KvsiftCache:
    """A :class:`KvsiftCache` for ``model`` (default: the policy and ``page_size`` ``enable`` set), for
    generate or forward."""
    config = check_model(model)
    if policy is None:
        policy = getattr(model, "_kvsift_policy", None) or "dense"
    if page_size is _UNSET:
        page_size = getattr(model, "_kvsift_page_size", None)
    return KvsiftCache(config, policy, reserve=reserve, keep_queries=keep_queries, page_size=page_size,
                       **policy_options)


def enable(model: torch.nn.Module, policy: Any = "dense", *, page_size: Optional[int] = None,
           **policy_options: Any) -> torch.nn.Module:
    """Makes ``model`` attend through kvsift under ``policy``; returns the model.

    Args:
        model: a transformers ``LlamaForCausalLM`` / ``Qwen3ForCausalLM`` (or their base models).
        policy: a :class:`kvsift.hf.Policy` or a name: ``"dense"``, ``"clusterattn"``, ``"snapkv"``,
            ``"streamingllm"``, ``"h2o"``, ``"lycheedecode"`` (see :func:`kvsift.hf.make_policy`).
        page_size: None: generate's cache keeps contiguous buffers; an int: a paged cache with pages of
            that many tokens (page pools and a block table per layer, as an engine keeps them).
        policy_options: the policy's options (``capacity``, ``window``, ``theta``, ``roles``, ...).

    Raises:
        ImportError: transformers missing or older than 5.0.
        ValueError / NotImplementedError: an unsupported model or a bad policy option (named).
    """
    import transformers

    from .versions import check_transformers_version

    check_transformers_version(transformers.__version__)
    config = check_model(model)
    resolved: Policy = make_policy(policy, **policy_options)
    if page_size is not None and (isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1):
        raise ValueError(f"kvsift.hf: page_size = {page_size!r} must be None or an int >= 1")
    check_policy_for_model(resolved, int(config.num_hidden_layers),
                           int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads))
    register()
    if not hasattr(model, "_kvsift_previous_attn"):
        model._kvsift_previous_attn = model.config._attn_implementation
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(ATTENTION_NAME)
    else:
        model.config._attn_implementation = ATTENTION_NAME
    model._kvsift_policy = resolved
    model._kvsift_page_size = page_size

    if not hasattr(model, "_kvsift_original_generate"):
        original = model.generate
        model._kvsift_original_generate = original
        cache_arg = _cache_argument(model)

        @functools.wraps(original)
        def generate(*args: Any, **kwargs: Any) -> Any:
            user_cache = kwargs.get("cache", kwargs.get("past_key_values"))
            _check_unpadded(kwargs.get("attention_mask"))
            if user_cache is None and kwargs.get("use_cache", True):
                max_new = kwargs.get("max_new_tokens") or getattr(model.generation_config, "max_new_tokens", None)
                reserve = int(max_new) + 1 if max_new else DEFAULT_RESERVE
                kwargs[cache_arg] = KvsiftCache(_text_config(model), model._kvsift_policy, reserve=reserve,
                                                page_size=model._kvsift_page_size)
            return original(*args, **kwargs)

        model.generate = generate
    return model


def disable(model: torch.nn.Module) -> torch.nn.Module:
    """Undoes :func:`enable`: the previous attention implementation and the original generate."""
    previous = getattr(model, "_kvsift_previous_attn", None)
    if previous is not None:
        if hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation(previous)
        else:
            model.config._attn_implementation = previous
        del model._kvsift_previous_attn
    if hasattr(model, "_kvsift_original_generate"):
        del model.generate  # the instance attribute; the class's generate shows through again
        del model._kvsift_original_generate
    for name in ("_kvsift_policy", "_kvsift_page_size"):
        if hasattr(model, name):
            delattr(model, name)
    return model


__all__ = ["HEAD_DIMS", "SUPPORTED_MODEL_TYPES", "check_model", "disable", "enable", "make_cache"]
