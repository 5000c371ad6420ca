// Checked output files (io/file.h): atomic replacement that never destroys the previous file,
// appends that leave only whole appends, failures that name the file and the cause. The
// full-disk cases mount a small tmpfs and skip where mounting is refused.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "meshtrain/io/file.h"
#include "temp_dir.h"
#include "tmpfs_mount.h"

namespace fs = std::filesystem;
using meshtrain::io::AppendFile;
using meshtrain::io::WriteError;
using meshtrain::io::write_file_atomic;

namespace {

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const WriteError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(AtomicFile, ReplacesTheFileAndLeavesNothingBeside) {
  meshtrain::testing::TempDir tmp("io");
  const fs::path p = tmp.path() / "t.json";
  write_file_atomic(p.string(), "first", "trace");
  write_file_atomic(p.string(), "second", "trace");
  EXPECT_EQ(read_all(p), "second");
  EXPECT_EQ(names_in(tmp.path()), std::vector<std::string>{"t.json"});
}

TEST(AtomicFile, AMissingDirectoryNamesTheFileAndTheCause) {
  meshtrain::testing::TempDir tmp("io");
  const std::string p = tmp.file("no/such/dir/t.svg");
  const std::string msg = message_of([&] { write_file_atomic(p, "x", "swimlane file"); });
  EXPECT_NE(msg.find("cannot write swimlane file " + p), std::string::npos) << msg;
  EXPECT_NE(msg.find("No such file or directory"), std::string::npos) << msg;
}

TEST(AtomicFile, ASymbolicLinkIsWrittenThroughAndModeKept) {
  meshtrain::testing::TempDir tmp("io");
  const fs::path real = tmp.path() / "real.json", link = tmp.path() / "link.json";
  std::ofstream(real) << "old";
  ::chmod(real.c_str(), 0600);
  fs::create_symlink(real, link);
  write_file_atomic(link.string(), "new", "trace");
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(read_all(real), "new");
  EXPECT_EQ(fs::status(real).permissions() & fs::perms::all, fs::perms::owner_read | fs::perms::owner_write);
}

TEST(AtomicFile, AFullDiskKeepsThePreviousFile) {
  meshtrain::testing::TempDir tmp("io");
  meshtrain::testing::TmpfsMount disk(tmp.path() / "disk", "64k");
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs (" << disk.error() << "); run as root to test a full disk";
  const fs::path p = disk.path() / "t.json";
  write_file_atomic(p.string(), "previous", "trace");
  ASSERT_GT(disk.fill(), 0);
  const std::string msg = message_of([&] { write_file_atomic(p.string(), std::string(20000, 'y'), "trace"); });
  EXPECT_NE(msg.find("cannot write trace " + p.string() + ": No space left on device"), std::string::npos) << msg;
  EXPECT_EQ(read_all(p), "previous");
  EXPECT_EQ(names_in(disk.path()), (std::vector<std::string>{"filler", "t.json"}));
}

TEST(AppendFile, AFullDiskLeavesWholeAppendsOnly) {
  meshtrain::testing::TempDir tmp("io");
  meshtrain::testing::TmpfsMount disk(tmp.path() / "disk", "64k");
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs (" << disk.error() << "); run as root to test a full disk";
  ASSERT_GT(disk.fill(4096), 0);  // one page left
  const fs::path p = disk.path() / "m.jsonl";
  AppendFile f(p.string(), /*truncate=*/true, "metrics file");
  const std::string line(300, 'a');
  int appended = 0;
  std::string msg;
  for (int i = 0; i < 100 && msg.empty(); ++i) {
    msg = message_of([&] { f.append(line + "\n"); });
    if (msg.empty()) ++appended;
  }
  EXPECT_NE(msg.find("cannot write metrics file " + p.string() + ": No space left on device"), std::string::npos)
      << msg;
  EXPECT_GT(appended, 0);
  EXPECT_EQ(fs::file_size(p), static_cast<uintmax_t>(appended) * (line.size() + 1));
  EXPECT_NO_THROW(f.close());
}

TEST(AppendFile, AppendsContinueAFileAndCloseIsChecked) {
  meshtrain::testing::TempDir tmp("io");
  const fs::path p = tmp.path() / "m.jsonl";
  {
    AppendFile f(p.string(), true, "metrics file");
    f.append("1\n");
    f.close();
    f.close();  // idempotent
  }
  AppendFile g(p.string(), false, "metrics file");
  g.append("2\n");
  g.close();
  EXPECT_EQ(read_all(p), "1\n2\n");
  EXPECT_THROW(g.append("3\n"), WriteError);  // closed
}
