// Checked output files; guarantees in file.h.
#include "meshtrain/io/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace meshtrain::io {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void throw_write_error(const std::string& what, const std::string& path, int err) {
  throw WriteError("cannot write " + what + " " + path + ": " + std::strerror(err));
}

// Writes all of [p, p + n) to fd; returns 0 or the errno of the failed write.
int write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = ::write(fd, p, std::min<size_t>(n, size_t{1} << 22));
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return errno;
    if (k == 0) return EIO;  // a regular file never writes nothing without an error
    p += k;
    n -= static_cast<size_t>(k);
  }
  return 0;
}

// fsync that tolerates files which cannot be synced (a character device such as /dev/null).
int sync_fd(int fd) {
  if (::fsync(fd) == 0 || errno == EINVAL || errno == EROFS) return 0;
  return errno;
}

}  // namespace

bool touch(const std::string& path) { return utimensat(AT_FDCWD, path.c_str(), nullptr, 0) == 0; }

void write_file_atomic(const std::string& path, std::string_view bytes, const std::string& what) {
  std::error_code ec;
  fs::path target(path);
  if (fs::is_symlink(target, ec)) {  // replace the file it points at, as writing through it did
    const fs::path real = fs::canonical(target, ec);
    if (!ec) target = real;
  }
  const fs::path dir = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  // A new name beside the target: O_EXCL never takes over a file that exists.
  std::string tmp;
  int fd = -1;
  const std::string stem = target.filename().string() + "." + std::to_string(::getpid()) + ".";
  for (int attempt = 0; fd < 0; ++attempt) {
    std::string name(1, '.');  // hidden; appended piecewise (GCC 12 warns about "." + string)
    name += stem;
    name += std::to_string(attempt);
    name += ".tmp";
    tmp = (dir / name).string();
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && (errno != EEXIST || attempt == 100)) throw_write_error(what, path, errno);
  }
  struct stat st {};
  if (::stat(target.c_str(), &st) == 0 && S_ISREG(st.st_mode)) (void)::fchmod(fd, st.st_mode & 07777);
  int err = write_all(fd, bytes.data(), bytes.size());
  if (!err) err = sync_fd(fd);
  if (::close(fd) != 0 && !err) err = errno;
  if (!err && ::rename(tmp.c_str(), target.c_str()) != 0) err = errno;
  if (err) {
    ::unlink(tmp.c_str());
    throw_write_error(what, path, err);
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {  // the rename survives a crash; file systems that cannot sync a directory are let be
    err = sync_fd(dfd);
    ::close(dfd);
    if (err) throw_write_error(what, path, err);
  }
}

AppendFile::AppendFile(const std::string& path, bool truncate, std::string what)
    : path_(path), what_(std::move(what)) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (truncate ? O_TRUNC : 0), 0666);
  if (fd_ < 0) fail(errno);
  const off_t end = ::lseek(fd_, 0, SEEK_END);
  size_ = end > 0 ? static_cast<int64_t>(end) : 0;
}

AppendFile::~AppendFile() {
  if (fd_ >= 0) ::close(fd_);
}

void AppendFile::fail(int err) const { throw_write_error(what_, path_, err); }

void AppendFile::append(std::string_view bytes) {
  if (fd_ < 0) fail(EBADF);
  const int err = write_all(fd_, bytes.data(), bytes.size());
  if (err) {
    // Part of it may be in the file: cut it back, so the file holds whole appends only.
    if (::ftruncate(fd_, static_cast<off_t>(size_)) != 0) {
      // best effort: a resume drops a cut line anyway (train/metrics.h)
    }
    fail(err);
  }
  size_ += static_cast<int64_t>(bytes.size());
}

void AppendFile::close() {
  if (fd_ < 0) return;
  int err = sync_fd(fd_);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0 && !err) err = errno;
  if (err) fail(err);
}

}  // namespace meshtrain::io
