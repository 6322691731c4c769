# Third-party libraries, all from Debian packages (see tools/setup.sh for the package names).
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(TBB REQUIRED)
find_package(GTest REQUIRED)
find_package(CLI11 CONFIG REQUIRED)  # command lines of tools/ (header-only; CLI11::CLI11)
find_package(nlohmann_json 3.10 REQUIRED)  # small JSON documents: safetensors headers, reports, metrics
find_package(simdjson REQUIRED)            # trace.json reading (profile/trace_reader.cpp)
pkg_check_modules(HWLOC REQUIRED IMPORTED_TARGET hwloc)
pkg_check_modules(JEMALLOC REQUIRED IMPORTED_TARGET jemalloc)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)  # the BPE tokenizer's pre-split (data/regex_split.cpp)

# OpenBLAS for CPU GEMM. We want OpenBLAS specifically (for openblas_set_num_threads), not
# whichever libblas the alternatives system points at.
find_library(BLAS_LIBRARIES NAMES openblas REQUIRED
             PATHS /usr/lib/x86_64-linux-gnu/openblas-pthread /usr/lib/x86_64-linux-gnu)
find_path(BLAS_INCLUDE_DIR NAMES cblas.h
          PATHS /usr/include/x86_64-linux-gnu/openblas-pthread /usr/include/openblas /usr/include REQUIRED)
message(STATUS "stp: OpenBLAS ${BLAS_LIBRARIES} (cblas.h in ${BLAS_INCLUDE_DIR})")
