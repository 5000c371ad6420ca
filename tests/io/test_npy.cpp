// NumPy files (io/npy.h): what write_npz writes reads back (and numpy.load reads it, 0-d int64
// included, when /usr/bin/python3 has numpy); files numpy itself writes (savez, savez_compressed,
// .npy versions 1.0, 2.0 and 3.0; 0-d, 1-d and 4-d arrays) read with the values numpy holds;
// stored members point into the mapping; every malformed file is refused naming the file and,
// where one exists, the array.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "meshtrain/io/npy.h"
#include "temp_dir.h"

using meshtrain::io::NpyArray;
using meshtrain::io::NpyError;
using meshtrain::io::NpyFile;
using meshtrain::io::NpyType;
using meshtrain::io::NpyWrite;
using meshtrain::io::write_npz;
using meshtrain::testing::TempDir;

namespace {

std::string read_all(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_all(const std::string& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

// Replaces the first `from` in the file by `to` (same length: the zip's offsets stay right).
void patch(const std::string& p, const std::string& from, const std::string& to) {
  ASSERT_EQ(from.size(), to.size());
  std::string s = read_all(p);
  const size_t at = s.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  s.replace(at, from.size(), to);
  write_all(p, s);
}

bool have_numpy() { return std::system("/usr/bin/python3 -c 'import numpy' > /dev/null 2>&1") == 0; }

// Runs a Python program with numpy; its stdout.
std::string python(const TempDir& dir, const std::string& program) {
  write_all(dir.file("prog.py"), "import numpy\nimport numpy as np\n" + program);
  const std::string out = dir.file("prog.out");
  const int rc = std::system(("/usr/bin/python3 " + dir.file("prog.py") + " > " + out + " 2>&1").c_str());
  EXPECT_EQ(rc, 0) << read_all(out);
  return read_all(out);
}

void expect_npy_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no NpyError";
  } catch (const NpyError& e) {
    for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << "\nlacks: " << p;
  }
}

struct Arrays {
  std::vector<float> w{1.5f, -2.0f, 3.25f, 0.0f, 1e-3f, 7.0f};  // (2, 3)
  int64_t count = 42;                                             // ()
  std::vector<int32_t> ids{-1, 0, 2147483647, 5};                 // (4,)
  std::vector<uint8_t> img{0, 1, 2, 3, 250, 251, 254, 255};       // (2, 2, 2)
  std::vector<NpyWrite> list() const {
    return {{"fc.weight", NpyType::f32, {2, 3}, w.data()},
            {"bn.num_batches_tracked", NpyType::i64, {}, &count},
            {"ids", NpyType::i32, {4}, ids.data()},
            {"img", NpyType::u8, {2, 2, 2}, img.data()},
            {"empty", NpyType::f32, {0, 3}, nullptr}};
  }
};

}  // namespace

TEST(Npz, WriteThenReadGivesTheArraysBack) {
  TempDir dir("npy");
  const Arrays a;
  write_npz(dir.file("a.npz"), a.list());
  const auto f = NpyFile::open(dir.file("a.npz"));
  EXPECT_TRUE(f->is_npz());
  ASSERT_EQ(f->arrays().size(), 5u);
  EXPECT_EQ(f->names(), "fc.weight, bn.num_batches_tracked, ids, img, empty");
  const NpyArray* w = f->find("fc.weight");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->type, NpyType::f32);
  EXPECT_EQ(w->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_TRUE(w->mapped);
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(w->at<float>(i), a.w[i]);
  const NpyArray* c = f->find("bn.num_batches_tracked");
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(c->shape.empty());
  EXPECT_EQ(c->shape_str(), "()");
  EXPECT_EQ(c->numel(), 1);
  EXPECT_EQ(c->at<int64_t>(0), 42);
  const NpyArray* ids = f->find("ids");
  EXPECT_EQ(ids->shape_str(), "(4,)");
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(ids->integer_at(i, f->path()), a.ids[i]);
  const NpyArray* img = f->find("img");
  EXPECT_EQ(img->type, NpyType::u8);
  for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(img->at<uint8_t>(i), a.img[i]);
  EXPECT_EQ(f->find("empty")->numel(), 0);
  EXPECT_EQ(f->find("missing"), nullptr);
}

TEST(Npz, WritingIsDeterministicAndRefusesBadArrays) {
  TempDir dir("npy");
  const Arrays a;
  write_npz(dir.file("a.npz"), a.list());
  write_npz(dir.file("b.npz"), a.list());
  EXPECT_EQ(read_all(dir.file("a.npz")), read_all(dir.file("b.npz")));
  std::vector<NpyWrite> twice = a.list();
  twice.push_back(twice[0]);
  EXPECT_THROW(write_npz(dir.file("c.npz"), twice), std::invalid_argument);
  EXPECT_THROW(write_npz(dir.file("c.npz"), {{"", NpyType::f32, {1}, a.w.data()}}), std::invalid_argument);
  EXPECT_THROW(write_npz(dir.file("c.npz"), {{"x", NpyType::f32, {2}, nullptr}}), std::invalid_argument);
  EXPECT_FALSE(std::ifstream(dir.file("c.npz")).good());  // nothing written
}

