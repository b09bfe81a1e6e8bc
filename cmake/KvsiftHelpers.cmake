# Helpers shared by kvsift's own tests, benchmarks and examples (not installed).

# find_package(<name> CONFIG) from the system; on failure say which Debian package provides it.
# Nothing is ever downloaded at configure time.
function(kvsift_require_package name debian_package)
  find_package(${name} CONFIG QUIET)
  if(NOT ${name}_FOUND)
    message(FATAL_ERROR
      "kvsift: ${name} was not found. Install it from the system packages (Debian/Ubuntu: "
      "`apt-get install ${debian_package}`), point CMAKE_PREFIX_PATH at an existing install, "
      "or turn this part off (KVSIFT_BUILD_TESTS=OFF / KVSIFT_BUILD_BENCHMARKS=OFF).")
  endif()
endfunction()

# Warnings for kvsift's own targets; the public headers must stay clean under them.
function(kvsift_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra --Werror=all-warnings>)
endfunction()
