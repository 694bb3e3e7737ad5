# Finds what the Python package needs: an interpreter with headers, and pybind11. The
# interpreter is Python_EXECUTABLE when given (the Makefile passes the project venv's,
# scikit-build-core its build environment's), else the project venv .venv when it exists,
# else CMake's search. pybind11 is the one installed in that interpreter (PyPI), found through
# `python -m pybind11 --cmakedir`. Sets FAVOR_PYTHON_FOUND; says why when not.
if(NOT DEFINED Python_EXECUTABLE AND EXISTS "${PROJECT_SOURCE_DIR}/.venv/bin/python")
  set(Python_EXECUTABLE "${PROJECT_SOURCE_DIR}/.venv/bin/python" CACHE FILEPATH
      "Python for the favor package")
endif()
set(FAVOR_PYTHON_FOUND FALSE)
find_package(Python 3.9 COMPONENTS Interpreter Development.Module)
if(NOT Python_FOUND)
  message(STATUS "favor Python package: off (no Python interpreter with headers; install python3-dev)")
  return()
endif()
execute_process(COMMAND ${Python_EXECUTABLE} -m pybind11 --cmakedir
                OUTPUT_VARIABLE favor_pybind11_dir OUTPUT_STRIP_TRAILING_WHITESPACE
                RESULT_VARIABLE favor_pybind11_missing ERROR_QUIET)
set(PYBIND11_FINDPYTHON ON)
if(NOT favor_pybind11_missing)
  find_package(pybind11 2.10 CONFIG QUIET HINTS "${favor_pybind11_dir}")
else()
  find_package(pybind11 2.10 CONFIG QUIET)
endif()
if(NOT pybind11_FOUND)
  message(STATUS "favor Python package: off (no pybind11 in ${Python_EXECUTABLE}; "
                 "scripts/setup-venv.sh makes .venv with it)")
  return()
endif()
set(FAVOR_PYTHON_FOUND TRUE)
message(STATUS "favor Python package: on (${Python_EXECUTABLE}, pybind11 ${pybind11_VERSION})")
