#!/usr/bin/env bash
# Builds the Python package (python/) and runs its pytest suite.
#
#   scripts/test-python.sh            a venv in build/python-venv (made on first use): installs torch
#                                     ($KVSIFT_TORCH, default the version the GPU machine has, through
#                                     scripts/install-torch.sh: KVSIFT_TORCH_LIBS), pytest and
#                                     transformers ($KVSIFT_TRANSFORMERS) from the package registry, then
#                                     `pip install ./python`, then pytest.
#   scripts/test-python.sh --system   the current python3 as it is, nothing downloaded (a machine without
#                                     a package registry, e.g. the GPU machine): needs torch and pytest;
#                                     installs with pip when scikit-build-core is there, else builds
#                                     python/ with plain CMake and runs the tests from the source tree.
#
# The CUDA ops are compiled when nvcc is found and torch is a CUDA build (KVSIFT_PYTHON_CUDA=AUTO; set
# it to OFF or ON to force). CUDA tests run on a GPU and are reported as skipped without one.
# Extra arguments go to pytest (e.g. -k topk). The exit status is pytest's.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"

mode=venv
if [ "${1:-}" = "--system" ]; then
  mode=system
  shift
fi
export KVSIFT_PYTHON_CUDA="${KVSIFT_PYTHON_CUDA:-AUTO}"
if [ "$KVSIFT_PYTHON_CUDA" != OFF ] && [ -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null 2>&1; then
  export PATH="$PATH:/usr/local/cuda/bin"  # where the CUDA toolkit installs nvcc; CMake's check_language looks on PATH
fi

if [ "$mode" = venv ]; then
  venv="${KVSIFT_PYTHON_VENV:-$root/build/python-venv}"
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
  fi
  py="$venv/bin/python"
  # torch from PyPI: on Linux that is the CUDA build, which imports and runs CPU tensors without a GPU;
  # scripts/install-torch.sh takes its CUDA libraries from the toolkit where one is installed (1.6 GB
  # on disk instead of 5). transformers for kvsift.hf's tests (python/kvsift/hf/versions.py: the
  # tested range; the --system mode installs nothing, and the HF tests are skipped where transformers
  # is missing). No pip cache: the venv keeps what it installed, a cached copy would only double it.
  scripts/install-torch.sh "$py" "${KVSIFT_TORCH:-torch==2.11.0}"
  "$py" -m pip install --quiet --no-cache-dir pytest numpy "${KVSIFT_TRANSFORMERS:-transformers>=5.17,<5.25}"
  # A fresh build every time (the package is small; the build tree is pip's temporary one).
  "$py" -m pip install --quiet --no-cache-dir --force-reinstall --no-deps ./python
  pythonpath=""
else
  py="$(command -v python3)"
  "$py" -c "import torch, pytest" || { echo "test-python.sh --system: needs torch and pytest in $py" >&2; exit 1; }
  if "$py" -c "import scikit_build_core" 2>/dev/null; then
    "$py" -m pip install --no-build-isolation --no-deps --force-reinstall ./python
    pythonpath=""
  else
    echo "test-python.sh: no scikit-build-core; building python/ with CMake into build/python (PYTHONPATH=python)"
    cmake -S python -B build/python -DPython_EXECUTABLE="$py" -DCMAKE_BUILD_TYPE=Release \
          -DKVSIFT_PYTHON_CUDA="$KVSIFT_PYTHON_CUDA" -DKVSIFT_PYTHON_INPLACE=ON
    cmake --build build/python --parallel "$(nproc)"
    pythonpath="$root/python"
  fi
fi

"$py" -c "import torch; print('torch', torch.__version__, '| CUDA device:', torch.cuda.is_available())"
# From the repository root, not python/: pytest must import the installed package, not the source
# directory (which has no _C.so unless built in place).
if [ -n "$pythonpath" ]; then export PYTHONPATH="$pythonpath${PYTHONPATH:+:$PYTHONPATH}"; fi
exec "$py" -m pytest python/tests -q -p no:cacheprovider "$@"
