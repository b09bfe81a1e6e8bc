# cmake -P script: build and run tests/consumer/project against kvsift, the way an engine does.
#
# The project's kvsift lines are the README's own snippets (between `<!-- kvsift-snippet:NAME begin`
# and `<!-- kvsift-snippet:NAME end -->`), extracted here into ${WORK_DIR}/snippets, so the README
# cannot drift from what is tested. The only edits: in the FetchContent snippet, the line marked
# "CHANGE THIS LINE" gets this checkout's repository URL, and GIT_TAG gets the commit to fetch.
#
# MODE=fetchcontent fetches kvsift in one of two ways, printed as "fetch mode: ...":
#   git     a real `git clone` of file://<this checkout> at its HEAD commit (GIT_TAG = that commit).
#           Used when the working tree is clean (a CI clone), so the test proves the snippet fetches.
#   source  FETCHCONTENT_SOURCE_DIR_KVSIFT=<this checkout>: the snippet is still what is configured, but
#           FetchContent takes the tree as it is. Used when the working tree has uncommitted or
#           untracked changes (a git fetch would test HEAD without them) or is not a git checkout.
#   The environment variable KVSIFT_CONSUMER_FETCH=git|source|auto (default auto) forces one: `git` in a
#   dirty tree tests HEAD only, and says so.
# MODE=find_package installs kvsift alone into a throwaway prefix and finds it with find_package.
#
# Inputs (-D): MODE, KVSIFT_SOURCE_DIR, WORK_DIR, ENABLE_CUDA, CUDA_ARCHITECTURES, GENERATOR.
cmake_minimum_required(VERSION 3.25)

