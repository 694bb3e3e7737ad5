# Unity (jumbo) builds of the targets whose files share heavy headers: the CLI's (CLI11 2.1,
# whose header-defined validators every including file compiles again, and nlohmann/json),
# the tests' (GoogleTest, the CLI's headers) and the extension's (pybind11). Compiling a batch
# of files as one source instead of one by one cuts those targets' compile time about 3x
# (g++ -O3 and clang -O1 alike): the headers' inline code is generated once per batch.
# libfavor is compiled file by file (its files reuse names in anonymous namespaces), and so
# is any file with its own compile definitions or options (CMake leaves those out of batches).
# FAVOR_UNITY_BUILD=OFF compiles every file on its own (quicker rebuilds after editing one).
option(FAVOR_UNITY_BUILD "Compile the CLI, the tests and the Python extension in unity batches" ON)

# favor_unity_build(<target> <files per batch>)
function(favor_unity_build target batch)
  if(FAVOR_UNITY_BUILD)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE ${batch})
  endif()
endfunction()
