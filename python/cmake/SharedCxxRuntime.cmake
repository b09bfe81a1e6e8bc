# kvsift_link_shared_cxx_runtime(<target>): make <target> use the shared C++ runtime (libstdc++.so.6),
# the one torch's libraries are linked against, even where the toolchain only offers the static archive.
#
# Why: g++ links `-lstdc++`, which takes libstdc++.a when the development link libstdc++.so is missing
# (a toolchain image with the runtime package but not all of libstdc++-N-dev). The extension then carries
# its own copy of the library's internals - iostream and locale state included - beside the copy torch
# loaded. Because torch.ops.load_library opens _C.so with local symbol scope, the extension's references
# bind to its own copy, whose locale facets were never set up: the first std::ostringstream that formats
# a number (every kvsift error message) dereferences a null facet and the process dies with SIGSEGV.
# Naming the shared runtime ahead of g++'s implicit `-lstdc++` resolves every symbol there, so nothing is
# taken from the archive.
function(kvsift_link_shared_cxx_runtime target)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU" OR NOT CMAKE_SYSTEM_NAME STREQUAL "Linux")
    return()
  endif()
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libstdc++.so
                  OUTPUT_VARIABLE _dev_link OUTPUT_STRIP_TRAILING_WHITESPACE)
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libstdc++.so.6
                  OUTPUT_VARIABLE _runtime OUTPUT_STRIP_TRAILING_WHITESPACE)
  # -print-file-name answers with the bare name when it finds nothing.
  if(IS_ABSOLUTE "${_dev_link}" AND EXISTS "${_dev_link}")
    return()  # the usual case: -lstdc++ already means the shared library
  endif()
  if(IS_ABSOLUTE "${_runtime}" AND EXISTS "${_runtime}")
    get_filename_component(_runtime "${_runtime}" REALPATH)
    message(STATUS "kvsift python: the toolchain has no libstdc++.so development link; linking ${_runtime} "
                   "explicitly so the extension shares torch's C++ runtime instead of a static copy")
    target_link_libraries(${target} PRIVATE "${_runtime}")
  else()
    message(FATAL_ERROR "kvsift python: ${CMAKE_CXX_COMPILER} finds neither libstdc++.so nor libstdc++.so.6; "
                        "a static libstdc++ inside the extension crashes at its first error message. Install "
                        "the compiler's libstdc++ development package (e.g. libstdc++-13-dev).")
  endif()
endfunction()
