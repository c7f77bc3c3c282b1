// The CUDA backend as a plugin (libmembudget_cuda.so): the CLI and the library load it with dlopen
// only when --device-backend cuda is asked for (src/measure/backend_loader.cpp), so starting
// `membudget predict` never maps cuBLAS (hundreds of MiB that cost ~0.1 s to load) and the CLI runs
// on machines without CUDA. The one exported symbol creates the backend; errors cross the boundary
// as a kind and a message, never as an exception.
#include <cstring>

#include "measure/backend.hpp"

extern "C" __attribute__((visibility("default"))) int membudget_cuda_backend_create(
    std::uint64_t capacity, membudget::measure::Backend** out, int* error_kind, char* message, std::size_t size) {
  try {
    *out = membudget::measure::make_cuda_backend(capacity).release();
    return 0;
  } catch (const membudget::Error& e) {
    *error_kind = static_cast<int>(e.kind());
    std::strncpy(message, e.what(), size - 1);
  } catch (const std::exception& e) {
    *error_kind = static_cast<int>(membudget::ErrorKind::device);
    std::strncpy(message, e.what(), size - 1);
  }
  message[size - 1] = '\0';
  return 1;
}
