// dilocox/config.hpp: the bottom of the include graph. The library's error type,
// version, and the host/device annotation shared by CPU and CUDA code.
// Needs only the standard library; defines no behaviour of its own.
#pragma once

#include <stdexcept>
#include <string>

#define DILOCOX_VERSION_MAJOR 0
#define DILOCOX_VERSION_MINOR 1
#define DILOCOX_VERSION_PATCH 0

#if defined(__CUDACC__)
#define DILOCOX_HOST_DEVICE __host__ __device__
#else
#define DILOCOX_HOST_DEVICE
#endif

namespace dilocox {

// Every input the library rejects. The message says what was wrong and where
// ("quantize: element 17 is NaN", "read_payload: checksum mismatch").
struct Error : std::runtime_error {
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
// Throws Error(where + ": " + what) unless ok.
inline void require(bool ok, const char* where, const std::string& what) {
  if (!ok) throw Error(std::string(where) + ": " + what);
}
}  // namespace detail

}  // namespace dilocox
