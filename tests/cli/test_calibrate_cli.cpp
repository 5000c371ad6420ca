// `meshtrain calibrate` end to end: bad flags and paths exit 2 with a sentence, the output
// policy keeps files meshtrain did not write, and --quick writes a machine file the strict
// reader accepts, with a progress line per measurement.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "cli_run.h"
#include "meshtrain/plan/machine.h"
#include "temp_dir.h"

namespace {
using meshtrain::testing::run_cli;

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(CliCalibrate, BadFlagsAndPathsExit2) {
  meshtrain::testing::TempDir dir("calibrate_cli");
  struct Case {
    std::string args, words;
  };
  for (const Case& c : {Case{"calibrate --threads 0", "--threads"}, Case{"calibrate --threads two", "--threads"},
                        Case{"calibrate --threads 100000", "cores"}, Case{"calibrate --fast", "--fast"},
                        Case{"calibrate --rounds 0", "--rounds"}, Case{"calibrate --rounds many", "--rounds"},
                        Case{"calibrate --out " + dir.file("no/such/dir/m.json"), "--out"},
                        Case{"calibrate --out " + dir.path().string(), "--out"}}) {
    const auto r = run_cli(c.args + " --quick", 60);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.words), std::string::npos) << c.args << "\n" << r.output;
    EXPECT_EQ(r.output.find("calibrate ["), std::string::npos) << "measured before refusing: " << c.args;
  }
}

TEST(CliCalibrate, KeepsAFileItDidNotWriteAndReplacesItsOwn) {
  meshtrain::testing::TempDir dir("calibrate_cli");
  const std::string out = dir.file("m.json");
  std::ofstream(out) << "{\"mine\": true}\n";
  auto r = run_cli("calibrate --quick --threads 1 --out " + out, 120);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--overwrite"), std::string::npos) << r.output;
  EXPECT_EQ(slurp(out), "{\"mine\": true}\n");

  r = run_cli("calibrate --quick --threads 1 --overwrite --out " + out, 120);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto p = meshtrain::plan::read_machine_file(out);
  EXPECT_EQ(p.mode, "quick");
  // One progress line per measurement: gemm, the element-wise kernels, attention, convolutions
  // and CNN layers at 1 thread (one round in quick mode); the lines that keep the kernels' and
  // the CNN rows' medians; ranks sharing cores, the call overhead and the link.
  std::size_t lines = 0;
  for (std::size_t at = r.output.find("calibrate ["); at != std::string::npos; at = r.output.find("calibrate [", at + 1))
    ++lines;
  EXPECT_EQ(lines, p.gemm.size() + p.elementwise.size() + p.attention.size() + p.conv.size() + p.cnn_layers.size() + 5)
      << r.output;
  EXPECT_NE(r.output.find("machine file: " + out), std::string::npos) << r.output;

  // Its own file is replaced without --overwrite.
  r = run_cli("calibrate --quick --threads 1 --out " + out, 120);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NO_THROW(meshtrain::plan::read_machine_file(out));
}

// Under mpirun both ranks measure the MPI link (one host: shared memory) and rank 0 alone
// writes the file, with the threads link beside it and TCP named as not measured.
TEST(CliCalibrate, MeasuresTheMpiLinkUnderMpirun) {
#ifndef MESHTRAIN_HAVE_MPI
  GTEST_SKIP() << "this build has no MPI backend";
#endif
  meshtrain::testing::TempDir dir("calibrate_cli");
  const std::string out = dir.file("m.json");
  const auto r = run_cli("calibrate --quick --out " + out, 180, "mpirun --allow-run-as-root --oversubscribe -np 2");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto p = meshtrain::plan::read_machine_file(out);
  for (const char* op : {"all_reduce", "sendrecv"}) {
    ASSERT_NE(p.link("mpi_shared_memory", op), nullptr) << op << "\n" << r.output;
    EXPECT_EQ(p.link("mpi_shared_memory", op)->world, 2);
    EXPECT_NE(p.link("threads", op), nullptr) << op;
  }
  int tcp = 0;
  for (const auto& n : p.not_measured) tcp += n.what == "mpi_tcp";
  EXPECT_EQ(tcp, 1);
  // One summary: rank 1 writes nothing.
  std::size_t files = 0;
  for (std::size_t at = r.output.find("machine file: "); at != std::string::npos; at = r.output.find("machine file: ", at + 1))
    ++files;
  EXPECT_EQ(files, 1u) << r.output;
}

}  // namespace
