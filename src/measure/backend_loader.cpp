// make_backend(): the CPU backend is linked in; the CUDA backend is a plugin loaded on demand
// (src/measure/cuda/plugin.cpp says why). The plugin is looked for, in order: the path in
// $MEMBUDGET_CUDA_PLUGIN (only there, when set); beside the executable; in the installed layout
// (<bindir>/../lib/membudget); in the build tree this binary came from.
#include <dlfcn.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include "measure/backend.hpp"

#ifndef MEMBUDGET_PLUGIN_REL
#define MEMBUDGET_PLUGIN_REL "../lib/membudget"
#endif
#ifndef MEMBUDGET_PLUGIN_BUILD_PATH
#define MEMBUDGET_PLUGIN_BUILD_PATH ""
#endif

namespace membudget::measure {
namespace {

constexpr const char* kPluginName = "libmembudget_cuda.so";
using Create = int (*)(std::uint64_t, Backend**, int*, char*, std::size_t);

bool is_file(const std::string& p) {
  struct stat st {};
  return !p.empty() && ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string exe_dir() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return {};
  std::string p(buf, static_cast<std::size_t>(n));
  const auto slash = p.rfind('/');
  return slash == std::string::npos ? std::string{} : p.substr(0, slash);
}

std::vector<std::string> candidates() {
  if (const char* env = std::getenv("MEMBUDGET_CUDA_PLUGIN"); env && *env) return {env};
  std::vector<std::string> out;
  const std::string dir = exe_dir();
  if (!dir.empty()) {
    out.push_back(dir + "/" + kPluginName);
    out.push_back(dir + "/" + MEMBUDGET_PLUGIN_REL + "/" + kPluginName);
  }
  if (*MEMBUDGET_PLUGIN_BUILD_PATH) out.push_back(MEMBUDGET_PLUGIN_BUILD_PATH);
  return out;
}

// The plugin's entry point; the library stays loaded for the life of the process (backends
// created from it point into it).
Create load_plugin() {
  static std::mutex mu;
  static std::map<std::string, Create> loaded;
  std::lock_guard<std::mutex> lock(mu);
  std::string looked;
  for (const std::string& path : candidates()) {
    if (auto it = loaded.find(path); it != loaded.end()) return it->second;
    if (!is_file(path)) {
      looked += (looked.empty() ? "" : ", ") + path;
      continue;
    }
    void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* why = ::dlerror();
      throw Error(ErrorKind::device, "--device-backend cuda: cannot load the CUDA backend " + path + ": " +
                                         (why ? why : "dlopen failed") +
                                         " (the CUDA toolkit's libcublas must be on the library path)");
    }
    auto create = reinterpret_cast<Create>(::dlsym(h, "membudget_cuda_backend_create"));
    if (!create)
      throw Error(ErrorKind::device, "--device-backend cuda: " + path + " is not a membudget CUDA backend");
    loaded.emplace(path, create);
    return create;
  }
  throw Error(ErrorKind::unsupported,
              "--device-backend cuda: the CUDA backend (" + std::string(kPluginName) + ") is not installed; looked in " +
                  looked + ". Build with nvcc available and -DMEMBUDGET_CUDA=ON, set MEMBUDGET_CUDA_PLUGIN, or use "
                  "--device-backend cpu");
}

std::unique_ptr<Backend> load_cuda_backend(bytes_t capacity) {
  const Create create = load_plugin();
  Backend* backend = nullptr;
  int kind = static_cast<int>(ErrorKind::device);
  char message[1024] = {};
  if (create(capacity, &backend, &kind, message, sizeof message) != 0 || !backend)
    throw Error(static_cast<ErrorKind>(kind), message[0] ? message : "--device-backend cuda: the backend failed to start");
  return std::unique_ptr<Backend>(backend);
}

}  // namespace

std::unique_ptr<Backend> make_backend(const std::string& name, bytes_t capacity) {
  if (name == "cpu") return make_cpu_backend(capacity);
  if (name == "cuda") return load_cuda_backend(capacity);
  throw Error(ErrorKind::invalid_argument, "--device-backend: '" + name + "' is not one of cpu, cuda");
}

}  // namespace membudget::measure
