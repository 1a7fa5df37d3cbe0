# DILOCOX_WITH_CUDA: finds nvcc (on PATH, CUDACXX, or /usr/local/cuda) and enables the
# CUDA language for our own CUDA targets, built for CMAKE_CUDA_ARCHITECTURES (default
# 90, Hopper). Sets DILOCOX_CUDA. Without a GPU the targets still compile: that is the
# check that host/device code stays valid for nvcc.
if(DILOCOX_WITH_CUDA STREQUAL "OFF" OR NOT DILOCOX_WITH_CUDA)
  set(DILOCOX_CUDA OFF)
else()
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    enable_language(CUDA)
    set(DILOCOX_CUDA ON)
  elseif(DILOCOX_WITH_CUDA STREQUAL "AUTO")
    set(DILOCOX_CUDA OFF)
  else()
    message(FATAL_ERROR "DILOCOX_WITH_CUDA=ON but no CUDA compiler (nvcc) was found")
  endif()
endif()
if(DILOCOX_PROGRAMS OR DILOCOX_CUDA)
  message(STATUS "dilocox: CUDA targets ${DILOCOX_CUDA}")
endif()

# dilocox_cuda_flags: how our own CUDA sources compile (C++20 asked of nvcc directly:
# CMake 3.25 has no cuda_std_20 feature for CUDA 13; nvcc warnings are errors).
if(DILOCOX_CUDA AND NOT TARGET dilocox_cuda_flags)
  find_package(CUDAToolkit REQUIRED)
  add_library(dilocox_cuda_flags INTERFACE)
  target_compile_options(dilocox_cuda_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20 -Werror=all-warnings --expt-relaxed-constexpr>)
endif()

# dilocox_nccl: NCCL from the toolkit's folders (or NCCL_ROOT), for NcclCommunicator.
if(DILOCOX_CUDA AND NOT TARGET dilocox_nccl)
  find_library(DILOCOX_NCCL_LIBRARY nccl HINTS $ENV{NCCL_ROOT}/lib ${CUDAToolkit_LIBRARY_DIR})
  find_path(DILOCOX_NCCL_INCLUDE nccl.h HINTS $ENV{NCCL_ROOT}/include ${CUDAToolkit_INCLUDE_DIRS})
  if(DILOCOX_NCCL_LIBRARY AND DILOCOX_NCCL_INCLUDE)
    add_library(dilocox_nccl INTERFACE)
    target_link_libraries(dilocox_nccl INTERFACE ${DILOCOX_NCCL_LIBRARY})
    target_include_directories(dilocox_nccl INTERFACE ${DILOCOX_NCCL_INCLUDE})
  endif()
  message(STATUS "dilocox: NCCL ${DILOCOX_NCCL_LIBRARY}")
endif()
