// A file's bytes as an MLX array without reading them: the pages of a private mapping, faulted
// in when a kernel first reads them (how a GGUF's blocks are loaded for the CPU's block kernels,
// gguf.reader ``GGUFFile.load_weight``). Private and writable, so that nothing MLX does to the
// array can reach the file (a write copies the page). MLX's array-from-pointer constructor
// copies on the CPU, so the mapping is wrapped as a buffer the way the CPU allocator lays one
// out (its size header in front of the data, measured on a real allocation), with munmap as
// the deleter. That layout is MLX's internal business: ``mapping_supported`` checks it on a
// wrapped buffer (the loader copies the blocks instead, saying so, where it differs), and
// tests/kernels/test_kernel_gguf_blocks.py checks the bytes and that nothing is copied.

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common.h"
#include "ops.h"

namespace ds4mlx_ops {

namespace {

// How far before its data an MLX CPU buffer's pointer lies (the allocator's size header), read
// from a real allocation; arrays over mapped pages are wrapped the same way.
std::ptrdiff_t buffer_header() {
  static const std::ptrdiff_t header = [] {
    mx::allocator::Buffer probe = mx::allocator::allocator().malloc(16);
    const auto gap = static_cast<const char*>(probe.raw_ptr()) - static_cast<const char*>(probe.ptr());
    mx::allocator::allocator().free(probe);
    return gap;
  }();
  return header;
}

// Memory at ``data`` (with room in front of it) wrapped as a CPU buffer of ``nbytes``: the size
// header written where the allocator keeps one.
mx::allocator::Buffer wrap(char* data, size_t nbytes) {
  const std::ptrdiff_t header = buffer_header();
  if (header == static_cast<std::ptrdiff_t>(sizeof(size_t))) {
    std::memcpy(data - header, &nbytes, sizeof nbytes);
  }
  return mx::allocator::Buffer(data - header);
}

// Whether a buffer wrapped by ``wrap`` reads as MLX's own: its data where the memory is, its
// size the one written (a header of 0 or one size_t; anything else is another layout).
bool wraps_like_mlx() {
  const std::ptrdiff_t header = buffer_header();
  if (header != 0 && header != static_cast<std::ptrdiff_t>(sizeof(size_t))) return false;
  alignas(64) char memory[128] = {};
  char* data = memory + 64;
  const size_t nbytes = 48;
  mx::allocator::Buffer buffer = wrap(data, nbytes);
  return buffer.raw_ptr() == data && mx::allocator::allocator().size(buffer) == nbytes;
}

}  // namespace

bool mapping_supported() {
  static const bool supported = wraps_like_mlx();
  return supported;
}

mx::array mapped_bytes(const std::string& path, int64_t offset, const std::vector<int>& shape) {
  if (!mapping_supported()) {
    throw std::runtime_error("mapped_bytes: this MLX lays out its CPU buffers differently; "
                             "load the bytes by copying (mapping_supported() is false)");
  }
  size_t nbytes = 1;
  for (int d : shape) {
    if (d < 0) throw std::invalid_argument("mapped_bytes: negative dimension");
    nbytes *= static_cast<size_t>(d);
  }
  const std::ptrdiff_t header = buffer_header();
  if (offset < header || nbytes == 0) {
    throw std::invalid_argument("mapped_bytes: expected an offset past the file's start and a "
                                "non-empty shape");
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("mapped_bytes: " + path + ": " + std::strerror(errno));
  const auto page = static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
  // The mapping starts early enough to hold the buffer header in front of the data.
  const int64_t start = (offset - header) / page * page;
  const size_t length = nbytes + static_cast<size_t>(offset - start);
  void* base = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, start);
  const int mmap_errno = errno;
  ::close(fd);  // the mapping keeps the file
  if (base == MAP_FAILED) {
    throw std::runtime_error("mapped_bytes: cannot map " + path + ": " + std::strerror(mmap_errno));
  }
  char* data = static_cast<char*>(base) + (offset - start);
  mx::allocator::Data memory(wrap(data, nbytes),
                             [base, length](mx::allocator::Buffer) { ::munmap(base, length); });
  return mx::array(std::move(memory), mx::Shape(shape.begin(), shape.end()), mx::uint8);
}

}  // namespace ds4mlx_ops
