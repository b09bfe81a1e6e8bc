"""The head-roles file (``include/kvsift/gates/roles_file.hpp``): what gate training hands to LycheeDecode.

Plain text, one row per layer, one character per KV head in the model's original order::

    # comments start with '#'; blank lines are ignored
    kvsift-head-roles v1 layers=32 kv_heads=8
    RRRRRRRR
    SSRSSSSS
    ...

``R`` = retrieval head (dense attention, selects the index set), ``S`` = sparse head. Parsing and
formatting are kvsift's C++ (``parse_head_roles`` / ``format_head_roles`` through
``torch.ops.kvsift``), so the Python loader accepts and rejects exactly what the C++ engine does, with
the same messages (``ValueError``, naming the line and column).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

import torch

from ._ops import ops

MAGIC = "kvsift-head-roles"
"""The first word of a roles file's header line (``kvsift-head-roles v1 layers=<n> kv_heads=<n>``)."""

MAX_KV_HEADS = 256
"""kvsift's ``kMaxKvHeads``: KV heads per layer a roles table can describe."""


@dataclass(frozen=True)
class HeadRoles:
    """The C++ ``kvsift::HeadRoles``: which KV head of which layer is a retrieval head.

    Attributes:
        layers: transformer layers.
        kv_heads: KV heads per layer, in ``[1, 256]``.
        retrieval: ``layers`` tuples of ``kv_heads`` bools, True = retrieval ('R'), False = sparse ('S').
    """

    layers: int
    kv_heads: int
    retrieval: Tuple[Tuple[bool, ...], ...]

    def __post_init__(self) -> None:
        if len(self.retrieval) != self.layers or any(len(row) != self.kv_heads for row in self.retrieval):
            raise ValueError(
                f"kvsift.HeadRoles: retrieval must be {self.layers} rows of {self.kv_heads} bools "
                f"(got {len(self.retrieval)} rows)"
            )

    @classmethod
    def from_tensor(cls, retrieval: torch.Tensor) -> "HeadRoles":
        """From a bool ``[layers, kv_heads]`` tensor (True = retrieval), e.g. thresholded gates."""
        if retrieval.dim() != 2:
            raise ValueError(f"kvsift.HeadRoles: retrieval must be [layers, kv_heads] (got shape {tuple(retrieval.shape)})")
        rows = tuple(tuple(bool(x) for x in row) for row in retrieval.to(device="cpu", dtype=torch.bool).tolist())
        return cls(int(retrieval.shape[0]), int(retrieval.shape[1]), rows)

    @classmethod
    def parse(cls, text: str, *, expected_layers: Optional[int] = None,
              expected_kv_heads: Optional[int] = None) -> "HeadRoles":
        """Parses a roles file's text (kvsift's ``parse_head_roles``).

        ``expected_layers`` / ``expected_kv_heads`` are the model's: a file made for another model is
        rejected with both numbers in the message. Raises ``ValueError`` for malformed text (the message
        names the line and column), ``NotImplementedError`` for kv_heads > 256.
        """
        table = ops.parse_head_roles(
            text, -1 if expected_layers is None else int(expected_layers),
            -1 if expected_kv_heads is None else int(expected_kv_heads),
        )
        return cls.from_tensor(table)

    @classmethod
    def load(cls, path: Union[str, "os.PathLike[str]"], *, expected_layers: Optional[int] = None,
             expected_kv_heads: Optional[int] = None) -> "HeadRoles":
        """Reads and parses the roles file at ``path`` (kvsift's ``read_head_roles_file``).

        Errors are ``ValueError`` prefixed with the path, as in C++: a file that cannot be opened
        (``path = '...' cannot be opened for reading``) or does not parse.
        """
        p = os.fspath(path)
        try:
            with open(p, "rb") as f:
                data = f.read()
        except OSError as e:
            raise ValueError(f"kvsift.HeadRoles.load: path = '{p}' cannot be opened for reading ({e.strerror})") from e
        try:
            return cls.parse(data.decode("latin-1"), expected_layers=expected_layers,
                             expected_kv_heads=expected_kv_heads)
        except (ValueError, NotImplementedError) as e:
            raise type(e)(f"{p}: {e}") from e

    def to_tensor(self) -> torch.Tensor:
        """A bool ``[layers, kv_heads]`` CPU tensor, True = retrieval."""
        return torch.tensor(self.retrieval, dtype=torch.bool).reshape(self.layers, self.kv_heads)

    def format(self) -> str:
        """The roles file text (kvsift's ``format_head_roles``); :meth:`parse` reads it back unchanged."""
        return str(ops.format_head_roles(self.to_tensor()))

    def save(self, path: Union[str, "os.PathLike[str]"]) -> None:
        """Writes :meth:`format` to ``path``, replacing the file."""
        with open(os.fspath(path), "w", encoding="ascii", newline="\n") as f:
            f.write(self.format())

    def is_retrieval(self, layer: int, head: int) -> bool:
        """Whether KV head ``head`` of layer ``layer`` is a retrieval head."""
        return self.retrieval[layer][head]

    def retrieval_heads(self, layer: int) -> List[int]:
        """Layer ``layer``'s retrieval (dense) KV heads, ascending."""
        return [h for h, r in enumerate(self.retrieval[layer]) if r]

    def sparse_heads(self, layer: int) -> List[int]:
        """Layer ``layer``'s sparse KV heads, ascending: :func:`kvsift.decode_attention`'s ``sparse_heads``."""
        return [h for h, r in enumerate(self.retrieval[layer]) if not r]

    def retrieval_count(self) -> int:
        """Retrieval heads over all layers."""
        return sum(sum(row) for row in self.retrieval)


def load_head_roles(path: Union[str, "os.PathLike[str]"], *, expected_layers: Optional[int] = None,
                    expected_kv_heads: Optional[int] = None) -> HeadRoles:
    """:meth:`HeadRoles.load`."""
    return HeadRoles.load(path, expected_layers=expected_layers, expected_kv_heads=expected_kv_heads)


__all__: Sequence[str] = ("HeadRoles", "MAGIC", "MAX_KV_HEADS", "load_head_roles")
