# Compiler cache: every C++ compile goes through ccache when it is installed (Debian package
# ccache, scripts/install-deps.sh). What it buys is inside one `make test`: the CTest
# python_pip_install builds libfavor, favor_io, the CLI and the extension again, from a copy
# of the tree through pip, and those compiles are the main build's (same compiler, flags and
# paths relative to the tree; src/, tools/, python/CMakeLists.txt and pyproject.toml keep them
# so), so all but plot_runner.cpp's (it names the tree's paths) and tools/no_distributed.cpp's
# (only a build without MPI compiles it) come from this cache.
#   FAVOR_CCACHE=OFF   compile without it
#   FAVOR_CCACHE_DIR   the cache: $CCACHE_DIR when set at configure time, else <build>/ccache
#                      (python_pip_install hands the main build's to pip's build that way)
# CCACHE_BASEDIR=<source dir>: ccache rewrites absolute paths under the tree relative to the
# compiler's working directory, so two copies of the tree laid out alike (the main build in
# <tree>/build, pip's in <copy>/build-pip-<tag>) hash alike.
option(FAVOR_CCACHE "Compile through ccache when it is installed" ON)
if(FAVOR_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  find_program(FAVOR_CCACHE_PROGRAM ccache)
  if(FAVOR_CCACHE_PROGRAM)
    if(NOT "$ENV{CCACHE_DIR}" STREQUAL "")
      set(favor_ccache_dir "$ENV{CCACHE_DIR}")
    else()
      set(favor_ccache_dir "${PROJECT_BINARY_DIR}/ccache")
    endif()
    set(FAVOR_CCACHE_DIR "${favor_ccache_dir}" CACHE PATH "ccache's cache directory")
    set(CMAKE_CXX_COMPILER_LAUNCHER ${CMAKE_COMMAND} -E env CCACHE_DIR=${FAVOR_CCACHE_DIR}
        CCACHE_BASEDIR=${PROJECT_SOURCE_DIR} ${FAVOR_CCACHE_PROGRAM})
    message(STATUS "favor: compiling through ccache (${FAVOR_CCACHE_DIR})")
  endif()
endif()
