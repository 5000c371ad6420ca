// A small tmpfs mounted on a directory for the length of a test: a full disk on demand. Needs
// the right to mount (root, as the suite runs in CI); a test checks mounted() and skips with
// error() when it is refused. fill() takes every free byte, leaving `keep_free` bytes (rounded
// by the file system to its pages).
#pragma once

#include <fcntl.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace meshtrain::testing {

class TmpfsMount {
 public:
  TmpfsMount(const std::filesystem::path& dir, const std::string& size) : dir_(dir) {
    std::filesystem::create_directories(dir);
    mounted_ = ::mount("tmpfs", dir.c_str(), "tmpfs", 0, ("size=" + size).c_str()) == 0;
    if (!mounted_) error_ = std::strerror(errno);
  }
  ~TmpfsMount() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  TmpfsMount(const TmpfsMount&) = delete;
  TmpfsMount& operator=(const TmpfsMount&) = delete;

  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }
  const std::filesystem::path& path() const { return dir_; }

  // Writes `name` until the file system is full, then gives back `keep_free` bytes. Returns
  // the filler's size.
  int64_t fill(int64_t keep_free = 0, const std::string& name = "filler") const {
    const std::string p = (dir_ / name).string();
    const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    std::vector<char> buf(1 << 16, 'x');
    int64_t size = 0;
    for (;;) {
      const ssize_t k = ::write(fd, buf.data(), buf.size());
      if (k <= 0) break;
      size += k;
    }
    if (keep_free > 0) {
      size = size > keep_free ? size - keep_free : 0;
      if (::ftruncate(fd, size) != 0) size = -1;
    }
    ::close(fd);
    return size;
  }

 private:
  std::filesystem::path dir_;
  bool mounted_ = false;
  std::string error_;
};

}  // namespace meshtrain::testing
