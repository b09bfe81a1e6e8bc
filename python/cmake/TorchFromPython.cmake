# Finds the torch that `Python_EXECUTABLE` imports and defines two imported targets:
#   kvsift_torch_cpu   torch's headers, c10 + torch_cpu + torch, its C++ ABI flag
#   kvsift_torch_cuda  c10_cuda + torch_cuda (only for a CUDA build of torch)
# and KVSIFT_TORCH_VERSION, KVSIFT_TORCH_CUDA_VERSION (empty for a CPU build of torch).
#
# Why not find_package(Torch): TorchConfig.cmake of a CUDA wheel runs its own CUDA discovery (which
# warns or fails on a machine without the toolkit) and adds flags to every target. The extension
# needs only the headers, four libraries and the ABI flag, and torch itself reports them.
#
# Why the fallback to purelib: pip builds in an isolated environment by default, where the target
# environment's site-packages (and so its torch) is not importable. The interpreter is still the
# target one, so its sysconfig purelib is where the torch the package will run against lives.
set(_kvsift_torch_probe [=[
import sys
try:
    import torch
except ImportError:
    import sysconfig
    sys.path.append(sysconfig.get_paths()["purelib"])
    import torch
from torch.utils import cpp_extension
print("version=" + torch.__version__)
print("cuda=" + (torch.version.cuda or ""))
print("abi=" + str(int(torch._C._GLIBCXX_USE_CXX11_ABI)))
print("includes=" + "|".join(cpp_extension.include_paths()))
print("libdir=" + cpp_extension.library_paths()[0])
]=])
execute_process(COMMAND "${Python_EXECUTABLE}" -c "${_kvsift_torch_probe}"
                OUTPUT_VARIABLE _out ERROR_VARIABLE _err RESULT_VARIABLE _rc OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "kvsift python: `import torch` failed with ${Python_EXECUTABLE}; install torch first.\n${_err}")
endif()
foreach(_key version cuda abi includes libdir)
  if(NOT _out MATCHES "(^|\n)${_key}=([^\n]*)")
    message(FATAL_ERROR "kvsift python: the torch probe printed no '${_key}=' line:\n${_out}\n${_err}")
  endif()
  set(_torch_${_key} "${CMAKE_MATCH_2}")
endforeach()
set(KVSIFT_TORCH_VERSION "${_torch_version}")
set(KVSIFT_TORCH_CUDA_VERSION "${_torch_cuda}")
string(REPLACE "|" ";" _torch_includes "${_torch_includes}")

add_library(kvsift_torch_cpu INTERFACE IMPORTED)
# SYSTEM: torch's headers are not ours to warn about.
target_include_directories(kvsift_torch_cpu SYSTEM INTERFACE ${_torch_includes})
target_compile_definitions(kvsift_torch_cpu INTERFACE _GLIBCXX_USE_CXX11_ABI=${_torch_abi})
foreach(_lib c10 torch_cpu torch)
  find_library(KVSIFT_TORCH_LIB_${_lib} ${_lib} PATHS "${_torch_libdir}" NO_DEFAULT_PATH REQUIRED)
  target_link_libraries(kvsift_torch_cpu INTERFACE "${KVSIFT_TORCH_LIB_${_lib}}")
endforeach()

add_library(kvsift_torch_cuda INTERFACE IMPORTED)
if(KVSIFT_TORCH_CUDA_VERSION)
  foreach(_lib c10_cuda torch_cuda)
    find_library(KVSIFT_TORCH_LIB_${_lib} ${_lib} PATHS "${_torch_libdir}" NO_DEFAULT_PATH REQUIRED)
    target_link_libraries(kvsift_torch_cuda INTERFACE "${KVSIFT_TORCH_LIB_${_lib}}")
  endforeach()
endif()