function(run_step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer test step failed (${rc}): ${ARGN}")
  endif()
endfunction()

# extract_snippet(<name> <out_var>): the fenced code block between the README markers of <name>.
function(extract_snippet name out_var)
  file(READ "${KVSIFT_SOURCE_DIR}/README.md" readme)
  string(FIND "${readme}" "<!-- kvsift-snippet:${name} begin" begin)
  string(FIND "${readme}" "<!-- kvsift-snippet:${name} end -->" end)
  if(begin EQUAL -1 OR end EQUAL -1 OR end LESS begin)
    message(FATAL_ERROR "README.md has no `<!-- kvsift-snippet:${name} begin` ... `<!-- kvsift-snippet:${name} end -->` block")
  endif()
  math(EXPR length "${end} - ${begin}")
  string(SUBSTRING "${readme}" ${begin} ${length} block)
  # Keep what lies between the ```cmake fence and the closing ``` fence.
  if(NOT block MATCHES "\n```cmake\n(.*)\n```")
    message(FATAL_ERROR "the README's kvsift-snippet:${name} block holds no ```cmake fenced code")
  endif()
  set(${out_var} "${CMAKE_MATCH_1}\n" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
set(snippet_dir ${WORK_DIR}/snippets)
set(project_args -DKVSIFT_CONSUMER_MODE=${MODE} -DCONSUMER_ENABLE_CUDA=${ENABLE_CUDA}
    -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES} -DCMAKE_BUILD_TYPE=Release
    -DKVSIFT_SNIPPET_DIR=${snippet_dir})

foreach(name host-target cuda-target)
  extract_snippet(${name} text)
  file(WRITE ${snippet_dir}/${name}.cmake "${text}")
endforeach()

if(MODE STREQUAL "find_package")
  # Install kvsift alone (headers + package config) into a throwaway prefix.
  run_step(${CMAKE_COMMAND} -S ${KVSIFT_SOURCE_DIR} -B ${WORK_DIR}/kvsift-build -G ${GENERATOR}
           -DKVSIFT_BUILD_TESTS=OFF -DKVSIFT_BUILD_BENCHMARKS=OFF -DKVSIFT_BUILD_EXAMPLES=OFF)
  run_step(${CMAKE_COMMAND} --install ${WORK_DIR}/kvsift-build --prefix ${WORK_DIR}/prefix)
  list(APPEND project_args -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
else()
  # ---- which fetch: a git clone of HEAD, or the working tree as it is ----
  set(fetch "$ENV{KVSIFT_CONSUMER_FETCH}")
  if(fetch STREQUAL "")
    set(fetch auto)
  endif()
  if(NOT fetch MATCHES "^(auto|git|source)$")
    message(FATAL_ERROR "KVSIFT_CONSUMER_FETCH must be auto, git or source, not '${fetch}'")
  endif()
  find_package(Git QUIET)
  set(is_checkout FALSE)
  set(dirty "")
  if(GIT_EXECUTABLE)
    execute_process(COMMAND ${GIT_EXECUTABLE} -C ${KVSIFT_SOURCE_DIR} rev-parse --show-toplevel
                    OUTPUT_VARIABLE toplevel OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc ERROR_QUIET)
    if(rc EQUAL 0)
      file(REAL_PATH "${toplevel}" toplevel)
      file(REAL_PATH "${KVSIFT_SOURCE_DIR}" source_real)
      if(toplevel STREQUAL source_real)
        set(is_checkout TRUE)
        execute_process(COMMAND ${GIT_EXECUTABLE} -C ${KVSIFT_SOURCE_DIR} rev-parse HEAD
                        OUTPUT_VARIABLE head OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)
        execute_process(COMMAND ${GIT_EXECUTABLE} -C ${KVSIFT_SOURCE_DIR} status --porcelain
                        OUTPUT_VARIABLE dirty OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)
      endif()
    endif()
  endif()
  if(fetch STREQUAL "auto")
    if(is_checkout AND dirty STREQUAL "")
      set(fetch git)
    else()
      set(fetch source)
    endif()
  endif()
  if(fetch STREQUAL "git" AND NOT is_checkout)
    message(FATAL_ERROR "KVSIFT_CONSUMER_FETCH=git, but ${KVSIFT_SOURCE_DIR} is not the top of a git checkout (or git is missing)")
  endif()

  # ---- the README's FetchContent snippet, with its marked URL line and GIT_TAG filled in ----
  extract_snippet(fetchcontent text)
  string(REGEX MATCHALL "GIT_REPOSITORY[^\n]*CHANGE THIS LINE" marked "${text}")
  string(REGEX MATCHALL "GIT_REPOSITORY" any_url "${text}")
  list(LENGTH marked n_marked)
  list(LENGTH any_url n_url)
  if(NOT n_marked EQUAL 1 OR NOT n_url EQUAL 1)
    message(FATAL_ERROR "the README's FetchContent snippet must have exactly one GIT_REPOSITORY line, marked `# CHANGE THIS LINE`")
  endif()
  if(NOT text MATCHES "GIT_TAG +main[ )]")
    message(FATAL_ERROR "the README's FetchContent snippet must pin `GIT_TAG main` (there are no release tags)")
  endif()
  if(is_checkout)
    set(url "file://${source_real}")
    set(tag "${head}")
  else()
    # Not a checkout: nothing to clone; FETCHCONTENT_SOURCE_DIR below provides the tree.
    set(url "file://${KVSIFT_SOURCE_DIR}")
    set(tag main)
  endif()
  string(REGEX REPLACE "GIT_REPOSITORY +[^ \n]+" "GIT_REPOSITORY ${url}" text "${text}")
  string(REGEX REPLACE "GIT_TAG +main" "GIT_TAG        ${tag}" text "${text}")
  file(WRITE ${snippet_dir}/fetchcontent.cmake "${text}")

  if(fetch STREQUAL "git")
    if(NOT dirty STREQUAL "")
      message(WARNING "consumer.fetchcontent: KVSIFT_CONSUMER_FETCH=git in a dirty working tree: the clone "
                      "tests commit ${head}, without the uncommitted changes")
    endif()
    message(STATUS "consumer.fetchcontent: fetch mode: git (git clone ${url} at ${head})")
  else()
    list(APPEND project_args -DFETCHCONTENT_SOURCE_DIR_KVSIFT=${KVSIFT_SOURCE_DIR})
    if(NOT is_checkout)
      set(why "not a git checkout")
    elseif(NOT dirty STREQUAL "")
      string(REGEX MATCHALL "\n" lines "\n${dirty}")
      list(LENGTH lines n_dirty)
      set(why "the working tree has ${n_dirty} uncommitted or untracked path(s), which a git fetch would miss; commit them to test the git fetch")
    else()
      set(why "KVSIFT_CONSUMER_FETCH=source")
    endif()
    message(STATUS "consumer.fetchcontent: fetch mode: source (FETCHCONTENT_SOURCE_DIR_KVSIFT=${KVSIFT_SOURCE_DIR}): ${why}")
  endif()
  message(STATUS "consumer.fetchcontent: the README snippet as configured:\n${text}")
endif()

run_step(${CMAKE_COMMAND} -S ${CMAKE_CURRENT_LIST_DIR}/project -B ${WORK_DIR}/consumer-build -G ${GENERATOR} ${project_args})
run_step(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer-build --parallel 2)
run_step(${WORK_DIR}/consumer-build/engine_cpu)
if(ENABLE_CUDA)
  # The .cu program runs its kernel when a GPU is present and says so when not; it must build either way.
  run_step(${WORK_DIR}/consumer-build/engine)
endif()
