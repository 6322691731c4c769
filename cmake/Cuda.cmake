# The CUDA backend is built whenever nvcc is found (STP_CUDA=AUTO) and is never required.
set(STP_CUDA_ENABLED OFF)
if(NOT STP_CUDA STREQUAL "OFF" AND NOT STP_SANITIZE)
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    # NCCL: -DNCCL_ROOT=DIR, or the NCCL_ROOT / NCCL_HOME environment variables, then beside CUDA.
    set(_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT} $ENV{NCCL_HOME})
    find_library(NCCL_LIBRARY nccl HINTS ${_nccl_hints} PATH_SUFFIXES lib lib64 HINTS ${CUDAToolkit_LIBRARY_DIR})
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} PATH_SUFFIXES include HINTS ${CUDAToolkit_INCLUDE_DIRS})
    if(NOT NCCL_LIBRARY OR NOT NCCL_INCLUDE_DIR)
      message(FATAL_ERROR "stp: nvcc found but NCCL is missing (nccl.h / libnccl); install NCCL 2.26 or later "
                          "(libnccl2 libnccl-dev), set NCCL_ROOT or NCCL_HOME to its folder, or pass -DSTP_CUDA=OFF")
    endif()
    # CMake 3.25 predates nvcc's C++20 support: teach it the flag, then ask for C++20 as for CXX.
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA_STANDARD 20)
    string(APPEND CMAKE_CUDA_FLAGS " --expt-relaxed-constexpr --extended-lambda")
    # CI compiles for Ampere and Hopper (80;90, with PTX for newer GPUs); tools/gpu-check builds
    # for the GPU it runs on (-DSTP_CUDA_ARCHITECTURES=native), and tools/setup.sh for the GPUs
    # nvidia-smi shows (it turns the backend off where none is visible, unless STP_CUDA=ON).
    set(STP_CUDA_ARCHITECTURES "80;90" CACHE STRING "GPU architectures of the CUDA backend (CMAKE_CUDA_ARCHITECTURES syntax: 80;90, native, ...)")
    set(CMAKE_CUDA_ARCHITECTURES ${STP_CUDA_ARCHITECTURES})
    set(STP_CUDA_ENABLED ON)
    message(STATUS "stp: CUDA backend ON (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${STP_CUDA_ARCHITECTURES}, NCCL ${NCCL_LIBRARY})")
  elseif(STP_CUDA STREQUAL "ON")
    message(FATAL_ERROR "stp: STP_CUDA=ON but no CUDA compiler (nvcc) was found")
  endif()
endif()
if(NOT STP_CUDA_ENABLED)
  message(STATUS "stp: CUDA backend OFF (no nvcc found, STP_CUDA=OFF, or a sanitizer build); building the CPU backend only")
endif()
