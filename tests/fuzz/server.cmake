# libFuzzer target for the server's request parser (WREN_FUZZ=ON, clang):
#   cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DWREN_FUZZ=ON -DWREN_CUDA=OFF
#   cmake --build build-fuzz --target fuzz_server_request
#   build-fuzz/tests/fuzz_server_request -dict=tests/fuzz/server_request.dict \
#     -max_total_time=300 CORPUS_COPY tests/fuzz/corpus/server_request
# The parser and the helpers it uses are compiled into the target with coverage; the rest of
# wrencore is not needed.
add_executable(fuzz_server_request
  ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_server_request.c
  ${CMAKE_SOURCE_DIR}/src/server/request.c
  ${CMAKE_SOURCE_DIR}/src/util/util.c
  ${CMAKE_SOURCE_DIR}/src/util/err.c)
target_include_directories(fuzz_server_request PRIVATE ${CMAKE_SOURCE_DIR}/src)
target_compile_options(fuzz_server_request PRIVATE -g -fsanitize=fuzzer,address,undefined)
target_link_options(fuzz_server_request PRIVATE -fsanitize=fuzzer,address,undefined)
target_link_libraries(fuzz_server_request PRIVATE PkgConfig::DEPS m)
