# Finds the BLAS favor links: one per process, for its float and double products.
#
# FAVOR_BLAS picks it:
#   auto              (default) scipy-openblas32 when found, else the system's OpenBLAS
#   scipy-openblas32  PyPI's scipy-openblas32: a current OpenBLAS (DYNAMIC_ARCH, every x86-64
#                     core type up to its release), symbols prefixed scipy_, relocatable. The
#                     project venv has it (requirements.txt); found through FAVOR_BLAS_PYTHON
#                     (default: Python_EXECUTABLE, else .venv/bin/python) or FAVOR_SCIPY_OPENBLAS_DIR
#                     (the package folder, holding include/ and lib/)
#   openblas          the system's OpenBLAS, its OpenMP build first (Debian libopenblas-openmp-dev)
# Why scipy-openblas32 first: Debian 12's OpenBLAS 0.3.21 runs its SSE3 (Prescott) kernels on
# CPUs newer than it knows (Sapphire/Emerald Rapids: 65 against 314 GFLOP/s) and its Zen kernel
# at 60% of a current OpenBLAS on Zen 2 (docs/performance.md, "Which BLAS").
#
# Defines the imported target favor::blas and
#   FavorBLAS_VARIANT      scipy-openblas32 | openblas-openmp | openblas-pthread | ...
#   FavorBLAS_LIBRARY      the library file
#   FavorBLAS_RUNTIME_DIR  its folder (the build tree's RPATH)
# favor::blas carries a generated header, favor_openblas.h: FAVOR_OPENBLAS(name) names an
# OpenBLAS function under either symbol set (FAVOR_OPENBLAS(cblas_sgemm)), and
# FAVOR_OPENBLAS_SCIPY is 1 for scipy-openblas32.
include(FindPackageHandleStandardArgs)
set(FAVOR_BLAS "auto" CACHE STRING "The BLAS: auto | scipy-openblas32 | openblas")
set_property(CACHE FAVOR_BLAS PROPERTY STRINGS auto scipy-openblas32 openblas)
if(NOT FAVOR_BLAS MATCHES "^(auto|scipy-openblas32|openblas)$")
  message(FATAL_ERROR "FAVOR_BLAS='${FAVOR_BLAS}': must be auto, scipy-openblas32 or openblas")
endif()

unset(FavorBLAS_LIBRARY)
unset(FavorBLAS_INCLUDE_DIR)
set(_favor_blas_scipy 0)

if(NOT FAVOR_BLAS STREQUAL "openblas")
  set(_favor_sob_dir "${FAVOR_SCIPY_OPENBLAS_DIR}")
  if(NOT _favor_sob_dir)
    set(_favor_sob_python "${FAVOR_BLAS_PYTHON}")
    if(NOT _favor_sob_python AND Python_EXECUTABLE)
      set(_favor_sob_python "${Python_EXECUTABLE}")
    endif()
    if(NOT _favor_sob_python AND EXISTS "${PROJECT_SOURCE_DIR}/.venv/bin/python")
      set(_favor_sob_python "${PROJECT_SOURCE_DIR}/.venv/bin/python")
    endif()
    if(_favor_sob_python)
      execute_process(
        COMMAND "${_favor_sob_python}" -c
                "import os, scipy_openblas32 as s; print(os.path.dirname(s.get_lib_dir()))"
        OUTPUT_VARIABLE _favor_sob_dir OUTPUT_STRIP_TRAILING_WHITESPACE
        RESULT_VARIABLE _favor_sob_rc ERROR_QUIET)
      if(NOT _favor_sob_rc EQUAL 0)
        set(_favor_sob_dir "")
      endif()
    endif()
  endif()
  if(_favor_sob_dir)
    find_library(_favor_sob_library NAMES scipy_openblas HINTS "${_favor_sob_dir}/lib" NO_DEFAULT_PATH
                 NO_CACHE)
    find_path(_favor_sob_include NAMES cblas.h HINTS "${_favor_sob_dir}/include" NO_DEFAULT_PATH
              NO_CACHE)
    if(_favor_sob_library AND _favor_sob_include)
      set(FavorBLAS_LIBRARY "${_favor_sob_library}")
      set(FavorBLAS_INCLUDE_DIR "${_favor_sob_include}")
      set(FavorBLAS_VARIANT "scipy-openblas32")
      set(_favor_blas_scipy 1)
    endif()
  endif()
  if(NOT FavorBLAS_LIBRARY)
    if(FAVOR_BLAS STREQUAL "scipy-openblas32")
      message(FATAL_ERROR "FAVOR_BLAS=scipy-openblas32: not found (pip install scipy-openblas32 "
                          "into the Python of FAVOR_BLAS_PYTHON or Python_EXECUTABLE, or set "
                          "FAVOR_SCIPY_OPENBLAS_DIR to its package folder)")
    endif()
    message(WARNING "favor: scipy-openblas32 not found, linking the system's OpenBLAS, which "
                    "can be several times slower on CPUs newer than it (docs/performance.md)")
  endif()