TEST(Npz, NumpyLoadsWhatWriteNpzWrites) {
  if (!have_numpy()) GTEST_SKIP() << "/usr/bin/python3 has no numpy; the numpy side of the round trip is not checked";
  TempDir dir("npy");
  const Arrays a;
  write_npz(dir.file("a.npz"), a.list());
  const std::string out = python(dir, "d = numpy.load('" + dir.file("a.npz") + "')\n"
                                       "for k in d.files:\n"
                                       "    v = d[k]\n"
                                       "    print(k, v.dtype, v.shape, v.ravel().tolist())\n");
  EXPECT_EQ(out,
            "fc.weight float32 (2, 3) [1.5, -2.0, 3.25, 0.0, 0.0010000000474974513, 7.0]\n"
            "bn.num_batches_tracked int64 () [42]\n"
            "ids int32 (4,) [-1, 0, 2147483647, 5]\n"
            "img uint8 (2, 2, 2) [0, 1, 2, 3, 250, 251, 254, 255]\n"
            "empty float32 (0, 3) []\n");
}

TEST(Npz, ReadsWhatNumpyWrites) {
  if (!have_numpy()) GTEST_SKIP() << "/usr/bin/python3 has no numpy; files numpy writes are not checked";
  TempDir dir("npy");
  python(dir, "import numpy.lib.format as fmt\n"
              "a = {'scalar': np.int64(-7), 'vec': np.arange(5, dtype=np.float32) / 4,\n"
              "     'img': np.arange(2*3*4*5, dtype=np.uint8).reshape(2, 3, 4, 5),\n"
              "     'big': np.arange(100000, dtype=np.int64) * 3, 'u16': np.array([0, 65535], dtype=np.uint16),\n"
              "     'f64': np.array([[0.5], [-1e300]]), 'flag': np.array([True, False])}\n"
              "np.savez('" + dir.file("s.npz") + "', **a)\n"
              "np.savez_compressed('" + dir.file("c.npz") + "', **a)\n"
              "np.save('" + dir.file("v1.npy") + "', a['img'])\n"
              "for v in (2, 3):\n"
              "    with open('" + dir.path().string() + "/v%d.npy' % v, 'wb') as f:\n"
              "        fmt.write_array(f, a['img'], version=(v, 0))\n");
  for (const char* name : {"s.npz", "c.npz"}) {
    SCOPED_TRACE(name);
    const auto f = NpyFile::open(dir.file(name));
    EXPECT_EQ(f->arrays().size(), 7u);
    const NpyArray* s = f->find("scalar");
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->type, NpyType::i64);
    EXPECT_TRUE(s->shape.empty());
    EXPECT_EQ(s->at<int64_t>(0), -7);
    const NpyArray* v = f->find("vec");
    EXPECT_EQ(v->shape, std::vector<int64_t>{5});
    for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(v->at<float>(i), static_cast<float>(i) / 4);
    const NpyArray* img = f->find("img");
    EXPECT_EQ(img->shape, (std::vector<int64_t>{2, 3, 4, 5}));
    EXPECT_EQ(img->mapped, std::string(name) == "s.npz");  // stored: in place; deflated: inflated
    for (int64_t i = 0; i < 120; ++i) EXPECT_EQ(img->at<uint8_t>(i), i);
    const NpyArray* big = f->find("big");
    EXPECT_EQ(big->at<int64_t>(99999), 299997);
    EXPECT_EQ(f->find("u16")->at<uint16_t>(1), 65535);
    EXPECT_EQ(f->find("f64")->at<double>(1), -1e300);
    EXPECT_EQ(f->find("flag")->type, NpyType::b8);
    EXPECT_EQ(f->find("flag")->integer_at(0, name), 1);
  }
  for (const char* name : {"v1.npy", "v2.npy", "v3.npy"}) {
    SCOPED_TRACE(name);
    const auto f = NpyFile::open(dir.file(name));
    EXPECT_FALSE(f->is_npz());
    ASSERT_EQ(f->arrays().size(), 1u);
    EXPECT_EQ(f->arrays()[0].name, std::string(name).substr(0, 2));
    EXPECT_EQ(f->arrays()[0].shape, (std::vector<int64_t>{2, 3, 4, 5}));
    EXPECT_EQ(f->arrays()[0].at<uint8_t>(119), 119);
  }
}

