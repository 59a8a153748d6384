// A file's bytes as an MLX array without reading them: the pages of a private mapping, faulted
// in when a kernel first reads them (how a GGUF's blocks are loaded for the CPU's block kernels,
// gguf.quants ``load_weight``). Private and writable, so that nothing MLX does to the array can
// reach the file (a write copies the page).

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common.h"
#include "ops.h"

namespace ds4mlx_ops {

mx::array mapped_bytes(const std::string& path, int64_t offset, const std::vector<int>& shape) {
  size_t nbytes = 1;
  for (int d : shape) {
    if (d < 0) throw std::invalid_argument("mapped_bytes: negative dimension");
    nbytes *= static_cast<size_t>(d);
  }
  if (offset < 0 || nbytes == 0) {
    throw std::invalid_argument("mapped_bytes: expected offset >= 0 and a non-empty shape");
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("mapped_bytes: " + path + ": " + std::strerror(errno));
  const auto page = static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
  const int64_t start = offset / page * page;
  const size_t length = nbytes + static_cast<size_t>(offset - start);
  void* base = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, start);
  const int mmap_errno = errno;
  ::close(fd);  // the mapping keeps the file
  if (base == MAP_FAILED) {
    throw std::runtime_error("mapped_bytes: cannot map " + path + ": " + std::strerror(mmap_errno));
  }
  auto* data = static_cast<uint8_t*>(base) + (offset - start);
  return mx::array(data, mx::Shape(shape.begin(), shape.end()), mx::uint8,
                   [base, length](void*) { ::munmap(base, length); });
}

}  // namespace ds4mlx_ops
