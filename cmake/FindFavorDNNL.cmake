# Finds oneDNN (Debian: libdnnl-dev), optional: its dnnl_gemm_bf16bf16f32 runs the bf16
# forward GEMMs (src/cpu/bf16_gemm.cpp) on CPUs with AVX512-BF16. Defines the imported
# target favor::dnnl when found.
include(FindPackageHandleStandardArgs)
find_library(FavorDNNL_LIBRARY NAMES dnnl)
find_path(FavorDNNL_INCLUDE_DIR NAMES oneapi/dnnl/dnnl.h)
find_package_handle_standard_args(FavorDNNL REQUIRED_VARS FavorDNNL_LIBRARY FavorDNNL_INCLUDE_DIR)
if(FavorDNNL_FOUND AND NOT TARGET favor::dnnl)
  add_library(favor::dnnl UNKNOWN IMPORTED)
  set_target_properties(favor::dnnl PROPERTIES
    IMPORTED_LOCATION "${FavorDNNL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${FavorDNNL_INCLUDE_DIR}")
endif()
