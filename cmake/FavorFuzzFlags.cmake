# FAVOR_BUILD_FUZZERS=ON: libFuzzer needs clang. Every target (libfavor, favor_cli, the
# fuzzers) is compiled with the sanitizers and libFuzzer's coverage hooks; only the fuzzer
# executables link libFuzzer itself (fuzz/CMakeLists.txt adds -fsanitize=fuzzer there).
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "FAVOR_BUILD_FUZZERS=ON needs clang (libFuzzer), the compiler is "
                      "${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER}: configure a separate build "
                      "directory with -DCMAKE_CXX_COMPILER=clang++ (or run `make fuzz`)")
endif()
if(NOT FAVOR_BUILD_TOOLS)
  message(FATAL_ERROR "FAVOR_BUILD_FUZZERS=ON needs FAVOR_BUILD_TOOLS=ON (the .npy, .npz and "
                      "CLI fuzzers use favor_cli)")
endif()
set(FAVOR_SANITIZE_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=undefined)
add_compile_options(-fsanitize=fuzzer-no-link ${FAVOR_SANITIZE_FLAGS} -g -O1
                    -fno-omit-frame-pointer)
add_link_options(${FAVOR_SANITIZE_FLAGS})
