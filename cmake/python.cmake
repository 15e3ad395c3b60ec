# cmake/python.cmake — the Python package's tests (tests/python/test_*.py) as ctest tests.
#
# Included from CMakeLists.txt's test section: a fixture test, python_venv, makes a virtual
# environment under the build dir (BUILD/python-venv: python3 -m venv, then pip install of
# gymnasium, numpy, pytest, setuptools and wheel from PyPI, once; then the package from a copy of
# python/ in BUILD/python-src, every run, so the source tree gets no build output), and every test
# file is one ctest test, python_<name>, that runs pytest on it in that venv against this build's
# liblumen.so ($LUMEN_LIBRARY). Files with _slow in the name are labelled slow, the others unit;
# all carry the label python. Needs python3 with venv and ensurepip (tools/dev.sh installs
# python3-venv); without it, or in a sanitizer build (liblumen.so needs the sanitizer runtime
# preloaded into python), no Python test is registered and configure says why.
#
# The same file run as a script (cmake -P, the fixture's command) does the set-up.

if(CMAKE_SCRIPT_MODE_FILE)
  # ---- script mode: -DPYTHON=python3 -DVENV=dir -DSRC=python/ -DCOPY=dir
  set(_py "${VENV}/bin/python")
  if(NOT EXISTS "${_py}")
    execute_process(COMMAND "${PYTHON}" -m venv "${VENV}" RESULT_VARIABLE _rc)
    if(NOT _rc EQUAL 0)
      message(FATAL_ERROR "python3 -m venv ${VENV} failed (${_rc}): install python3-venv (bash tools/dev.sh setup)")
    endif()
  endif()
  set(_deps "gymnasium>=1.0" numpy pytest "setuptools>=61" wheel)
  string(REPLACE ";" " " _deps_text "${_deps}")
  set(_stamp "")
  if(EXISTS "${VENV}/.lumen-deps")
    file(READ "${VENV}/.lumen-deps" _stamp)
  endif()
  if(NOT _stamp STREQUAL "${_deps_text}\n")
    execute_process(COMMAND "${_py}" -m pip install --disable-pip-version-check -q --upgrade ${_deps}
                    RESULT_VARIABLE _rc)
    if(NOT _rc EQUAL 0)
      message(FATAL_ERROR "pip install ${_deps_text} into ${VENV} failed (${_rc}): is PyPI reachable?")
    endif()
    file(WRITE "${VENV}/.lumen-deps" "${_deps_text}\n")
  endif()
  file(REMOVE_RECURSE "${COPY}")
  file(COPY "${SRC}/" DESTINATION "${COPY}" PATTERN "__pycache__" EXCLUDE PATTERN "*.egg-info" EXCLUDE
       PATTERN "build" EXCLUDE)
  execute_process(COMMAND "${_py}" -m pip install --disable-pip-version-check -q --no-deps --no-build-isolation
                          --force-reinstall "${COPY}" RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "pip install of the lumen package (${COPY}) failed (${_rc})")
  endif()
  return()
endif()

# ---- configure mode
if(NOT LUMEN_BUILD_TESTS)
  return()
endif()
file(GLOB LUMEN_PY_TESTS CONFIGURE_DEPENDS "${CMAKE_SOURCE_DIR}/tests/python/test_*.py")
list(SORT LUMEN_PY_TESTS)
if(NOT LUMEN_PY_TESTS)
  return()
endif()
if(LUMEN_SANITIZE)
  message(STATUS "  python tests      OFF (a sanitizer build: liblumen.so needs the sanitizer runtime in python)")
  return()
endif()
find_program(LUMEN_PYTHON3 NAMES python3 python)
set(_lumen_py_ok OFF)
if(LUMEN_PYTHON3)
  execute_process(COMMAND "${LUMEN_PYTHON3}" -c "import sys, venv, ensurepip; assert sys.version_info >= (3, 9)"
                  RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_QUIET)
  if(_rc EQUAL 0)
    set(_lumen_py_ok ON)
  endif()
endif()
if(NOT _lumen_py_ok)
  message(STATUS "  python tests      OFF (no python3 >= 3.9 with venv and ensurepip: apt-get install python3-venv)")
  return()
endif()

set(_venv "${CMAKE_BINARY_DIR}/python-venv")
add_test(NAME python_venv
         COMMAND "${CMAKE_COMMAND}" -DPYTHON=${LUMEN_PYTHON3} -DVENV=${_venv} -DSRC=${CMAKE_SOURCE_DIR}/python
                 -DCOPY=${CMAKE_BINARY_DIR}/python-src -P "${CMAKE_CURRENT_LIST_FILE}")
set_tests_properties(python_venv PROPERTIES FIXTURES_SETUP lumen_python LABELS "unit;python" TIMEOUT 900)

foreach(_src IN LISTS LUMEN_PY_TESTS)
  get_filename_component(_stem "${_src}" NAME_WE)
  string(REGEX REPLACE "^test_" "" _stem "${_stem}")
  set(_name "python_${_stem}")
  set(_labels "unit;python")
  set(_timeout 300)
  if(_stem MATCHES "_slow")
    set(_labels "slow;python")
    set(_timeout 600)
  endif()
  add_test(NAME ${_name}
           COMMAND "${_venv}/bin/python" -m pytest -q -p no:cacheprovider --rootdir "${CMAKE_SOURCE_DIR}/tests/python"
                   "${_src}"
           WORKING_DIRECTORY "${CMAKE_BINARY_DIR}")
  set_tests_properties(${_name} PROPERTIES FIXTURES_REQUIRED lumen_python LABELS "${_labels}" TIMEOUT ${_timeout}
    ENVIRONMENT "LUMEN_LIBRARY=$<TARGET_FILE:lumen_shared>;LUMEN_SOURCE_DIR=${CMAKE_SOURCE_DIR};PYTHONDONTWRITEBYTECODE=1")
endforeach()
list(LENGTH LUMEN_PY_TESTS _n_py)
message(STATUS "  python tests      ${_n_py} (pytest in ${_venv}, made by the python_venv test)")
