// A unique temporary directory per test process (mkdtemp), removed when it goes out of
// scope. ctest runs test cases as separate processes side by side (`ctest -j 2`), so a fixed
// name under /tmp is shared between concurrent cases: one truncates what another reads.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

namespace meshtrain::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& tag = "test") {
    std::string templ = (std::filesystem::temp_directory_path() / ("meshtrain_" + tag + "_XXXXXX")).string();
    if (::mkdtemp(templ.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + templ);
    path_ = templ;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace meshtrain::testing
