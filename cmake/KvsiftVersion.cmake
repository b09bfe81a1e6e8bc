# kvsift_read_version(<header> <out_var>): the MAJOR.MINOR.PATCH of kvsift/version.hpp, the one place
# the version is written. The top-level CMakeLists.txt (before project()) and python/CMakeLists.txt
# both read it through here, so the C++ package and the wheel cannot disagree.
function(kvsift_read_version header out_var)
  file(STRINGS "${header}" _lines REGEX "^#define KVSIFT_VERSION_(MAJOR|MINOR|PATCH) +[0-9]+ *$")
  foreach(_part MAJOR MINOR PATCH)
    set(_v_${_part} "")
    foreach(_line IN LISTS _lines)
      if(_line MATCHES "^#define KVSIFT_VERSION_${_part} +([0-9]+)")
        set(_v_${_part} "${CMAKE_MATCH_1}")
      endif()
    endforeach()
    if(_v_${_part} STREQUAL "")
      message(FATAL_ERROR "kvsift: no `#define KVSIFT_VERSION_${_part} <number>` line in ${header}")
    endif()
  endforeach()
  set(${out_var} "${_v_MAJOR}.${_v_MINOR}.${_v_PATCH}" PARENT_SCOPE)
endfunction()
