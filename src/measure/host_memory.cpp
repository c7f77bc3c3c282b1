// Host RawMemory: real allocations with a simulated capacity, so the allocator's retry and OOM
// paths can be driven on any machine. Expandable segments reserve address space with
// mmap(PROT_NONE) and map pages with mprotect; only mapped pages count against the capacity.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "measure/allocator.hpp"

namespace membudget::measure {


namespace {

constexpr std::size_t kAlign = 512;

bytes_t physical_memory() {
  long pages = ::sysconf(_SC_PHYS_PAGES);
  long page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<bytes_t>(pages) * static_cast<bytes_t>(page);
}

class HostMemory final : public RawMemory {
 public:
  explicit HostMemory(bytes_t capacity) : limited_(capacity != 0), capacity_(capacity) {
    if (!limited_) capacity_ = physical_memory();
  }

  void* raw_alloc(std::size_t bytes) override {
    std::size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    if (rounded == 0 || rounded < bytes) return nullptr;
    if (!fits(rounded)) return nullptr;
    void* p = std::aligned_alloc(kAlign, rounded);
    if (p) used_ += rounded;
    return p;
  }

  void raw_free(void* ptr, std::size_t bytes) override {
    if (!ptr) return;
    std::free(ptr);
    used_ -= (bytes + kAlign - 1) / kAlign * kAlign;
  }

  void* reserve_range(std::size_t bytes) override {
    void* p = ::mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
  }

  void release_range(void* base, std::size_t bytes) override {
    if (base) ::munmap(base, bytes);
  }

  bool map_range(void* ptr, std::size_t bytes) override {
    if (!fits(bytes)) return false;
    if (::mprotect(ptr, bytes, PROT_READ | PROT_WRITE) != 0) return false;
    used_ += bytes;
    return true;
  }

  void unmap_range(void* ptr, std::size_t bytes) override {
    // Give the pages back to the kernel, then make the range inaccessible again.
    ::madvise(ptr, bytes, MADV_DONTNEED);
    ::mprotect(ptr, bytes, PROT_NONE);
    used_ -= bytes;
  }

  bytes_t capacity() const override { return capacity_; }

  bytes_t free_bytes() const override { return used_ >= capacity_ ? 0 : capacity_ - used_; }

  std::string name() const override { return limited_ ? "host (simulated capacity)" : "host"; }

 private:
  bool fits(std::size_t bytes) const {
    if (!limited_) return true;  // the machine decides (aligned_alloc / mprotect fail)
    return bytes <= capacity_ && used_ <= capacity_ - bytes;
  }

  bool limited_;
  bytes_t capacity_;
  bytes_t used_ = 0;
};

}  // namespace

std::unique_ptr<RawMemory> make_host_memory(bytes_t capacity) {
  return std::make_unique<HostMemory>(capacity);
}

}  // namespace membudget::measure
