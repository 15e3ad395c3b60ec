# cmake/mpi.cmake — the data-parallel tests that run under mpirun (tests/mpi/), registered with
# ctest when an mpirun is found (Open MPI: apt-get install openmpi-bin libopenmpi-dev); without
# one they are not registered and configuring says so. lumen itself never links MPI: it dlopens
# libmpi at run time (train/dist.c), so dist_check links only lumen. Included from the test section
# of CMakeLists.txt, after the tests/test_*.c suites.
find_program(LUMEN_MPIRUN NAMES mpirun mpiexec DOC "mpirun for the data-parallel tests (tests/mpi/)")
if(NOT LUMEN_MPIRUN)
  message(STATUS "  mpi tests         not registered (no mpirun; install openmpi-bin to run tests/mpi/)")
  return()
endif()

add_executable(dist_check "${CMAKE_SOURCE_DIR}/tests/mpi/dist_check.c")
target_link_libraries(dist_check PRIVATE lumen lumen_features)
set_target_properties(dist_check PROPERTIES RUNTIME_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/tests")

# root (CI's containers) may run mpirun only when asked; two ranks on a machine of fewer cores
set(_lumen_mpirun "${LUMEN_MPIRUN}" --oversubscribe --allow-run-as-root)
set(_lumen_mpi_timeout 300)
set(_lumen_mpi_slow_timeout 900)
if(LUMEN_SANITIZE)
  math(EXPR _lumen_mpi_timeout "${_lumen_mpi_timeout} * 6")
  math(EXPR _lumen_mpi_slow_timeout "${_lumen_mpi_slow_timeout} * 4")
endif()

add_test(NAME mpi_dist_check COMMAND ${_lumen_mpirun} -np 2 $<TARGET_FILE:dist_check>
         WORKING_DIRECTORY "${CMAKE_BINARY_DIR}")
add_test(NAME mpi_repro COMMAND bash "${CMAKE_SOURCE_DIR}/tests/mpi/repro.sh" $<TARGET_FILE:rltrain> ${_lumen_mpirun}
         WORKING_DIRECTORY "${CMAKE_BINARY_DIR}")
add_test(NAME mpi_kill COMMAND bash "${CMAKE_SOURCE_DIR}/tests/mpi/kill.sh" $<TARGET_FILE:rltrain> ${_lumen_mpirun}
         WORKING_DIRECTORY "${CMAKE_BINARY_DIR}")
add_test(NAME mpi_solve_slow COMMAND bash "${CMAKE_SOURCE_DIR}/tests/mpi/solve.sh" $<TARGET_FILE:rltrain> ${_lumen_mpirun}
         WORKING_DIRECTORY "${CMAKE_BINARY_DIR}")
# each exits non-zero, after a FAIL line saying what, when a check fails
set_tests_properties(mpi_dist_check mpi_repro mpi_kill PROPERTIES LABELS "unit;mpi" TIMEOUT ${_lumen_mpi_timeout})
set_tests_properties(mpi_solve_slow PROPERTIES LABELS "slow;mpi" TIMEOUT ${_lumen_mpi_slow_timeout})
# ranks share the machine's cores: one mpirun test at a time
set_tests_properties(mpi_dist_check mpi_repro mpi_kill mpi_solve_slow PROPERTIES RESOURCE_LOCK lumen_mpi)
if(LUMEN_SANITIZE)
  # Open MPI keeps its allocations for the life of the process: tools/lsan.supp names its
  # libraries; lumen's own code is never suppressed. Open MPI is built without frame pointers:
  # the slow unwinder finds the frames the suppressions name.
  set_tests_properties(mpi_dist_check mpi_repro mpi_kill mpi_solve_slow PROPERTIES
    ENVIRONMENT "LSAN_OPTIONS=suppressions=${CMAKE_SOURCE_DIR}/tools/lsan.supp:print_suppressions=0:fast_unwind_on_malloc=0"
    FAIL_REGULAR_EXPRESSION "ERROR: (Address|Leak)Sanitizer|runtime error:")
endif()
message(STATUS "  mpi tests         4 under ${LUMEN_MPIRUN} (tests/mpi/)")