endif()

if(NOT FavorBLAS_LIBRARY)
  set(_favor_blas_arch_dir /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE})
  # The OpenMP build first: inside favor's OpenMP parallel regions it runs single-threaded by
  # itself, and outside them it uses the same OpenMP thread pool.
  find_library(_favor_sys_library NAMES openblas
    HINTS ${_favor_blas_arch_dir}/openblas-openmp ${_favor_blas_arch_dir}/openblas-pthread
    NO_DEFAULT_PATH NO_CACHE)
  if(NOT _favor_sys_library)
    find_library(_favor_sys_library NAMES openblas NO_CACHE)
  endif()
  get_filename_component(_favor_blas_dir "${_favor_sys_library}" DIRECTORY)
  get_filename_component(_favor_blas_variant "${_favor_blas_dir}" NAME)
  find_path(_favor_sys_include NAMES cblas.h
    HINTS /usr/include/${CMAKE_LIBRARY_ARCHITECTURE}/${_favor_blas_variant}
          /usr/include/${CMAKE_LIBRARY_ARCHITECTURE} /usr/include/openblas
    NO_DEFAULT_PATH NO_CACHE)
  if(NOT _favor_sys_include)
    find_path(_favor_sys_include NAMES cblas.h PATH_SUFFIXES openblas NO_CACHE)
  endif()
  if(_favor_sys_library AND _favor_sys_include)
    set(FavorBLAS_LIBRARY "${_favor_sys_library}")
    set(FavorBLAS_INCLUDE_DIR "${_favor_sys_include}")
    set(FavorBLAS_VARIANT "${_favor_blas_variant}")
  endif()
endif()

find_package_handle_standard_args(FavorBLAS REQUIRED_VARS FavorBLAS_LIBRARY FavorBLAS_INCLUDE_DIR)
if(FavorBLAS_FOUND AND NOT TARGET favor::blas)
  get_filename_component(FavorBLAS_RUNTIME_DIR "${FavorBLAS_LIBRARY}" DIRECTORY)
  # The names header: one place that knows the two symbol sets. scipy-openblas32's own
  # headers are copied beside it: its package folder is elsewhere in every Python (pip's
  # build of the wheel uses a temporary one), and a path in the build tree keeps the compile
  # commands of the main build and of pip's the same, so that pip's build hits the compiler
  # cache (cmake/FavorCcache.cmake).
  set(_favor_blas_header_dir "${CMAKE_BINARY_DIR}/favor_blas_include")
  if(_favor_blas_scipy)
    file(GLOB _favor_sob_headers "${FavorBLAS_INCLUDE_DIR}/*.h")
    file(COPY ${_favor_sob_headers} DESTINATION "${_favor_blas_header_dir}")
    set(FavorBLAS_INCLUDE_DIR "${_favor_blas_header_dir}")
  endif()
  file(CONFIGURE OUTPUT "${_favor_blas_header_dir}/favor_openblas.h" @ONLY CONTENT [=[
/* Generated by cmake/FindFavorBLAS.cmake: the OpenBLAS favor links (@FavorBLAS_VARIANT@). */
#pragma once
#include <cblas.h>
#define FAVOR_OPENBLAS_SCIPY @_favor_blas_scipy@
#if FAVOR_OPENBLAS_SCIPY
#define FAVOR_OPENBLAS(name) scipy_##name
#else
#define FAVOR_OPENBLAS(name) name
#endif
]=])
  add_library(favor::blas UNKNOWN IMPORTED)
  set_target_properties(favor::blas PROPERTIES
    IMPORTED_LOCATION "${FavorBLAS_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${_favor_blas_header_dir};${FavorBLAS_INCLUDE_DIR}")
  message(STATUS "favor: BLAS ${FavorBLAS_VARIANT} (${FavorBLAS_LIBRARY})")
endif()
