# Chooses the BLAS behind kernels/gemm (see docs/benchmarks.md for the measurement that picked
# the default). Provides the interface target `meshtrain_blas` and the definition
# MESHTRAIN_BLAS_<NAME> so kernels/gemm.cpp knows which library it calls, and the interface
# target `meshtrain_dnnl` (oneDNN, always: the convolutions use it).
# Default: oneDNN. On the Sapphire-Rapids-class machines here it ran the GPT products at
# 2.5-8x the rate of Debian's OpenBLAS 0.3.21 and BLIS 0.9, whose run-time CPU detection does
# not recognise this CPU and falls back to old kernels (OpenBLAS reports "Prescott", i.e.
# SSE3; OPENBLAS_CORETYPE=SkylakeX or BLIS_ARCH_TYPE=skx bring them back to oneDNN's level,
# but we do not want speed to hang on an environment variable). oneDNN picks its ISA from
# CPUID and is also the library with AMX bf16 kernels for the planned bf16 path.
set(MESHTRAIN_BLAS "dnnl" CACHE STRING "BLAS library behind GEMM: dnnl, openblas or blis")
set_property(CACHE MESHTRAIN_BLAS PROPERTY STRINGS dnnl openblas blis)
add_library(meshtrain_blas INTERFACE)

# oneDNN is needed whatever library runs GEMM: its convolution primitives run kernels/conv.cpp.
# Debian's dnnl-config.cmake calls find_package(OpenCL REQUIRED) itself, which fails with a
# page of CMake text when the loader and headers are absent: look for them first.
meshtrain_require(OpenCL "ocl-icd-opencl-dev opencl-c-headers (oneDNN's CMake package needs them)")
meshtrain_require(dnnl "libdnnl-dev")
add_library(meshtrain_dnnl INTERFACE)
target_link_libraries(meshtrain_dnnl INTERFACE DNNL::dnnl)

if(MESHTRAIN_BLAS STREQUAL "openblas")
  # The OpenMP build of OpenBLAS respects each calling thread's omp_set_num_threads, which is
  # what lets several ranks in one process each keep their own thread budget.
  find_library(MESHTRAIN_OPENBLAS_LIB NAMES openblas
               PATHS /usr/lib/x86_64-linux-gnu/openblas-openmp /usr/lib/x86_64-linux-gnu
               NO_DEFAULT_PATH)
  find_path(MESHTRAIN_CBLAS_INCLUDE cblas.h PATHS /usr/include/x86_64-linux-gnu/openblas-openmp
            /usr/include/x86_64-linux-gnu/openblas-pthread /usr/include/openblas /usr/include)
  if(NOT MESHTRAIN_OPENBLAS_LIB OR NOT MESHTRAIN_CBLAS_INCLUDE)
    message(FATAL_ERROR "OpenBLAS not found: run scripts/setup.sh (installs libopenblas-openmp-dev)")
  endif()
  target_link_libraries(meshtrain_blas INTERFACE ${MESHTRAIN_OPENBLAS_LIB})
  target_include_directories(meshtrain_blas INTERFACE ${MESHTRAIN_CBLAS_INCLUDE})
  target_compile_definitions(meshtrain_blas INTERFACE MESHTRAIN_BLAS_OPENBLAS=1)
elseif(MESHTRAIN_BLAS STREQUAL "blis")
  # The OpenMP build (libblis-openmp-dev): the per-call rntm_t in kernels/gemm.cpp sets the
  # thread count. Look in its own folder first; the generic libblis.so is an alternatives link
  # that may point at the serial or pthread build.
  find_library(MESHTRAIN_BLIS_LIB NAMES blis PATHS /usr/lib/x86_64-linux-gnu/blis-openmp
               NO_DEFAULT_PATH)
  find_library(MESHTRAIN_BLIS_LIB NAMES blis REQUIRED)
  find_path(MESHTRAIN_BLIS_INCLUDE blis.h PATHS /usr/include/x86_64-linux-gnu/blis-openmp
            NO_DEFAULT_PATH)
  find_path(MESHTRAIN_BLIS_INCLUDE blis.h PATH_SUFFIXES blis REQUIRED)
  target_link_libraries(meshtrain_blas INTERFACE ${MESHTRAIN_BLIS_LIB})
  target_include_directories(meshtrain_blas INTERFACE ${MESHTRAIN_BLIS_INCLUDE})
  target_compile_definitions(meshtrain_blas INTERFACE MESHTRAIN_BLAS_BLIS=1)
elseif(MESHTRAIN_BLAS STREQUAL "dnnl")
  target_link_libraries(meshtrain_blas INTERFACE meshtrain_dnnl)
  target_compile_definitions(meshtrain_blas INTERFACE MESHTRAIN_BLAS_DNNL=1)
else()
  message(FATAL_ERROR "MESHTRAIN_BLAS must be openblas, blis or dnnl, not '${MESHTRAIN_BLAS}'")
endif()

# ---- kernel compile flags ----
# The CPU kernels (src/meshtrain/kernels) rely on the compiler vectorising loops with
# comparisons and selects (clamps, causal masks) and sqrt. GCC keeps those as branches while
# -ftrapping-math is on (a comparison may raise FE_INVALID) and keeps sqrt scalar while errno
# must be set, so these files are built without both. Neither changes results: no kernel reads
# floating-point exception flags or errno.
file(GLOB MESHTRAIN_KERNEL_SOURCES CONFIGURE_DEPENDS
     ${CMAKE_CURRENT_LIST_DIR}/../src/meshtrain/kernels/*.cpp)
set_source_files_properties(${MESHTRAIN_KERNEL_SOURCES} PROPERTIES
                            COMPILE_OPTIONS "-fno-trapping-math;-fno-math-errno")
