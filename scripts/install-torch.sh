#!/usr/bin/env bash
# Installs torch into a Python environment for the Python suite (scripts/test-python.sh), with as
# little disk as the machine allows.
#
#   scripts/install-torch.sh PYTHON [TORCH_SPEC]     TORCH_SPEC default torch==2.11.0
#
# torch from PyPI is the CUDA build on Linux; its nvidia-* and triton wheels are about 3.4 GB more on
# disk than torch itself (5 GB in all: a CI machine ran out of space there). Where the CUDA 13 toolkit is
# installed (nvcc's lib64 holds libcudart.so.13, as on the project's CI and CPU machines), torch goes in
# without its dependencies and takes its CUDA libraries from the toolkit (found by the loader), with only the pure-Python
# needs and the three libraries the toolkit lacks (cuFile, cuSPARSELt, NVSHMEM) from PyPI, at the
# versions torch's own metadata pins: 1.6 GB. If that torch does not import, the full dependencies are
# installed after all. KVSIFT_TORCH_LIBS=pypi forces torch's own wheels, =toolkit the toolkit's.
set -euo pipefail
py=$1
spec=${2:-torch==2.11.0}
toolkit_lib=${CUDA_HOME:-/usr/local/cuda}/lib64
libs=${KVSIFT_TORCH_LIBS:-}
if [ -z "$libs" ]; then
  if [ -e "$toolkit_lib/libcudart.so.13" ]; then libs=toolkit; else libs=pypi; fi
fi
pip_install() { "$py" -m pip install --quiet --no-cache-dir "$@"; }

if "$py" -c "import torch" 2>/dev/null; then exit 0; fi  # already there (a reused venv)

if [ "$libs" = toolkit ]; then
  echo "install-torch.sh: $spec without its CUDA wheels (libraries from $toolkit_lib; KVSIFT_TORCH_LIBS=pypi for torch's own)"
  pip_install --no-deps "$spec"
  pip_install packaging  # to read torch's requirements below
  # torch's requirements for this platform, less what the toolkit provides; the cuda-toolkit
  # meta-package is kept for the one library of it the toolkit here lacks (cufile).
  mapfile -t needs < <("$py" - <<'PY'
from importlib.metadata import requires
from packaging.requirements import Requirement
for line in requires("torch") or []:
    r = Requirement(line)
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue
    name = r.name.lower().replace("_", "-")
    if name in ("triton", "cuda-bindings") or name.startswith(("nvidia-cudnn", "nvidia-nccl")):
        continue
    if name == "cuda-toolkit":
        print(f"cuda-toolkit[cufile]{r.specifier}")
        continue
    print(str(Requirement(f"{r.name}{'[' + ','.join(sorted(r.extras)) + ']' if r.extras else ''}{r.specifier}")))
PY
  )
  echo "install-torch.sh: pip's resolver may warn that torch's cudnn, nccl, triton and cuda-bindings wheels are missing: on purpose"
  pip_install "${needs[@]}"
  # The loader must find the toolkit's libraries by itself (ld.so.cache), as it does where the toolkit
  # is installed system-wide: nothing later sets LD_LIBRARY_PATH for them.
  if "$py" -c "import torch" 2>/tmp/install-torch.$$.err; then
    rm -f /tmp/install-torch.$$.err
    exit 0
  fi
  echo "install-torch.sh: torch does not import on the toolkit's libraries:" >&2
  tail -3 /tmp/install-torch.$$.err >&2; rm -f /tmp/install-torch.$$.err
  echo "install-torch.sh: installing its own CUDA wheels instead" >&2
fi
pip_install "$spec"
