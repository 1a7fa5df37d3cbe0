# Flags for our own tests, benchmarks and examples only (never for consumers of
# dilocox::dilocox): warnings as errors, optional -march=native and sanitizers.
add_library(dilocox_build_flags INTERFACE)
target_compile_options(dilocox_build_flags INTERFACE -Wall -Wextra -Wpedantic -Werror)
# GCC 12 reports uninitialized variables inside its own AVX-512 intrinsics when Eigen
# uses them, and -Wrestrict overlaps inside std::string's operator+ (GCC bug 105651)
# wherever the unit's inlining budget happens to inline it: false positives of the
# compiler's headers, not of our code.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  target_compile_options(dilocox_build_flags INTERFACE -Wno-maybe-uninitialized -Wno-restrict)
endif()
if(DILOCOX_NATIVE)
  target_compile_options(dilocox_build_flags INTERFACE -march=native)
endif()
if(DILOCOX_SANITIZE)
  target_compile_options(dilocox_build_flags INTERFACE -fsanitize=${DILOCOX_SANITIZE} -fno-omit-frame-pointer
                         -fno-sanitize-recover=all)
  target_link_options(dilocox_build_flags INTERFACE -fsanitize=${DILOCOX_SANITIZE})
endif()
