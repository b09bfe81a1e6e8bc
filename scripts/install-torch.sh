#!/usr/bin/env bash
# Installs torch into a Python environment for the Python suite (scripts/test-python.sh), with as
# little disk as the machine allows.
#
#   scripts/install-torch.sh PYTHON [TORCH_SPEC]     TORCH_SPEC default torch==2.11.0
#
# torch from PyPI is the CUDA build on Linux; its nvidia-* and triton wheels are about 3.4 GB more on
# disk than torch itself (5 GB in all: a CI machine ran out of space there). Where the CUDA 13 toolkit
# is installed (nvcc's lib64 holds libcudart.so.13, as on the project's CI and CPU machines), torch
# goes in without its dependencies and loads its CUDA libraries from the toolkit; only its pure-Python
# needs and the three libraries a toolkit lacks (cuFile, cuSPARSELt, NVSHMEM) come from PyPI, at the
# versions torch's own metadata pins: 1.6 GB. If that torch does not import, its own CUDA wheels are
# installed after all. KVSIFT_TORCH_LIBS=pypi forces them, =toolkit tries the toolkit's anyway.
set -euo pipefail
py=$1
spec=${2:-torch==2.11.0}
toolkit_lib=${CUDA_HOME:-/usr/local/cuda}/lib64
libs=${KVSIFT_TORCH_LIBS:-}
if [ -z "$libs" ]; then
  if [ -e "$toolkit_lib/libcudart.so.13" ]; then libs=toolkit; else libs=pypi; fi
fi
pip_install() { "$py" -m pip install --quiet --no-cache-dir "$@"; }

# Python with `packaging` (pip's vendored copy where the package is not installed), for requirements.
with_packaging() {
  "$py" - "$@" <<'PY'
import sys
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
from importlib.metadata import PackageNotFoundError, requires, version

if sys.argv[1] == "satisfied":  # exit 0 when an installed torch that imports matches the spec
    want = Requirement(sys.argv[2])
    try:
        have = version(want.name)
        import torch  # noqa: F401
    except (PackageNotFoundError, ImportError, OSError):
        sys.exit(1)
    sys.exit(0 if want.specifier.contains(have, prereleases=True) else 1)

# "needs": torch's requirements on this platform, less what the toolkit provides; the cuda-toolkit
# meta-package stays for the one library of it a toolkit lacks (cufile).
for line in requires("torch") or []:
    r = Requirement(line)
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue
    name = r.name.lower().replace("_", "-")
    if name in ("triton", "cuda-bindings") or name.startswith(("nvidia-cudnn", "nvidia-nccl")):
        continue
    extras = "[cufile]" if name == "cuda-toolkit" else ("[" + ",".join(sorted(r.extras)) + "]" if r.extras else "")
    print(f"{r.name}{extras}{r.specifier}")
PY
}

if with_packaging satisfied "$spec"; then exit 0; fi  # a reused venv

if [ "$libs" = toolkit ]; then
  echo "install-torch.sh: $spec without its CUDA wheels (libraries from $toolkit_lib; KVSIFT_TORCH_LIBS=pypi for torch's own)"
  pip_install --no-deps "$spec"
  mapfile -t needs < <(with_packaging needs)
  echo "install-torch.sh: pip may warn that torch's cudnn, nccl, triton and cuda-bindings wheels are missing: on purpose"
  pip_install "${needs[@]}"
  # The loader must find the toolkit's libraries by itself (ld.so.cache), as it does where the toolkit
  # is installed system-wide: nothing later sets LD_LIBRARY_PATH for them.
  err=$(mktemp)
  if "$py" -c "import torch" 2>"$err"; then
    rm -f "$err"
    exit 0
  fi
  echo "install-torch.sh: torch does not import on the toolkit's libraries:" >&2
  tail -3 "$err" >&2
  rm -f "$err"
  echo "install-torch.sh: installing its own CUDA wheels instead" >&2
fi
pip_install "$spec"
