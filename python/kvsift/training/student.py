"""The gated student of end-to-end role training: a frozen Llama whose decode-step attention mixes each
KV head's dense (retrieval) output with its sparse (LycheeDecode) output by a gate z.

Per layer l >= 1 and KV head j (the G query heads of the group share z[l, j]):

    O = z[l, j] * O_dense + (1 - z[l, j]) * O_sparse

- ``O_dense``: softmax attention over every key (the prompt's and the decode tokens' so far);
- ``O_sparse``: the same attention restricted to the tokens in row j of the index table, which the most
  recent earlier *retrieval* head of KV-head index j selected (LycheeDecode's inference semantics,
  docs/algorithms/lycheedecode.md): a head writes its row when it is a retrieval head in this draw,
  ``z[l, j] >= 0.5`` (layer 0 always writes: it is all retrieval and seeds every row). The selection
  is the top ``budget`` tokens of the group-mean query's raw scores ``mean_g(q_g) . k`` with the first
  ``sink`` and last ``recent`` tokens forced, by ``kvsift.topk``; it is not differentiated (a discrete
  choice), the mixed outputs are.
- Layer 0 is never mixed: always dense.

The prompt is prefilled densely (as in the passkey protocol and LycheeDecode: only decoding is sparse),
so its K/V are computed once per prompt with the frozen model and reused by every training step. Only
the teacher-forced decode tokens run through the gated student; their own K/V are the student's (what
sparse decoding would store). With every z = 1 the student is the dense model exactly, which is the
teacher.

Llama (and Qwen3, whose q/k norms are applied) from transformers; everything is plain torch autograd
except the top-k selection and, in the trainer, the gate ops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch
import torch.nn.functional as F

from ..ops import topk


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # HF's rotate-half convention; cos, sin [1, T, D] broadcast over heads.
    return x * cos.unsqueeze(1) + _rotate_half(x) * sin.unsqueeze(1)


@dataclass
class PromptState:
    """One training prompt, precomputed with the frozen dense model.

    Attributes:
        prefix_keys / prefix_values: per layer, the prompt's post-RoPE K and V ``[1, H_kv, P, D]``.
        tokens: the teacher-forced decode inputs ``[1, T]`` (the passkey digits d1..d_T).
        teacher_logits: the dense model's logits at those T positions ``[T, vocab]`` (the targets).
    """

    prefix_keys: List[torch.Tensor]
    prefix_values: List[torch.Tensor]
    tokens: torch.Tensor
    teacher_logits: torch.Tensor

    @property
    def prompt_length(self) -> int:
        return int(self.prefix_keys[0].shape[2])


class GatedStudent:
    """The frozen model's decode steps with gate-mixed attention (see the module docstring).

    Args:
        model: a transformers ``LlamaForCausalLM`` (or ``Qwen3ForCausalLM``); its parameters are not
            trained (their ``requires_grad`` is left alone, but nothing here asks for their gradients).
        budget, sink, recent: LycheeDecode's token selection (``sink + recent <= budget``).
    """

    def __init__(self, model: torch.nn.Module, *, budget: int, sink: int, recent: int):
        cfg = model.config
        if getattr(cfg, "model_type", None) not in ("llama", "qwen3"):
            raise NotImplementedError(
                f"kvsift.training: model_type = '{getattr(cfg, 'model_type', None)}' is not supported (llama, qwen3)")
        if budget < 1 or sink < 0 or recent < 0 or sink + recent > budget:
            raise ValueError(f"kvsift.training: budget = {budget} must be >= 1 and >= sink + recent = {sink} + {recent}")
        self.model = model
        self.base = model.model
        self.layers = int(cfg.num_hidden_layers)
        self.q_heads = int(cfg.num_attention_heads)
        self.kv_heads = int(cfg.num_key_value_heads)
        self.group = self.q_heads // self.kv_heads
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self.scale = self.head_dim ** -0.5
        self.budget, self.sink, self.recent = int(budget), int(sink), int(recent)

    # --- pieces of one layer ------------------------------------------------------------------
    def _qkv(self, layer: torch.nn.Module, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        b, t, _ = x.shape
        q = attn.q_proj(x).view(b, t, self.q_heads, self.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        if hasattr(attn, "q_norm"):  # Qwen3: per-head RMSNorm before RoPE
            q, k = attn.q_norm(q), attn.k_norm(k)
        return _rope(q, cos, sin), _rope(k, cos, sin), v

    def _finish_layer(self, layer: torch.nn.Module, h: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = attn_out.shape
        h = h + layer.self_attn.o_proj(attn_out.transpose(1, 2).reshape(b, t, self.q_heads * self.head_dim))
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def _rotary(self, h: torch.Tensor, positions: torch.Tensor):
        cos, sin = self.base.rotary_emb(h, positions.unsqueeze(0))
        return cos, sin

    # --- prefill ------------------------------------------------------------------------------
    @torch.no_grad()
    def prepare(self, prompt: torch.Tensor, decode_tokens: torch.Tensor) -> PromptState:
        """Dense prefill of ``prompt`` (int ``[P]``) and the teacher's logits at the ``decode_tokens`` (``[T]``).

        The teacher is this class's own forward with every gate open, so that z = 1 reproduces it
        exactly (tests check it against transformers' forward on prompt + decode tokens).
        """
        if prompt.dim() != 1 or decode_tokens.dim() != 1 or decode_tokens.numel() == 0:
            raise ValueError("kvsift.training: prompt and decode_tokens must be non-empty 1-D token tensors")
        device = next(self.model.parameters()).device
        ids = prompt.to(device).unsqueeze(0)
        h = self.base.embed_tokens(ids)
        cos, sin = self._rotary(h, torch.arange(ids.shape[1], device=device))
        keys, values = [], []
        for layer in self.base.layers[: self.layers]:
            q, k, v = self._qkv(layer, h, cos, sin)
            keys.append(k.contiguous())
            values.append(v.contiguous())
            kk = k.repeat_interleave(self.group, dim=1)
            vv = v.repeat_interleave(self.group, dim=1)
            o = F.scaled_dot_product_attention(q, kk, vv, is_causal=True, scale=self.scale)
            h = self._finish_layer(layer, h, o)
        state = PromptState(keys, values, decode_tokens.to(device).unsqueeze(0), torch.empty(0))
        ones = torch.ones(self.layers, self.kv_heads, device=device)
        state.teacher_logits = self.decode_logits(state, ones).detach()
        return state

    # --- the gated decode steps ---------------------------------------------------------------
    def _selection_mask(self, q: torch.Tensor, keys: torch.Tensor, prompt_len: int) -> torch.Tensor:
        """Bool ``[H_kv, T, S]``: the tokens each KV head's token selection keeps, per decode row."""
        _, _, t, d = q.shape
        s = keys.shape[2]
        with torch.no_grad():
            qbar = q[0].reshape(self.kv_heads, self.group, t, d).mean(1)       # group-mean query [H_kv, T, D]
            scores = torch.matmul(qbar, keys[0].transpose(-1, -2)).float()     # raw q.k, [H_kv, T, S]
            # decode row i sees the prompt and decode tokens 0..i: length P + i + 1
            lengths = (prompt_len + 1 + torch.arange(t, device=q.device, dtype=torch.int32)).repeat(self.kv_heads)
            sel = topk(scores.reshape(self.kv_heads * t, s).contiguous(), self.budget, lengths=lengths,
                       sink=self.sink, recent=self.recent)
            idx = sel.indices.long()
            idx = torch.where(idx < 0, torch.full_like(idx, s), idx)          # -1 (past the count) -> a spare column
            mask = torch.zeros(self.kv_heads * t, s + 1, dtype=torch.bool, device=q.device)
            mask.scatter_(1, idx, True)
            return mask[:, :s].reshape(self.kv_heads, t, s)

    def decode_logits(self, state: PromptState, z: torch.Tensor, *, chain: str = "retrieval") -> torch.Tensor:
        """The student's logits ``[T, vocab]`` at the decode positions, differentiable in ``z``.

        Args:
            state: from :meth:`prepare`.
            z: gates ``[layers, kv_heads]`` in [0, 1] (row 0 is ignored: layer 0 is dense).
            chain: which heads write their index row: ``"retrieval"`` (inference semantics: layer 0 and
                the heads with ``z >= 0.5`` in this draw) or ``"previous_layer"`` (every head, so a sparse
                head reads layer l - 1's selection, as LycheeDecode's released training code does).
        """
        if z.shape != (self.layers, self.kv_heads):
            raise ValueError(f"kvsift.training: z shape {list(z.shape)} must be [layers, kv_heads] = "
                             f"[{self.layers}, {self.kv_heads}]")
        if chain not in ("retrieval", "previous_layer"):
            raise ValueError(f"kvsift.training: chain = '{chain}' must be 'retrieval' or 'previous_layer'")
        tokens = state.tokens
        p, t = state.prompt_length, tokens.shape[1]
        device = tokens.device
        h = self.base.embed_tokens(tokens)
        cos, sin = self._rotary(h, torch.arange(p, p + t, device=device))
        s = p + t
        # decode row i attends to keys [0, P + i] (causal among the decode tokens)
        causal = torch.arange(s, device=device).unsqueeze(0) <= (p + torch.arange(t, device=device)).unsqueeze(1)
        neg = torch.finfo(h.dtype).min
        rows: Optional[torch.Tensor] = None  # [H_kv, T, S] the index table, one row per KV head
        writes = (z.detach() >= 0.5) if chain == "retrieval" else torch.ones_like(z, dtype=torch.bool)
        for l, layer in enumerate(self.base.layers[: self.layers]):
            q, k, v = self._qkv(layer, h, cos, sin)
            keys = torch.cat([state.prefix_keys[l], k], dim=2)                  # [1, H_kv, S, D]
            vals = torch.cat([state.prefix_values[l], v], dim=2)
            qg = q.reshape(1, self.kv_heads, self.group, t, self.head_dim)
            logits = torch.matmul(qg, keys.unsqueeze(2).transpose(-1, -2)) * self.scale   # [1, H_kv, G, T, S]
            dense = torch.matmul(torch.softmax(logits.masked_fill(~causal, neg), -1), vals.unsqueeze(2))
            if l == 0 or rows is None:
                out = dense
            else:
                # selected positions are < P + i + 1, so the selection is causal by construction
                sparse_logits = logits.masked_fill(~rows.unsqueeze(0).unsqueeze(2), neg)
                sparse = torch.matmul(torch.softmax(sparse_logits, -1), vals.unsqueeze(2))
                zz = z[l].to(dense.dtype).view(1, self.kv_heads, 1, 1, 1)
                out = zz * dense + (1 - zz) * sparse
            new_rows = self._selection_mask(q, keys, p)
            if l == 0 or rows is None:
                rows = new_rows
            else:
                rows = torch.where(writes[l].view(self.kv_heads, 1, 1), new_rows, rows)
            h = self._finish_layer(layer, h, out.reshape(1, self.q_heads, t, self.head_dim))
        return self.model.lm_head(self.base.norm(h))[0]


__all__ = ["GatedStudent", "PromptState"]