// numpy.savez writes zip64 records for members past 4 GiB; Python's zipfile writes them for
// every size and count when its limits are lowered, so the zip64 end record, its locator and
// the central entries' zip64 fields are read here without gigabytes.
TEST(Npz, ReadsZip64Records) {
  if (!have_numpy()) GTEST_SKIP() << "/usr/bin/python3 has no numpy to write a zip64 archive";
  TempDir dir("npy");
  python(dir, "import zipfile\n"
              "zipfile.ZIP64_LIMIT = 1\n"
              "zipfile.ZIP_FILECOUNT_LIMIT = 1\n"
              "np.savez('" + dir.file("z.npz") + "', a=np.arange(10, dtype=np.int16), b=np.float32(2.5))\n"
              "np.savez_compressed('" + dir.file("zc.npz") + "', a=np.arange(10, dtype=np.int16), b=np.float32(2.5))\n");
  for (const char* name : {"z.npz", "zc.npz"}) {
    SCOPED_TRACE(name);
    const std::string bytes = read_all(dir.file(name));
    ASSERT_NE(bytes.find("PK\x06\x06"), std::string::npos);  // the zip64 end record is there
    const auto f = NpyFile::open(dir.file(name));
    ASSERT_EQ(f->names(), "a, b");
    EXPECT_EQ(f->find("a")->at<int16_t>(9), 9);
    EXPECT_EQ(f->find("b")->at<float>(0), 2.5f);
  }
}

TEST(Npz, RefusesMalformedFilesNamingFileAndArray) {
  TempDir dir("npy");
  const Arrays a;
  const std::string good = dir.file("good.npz");
  write_npz(good, a.list());
  const std::string bytes = read_all(good);
  auto copy = [&](const std::string& name) {
    write_all(dir.file(name), bytes);
    return dir.file(name);
  };
  auto open = [](const std::string& p) { return [p] { NpyFile::open(p); }; };

  // Truncated: inside the second array, and inside the zip directory.
  const std::string cut = dir.file("cut.npz");
  write_all(cut, bytes.substr(0, bytes.find("bn.num_batches_tracked.npy") + 40));
  expect_npy_error(open(cut), {cut, "array bn.num_batches_tracked", "truncated"});
  write_all(cut, bytes.substr(0, bytes.size() - 30));
  expect_npy_error(open(cut), {cut, "array empty", "truncated"});
  // Not a zip, not NumPy at all.
  const std::string text = dir.file("data.npz");
  write_all(text, "x,y\n1,2\n");
  expect_npy_error(open(text), {text, "neither an .npz", "numpy.savez"});
  write_all(text, "");
  expect_npy_error(open(text), {text, "empty"});
  expect_npy_error(open(dir.file("missing.npz")), {"missing.npz", "does not exist"});
  expect_npy_error(open(dir.path().string()), {"is a directory"});
  // A member that is not .npy (wrong magic).
  const std::string magic = copy("magic.npz");
  patch(magic, "\x93NUMPY", "XNUMPY");
  expect_npy_error(open(magic), {magic, "array fc.weight", "is not a .npy array"});
  // Bad headers: fortran order, big-endian, object, unknown dtype, a broken dict.
  const std::string fortran = copy("fortran.npz");
  patch(fortran, "'fortran_order': False", "'fortran_order': True ");
  expect_npy_error(open(fortran), {fortran, "array fc.weight", "Fortran"});
  const std::string big = copy("big.npz");
  patch(big, "'<i4'", "'>i4'");
  expect_npy_error(open(big), {big, "array ids", "big-endian"});
  const std::string object = copy("object.npz");
  patch(object, "'<f4'", "'|O8'");
  expect_npy_error(open(object), {object, "array fc.weight", "Python objects"});
  const std::string complex = copy("complex.npz");
  patch(complex, "'<f4'", "'<c8'");
  expect_npy_error(open(complex), {complex, "array fc.weight", "'<c8'", "float32"});
  const std::string broken = copy("broken.npz");
  patch(broken, "'shape': (2, 3)", "'shape': [2, 3]");
  expect_npy_error(open(broken), {broken, "array fc.weight", "malformed"});
  const std::string extra = copy("extra.npz");
  patch(extra, "'shape': (2, 3), }", "'shape': (2, 3)1:}");
  expect_npy_error(open(extra), {extra, "array fc.weight", "malformed"});
  // A shape larger than the bytes that follow.
  const std::string large = copy("large.npz");
  patch(large, "'shape': (4,)", "'shape': (9,)");
  expect_npy_error(open(large), {large, "array ids", "(9,)", "truncated"});
  // A .npy cut short.
  const std::string npy = dir.file("t.npy");
  const std::string member = bytes.substr(bytes.find("\x93NUMPY"));
  write_all(npy, member.substr(0, 70));
  expect_npy_error(open(npy), {npy, "array t", "truncated"});
  write_all(npy, member.substr(0, 20));
  expect_npy_error(open(npy), {npy, "array t", "truncated"});
}

TEST(Npz, RefusesACorruptCompressedMember) {
  if (!have_numpy()) GTEST_SKIP() << "/usr/bin/python3 has no numpy to write a compressed archive";
  TempDir dir("npy");
  python(dir, "np.savez_compressed('" + dir.file("c.npz") + "', x_train=np.arange(5000, dtype=np.int32))\n");
  std::string s = read_all(dir.file("c.npz"));
  s[s.find("x_train.npy") + 11 + 20 + 100] ^= 0x55;  // a byte inside the deflate stream
  write_all(dir.file("c.npz"), s);
  expect_npy_error([&] { NpyFile::open(dir.file("c.npz")); }, {dir.file("c.npz"), "array x_train", "corrupt"});
}
