# cmake -P script: build and run tests/consumer/project against kvsift, via FetchContent from the
# local tree, or via find_package after `cmake --install` into a temporary prefix.
cmake_minimum_required(VERSION 3.25)

function(run_step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer test step failed (${rc}): ${ARGN}")
  endif()
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
set(project_args -DKVSIFT_CONSUMER_MODE=${MODE} -DCONSUMER_ENABLE_CUDA=${ENABLE_CUDA}
    -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES} -DCMAKE_BUILD_TYPE=Release)

if(MODE STREQUAL "find_package")
  # Install kvsift alone (headers + package config) into a throwaway prefix.
  run_step(${CMAKE_COMMAND} -S ${KVSIFT_SOURCE_DIR} -B ${WORK_DIR}/kvsift-build -G ${GENERATOR}
           -DKVSIFT_BUILD_TESTS=OFF -DKVSIFT_BUILD_BENCHMARKS=OFF -DKVSIFT_BUILD_EXAMPLES=OFF)
  run_step(${CMAKE_COMMAND} --install ${WORK_DIR}/kvsift-build --prefix ${WORK_DIR}/prefix)
  list(APPEND project_args -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
else()
  list(APPEND project_args -DFETCHCONTENT_SOURCE_DIR_KVSIFT=${KVSIFT_SOURCE_DIR})
endif()

run_step(${CMAKE_COMMAND} -S ${CMAKE_CURRENT_LIST_DIR}/project -B ${WORK_DIR}/consumer-build -G ${GENERATOR} ${project_args})
run_step(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer-build --parallel 2)
run_step(${WORK_DIR}/consumer-build/consumer_host)
if(ENABLE_CUDA)
  # The .cu program runs its kernel when a GPU is present and says so when not; it must build either way.
  run_step(${WORK_DIR}/consumer-build/consumer_cuda)
endif()
