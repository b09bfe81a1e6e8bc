"""kvsift: long-context decoding kernels (top-k selection, decode attention, prompt compression, LycheeDecode,
HardKuma gates) as PyTorch custom ops.

The C++ library (header-only, ``include/kvsift``) is compiled into ``torch.ops.kvsift.*``: CPU tensors
run kvsift's host references (``kvsift::host``), CUDA tensors its kernels (``kvsift::cuda``) when the
package was built with CUDA. The functions here are thin typed wrappers; see docs/python.md.
"""

from __future__ import annotations

from importlib import metadata as _metadata

from . import _ops
from .ops import (
    COMPRESSION_POLICIES,
    CompressedCache,
    IndexSet,
    PromptCompressionConfig,
    TopKParams,
    compress_prompt,
    decode_attention,
    topk,
)
from .roles import HeadRoles, load_head_roles
from .lycheedecode import CORRECTION_INTERVAL, LYCHEEDECODE_SELECTIONS, LycheeDecode, LycheeDecodeConfig
from .gates import (
    HardKumaOptions,
    HardKumaStats,
    hardkuma_eval_gate,
    hardkuma_expected_l0,
    hardkuma_noise,
    hardkuma_sample,
    hardkuma_stats,
    head_roles_from_gates,
)

try:
    __version__: str = _metadata.version("kvsift")
except _metadata.PackageNotFoundError:  # a plain CMake build on PYTHONPATH, not pip-installed
    __version__ = _ops.ops.version()


def built_with_cuda() -> bool:
    """Whether this build registered the CUDA implementations (else CUDA tensors raise NotImplementedError)."""
    return bool(_ops.ops.built_with_cuda())


def header_version() -> str:
    """The version of the kvsift headers the ops were compiled from (include/kvsift/version.hpp)."""
    return str(_ops.ops.version())


__all__ = [
    "CORRECTION_INTERVAL",
    "LYCHEEDECODE_SELECTIONS",
    "LycheeDecode",
    "LycheeDecodeConfig",
    "COMPRESSION_POLICIES",
    "CompressedCache",
    "HardKumaOptions",
    "HardKumaStats",
    "HeadRoles",
    "IndexSet",
    "PromptCompressionConfig",
    "TopKParams",
    "__version__",
    "built_with_cuda",
    "compress_prompt",
    "decode_attention",
    "hardkuma_eval_gate",
    "hardkuma_expected_l0",
    "hardkuma_noise",
    "hardkuma_sample",
    "hardkuma_stats",
    "head_roles_from_gates",
    "header_version",
    "load_head_roles",
    "topk",
]
