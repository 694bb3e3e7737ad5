# Finds a CBLAS. Prefers Debian's OpenMP build of OpenBLAS: inside favor's OpenMP
# parallel regions it runs single-threaded by itself (no oversubscription), and
# outside them it uses the same OpenMP thread pool.
# Defines the imported target favor::blas and FavorBLAS_VARIANT.
include(FindPackageHandleStandardArgs)
set(_favor_blas_arch_dir /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE})
find_library(FavorBLAS_LIBRARY NAMES openblas
  HINTS ${_favor_blas_arch_dir}/openblas-openmp ${_favor_blas_arch_dir}/openblas-pthread
  NO_DEFAULT_PATH)
if(NOT FavorBLAS_LIBRARY)
  find_library(FavorBLAS_LIBRARY NAMES openblas)
endif()
get_filename_component(_favor_blas_dir "${FavorBLAS_LIBRARY}" DIRECTORY)
get_filename_component(_favor_blas_variant "${_favor_blas_dir}" NAME)
find_path(FavorBLAS_INCLUDE_DIR NAMES cblas.h
  HINTS /usr/include/${CMAKE_LIBRARY_ARCHITECTURE}/${_favor_blas_variant}
        /usr/include/${CMAKE_LIBRARY_ARCHITECTURE} /usr/include/openblas
  NO_DEFAULT_PATH)
if(NOT FavorBLAS_INCLUDE_DIR)
  find_path(FavorBLAS_INCLUDE_DIR NAMES cblas.h PATH_SUFFIXES openblas)
endif()
set(FavorBLAS_VARIANT "${_favor_blas_variant}")
find_package_handle_standard_args(FavorBLAS REQUIRED_VARS FavorBLAS_LIBRARY FavorBLAS_INCLUDE_DIR)
if(FavorBLAS_FOUND AND NOT TARGET favor::blas)
  add_library(favor::blas UNKNOWN IMPORTED)
  set_target_properties(favor::blas PROPERTIES
    IMPORTED_LOCATION "${FavorBLAS_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${FavorBLAS_INCLUDE_DIR}")
  set(FavorBLAS_RUNTIME_DIR "${_favor_blas_dir}")
endif()
