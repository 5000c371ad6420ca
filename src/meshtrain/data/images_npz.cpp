// Image data sets from an .npz (x_train, y_train, x_test, y_test): checking the arrays, telling
// the layout, the per-channel statistics. What is accepted and how it is normalised is specified
// in images.h; this file only implements it.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "meshtrain/data/images.h"
#include "meshtrain/io/npy.h"

namespace meshtrain::train {

namespace {

const std::string kExpected =
    "image data as an .npz holds x_train, y_train, x_test and y_test, the names keras.datasets returns: "
    "numpy.savez(\"d.npz\", x_train=..., y_train=..., x_test=..., y_test=...)";

// Where an array is, for messages: "the array x_train of d.npz".
std::string array_in(const std::string& name, const std::string& path) { return "the array " + name + " of " + path; }

struct Geometry {
  ImageLayout layout = ImageLayout::automatic;  // automatic: a 3-d array (N x H x W)
  int64_t c = 1, h = 0, w = 0;
};

// The layout and sizes of x_train (header comment of images.h for the rule).
Geometry geometry(const io::NpyArray& x, const std::string& path, ImageLayout layout) {
  Geometry g;
  const auto& s = x.shape;
  if (s.size() == 3) {
    g.h = s[1], g.w = s[2];
    return g;
  }
  if (s.size() != 4)
    throw DataError(array_in(x.name, path) + " has the shape " + x.shape_str() +
                    "; images are N x H x W (one channel), N x H x W x C or N x C x H x W");
  const bool c1 = s[1] <= 4, c3 = s[3] <= 4;
  g.layout = layout;
  if (layout == ImageLayout::automatic) {
    if (c1 == c3)
      throw DataError(array_in(x.name, path) + " has the shape " + x.shape_str() + ": " +
                      (c1 ? "dims 1 and 3 could both be channels" : "neither dim 1 nor dim 3 looks like channels (at most 4)") +
                      "; say which with --data-layout nhwc (N x H x W x C) or --data-layout nchw (N x C x H x W)");
    g.layout = c3 ? ImageLayout::nhwc : ImageLayout::nchw;
  }
  if (g.layout == ImageLayout::nhwc)
    g.c = s[3], g.h = s[1], g.w = s[2];
  else
    g.c = s[1], g.h = s[2], g.w = s[3];
  return g;
}

const io::NpyArray& need_array(const io::NpyFile& f, const std::string& name) {
  const io::NpyArray* a = f.find(name);
  if (!a)
    throw DataError("the .npz " + f.path() + " has no array " + name + " (it holds " + f.names() + "); " + kExpected);
  return *a;
}

// Labels as int32, one per image: shape (n,) or (n, 1), integers >= 0.
std::vector<int32_t> read_labels(const io::NpyArray& y, int64_t n, const std::string& x_name, const std::string& path) {
  if (!io::npy_is_integer(y.type))
    throw DataError(array_in(y.name, path) + " is " + io::to_string(y.type) +
                    "; labels are integer class indices (y.astype(numpy.int64))");
  const bool column = y.shape.size() == 2 && y.shape[1] == 1;
  if ((y.shape.size() != 1 && !column) || y.shape[0] != n)
    throw DataError(array_in(y.name, path) + " has the shape " + y.shape_str() + ", but " + x_name + " holds " +
                    std::to_string(n) + " images: give one label per image, shape (" + std::to_string(n) + ",)");
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = y.integer_at(i, path);
    if (v < 0 || v > 0x7fffffff)
      throw DataError(array_in(y.name, path) + " holds the label " + std::to_string(v) + " at row " + std::to_string(i) +
                      "; labels are class indices 0, 1, ... (the model's classes - 1 at most)");
    out[static_cast<size_t>(i)] = static_cast<int32_t>(v);
  }
  return out;
}

std::string floats(const std::vector<float>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%s%.4f", i ? ", " : "", static_cast<double>(v[i]));
    s += buf;
  }
  return s + "]";
}

}  // namespace

ImageDataset ImageDataset::open_npz(const std::string& path, ImageLayout layout) {
  ImageDataset ds;
  ds.path_ = path;
  try {
    ds.file_ = io::NpyFile::open(path);
  } catch (const io::NpyError& e) {
    throw DataError(std::string(e.what()) + "; " + kExpected);
  }
  const io::NpyFile& f = *ds.file_;
  if (!f.is_npz())
    throw DataError("--data " + path + " is a single .npy array, not an .npz; " + kExpected);
  const io::NpyArray& x_train = need_array(f, kArrays[0]);
  const io::NpyArray& y_train = need_array(f, kArrays[1]);
  const io::NpyArray& x_test = need_array(f, kArrays[2]);
  const io::NpyArray& y_test = need_array(f, kArrays[3]);
  if (x_train.type != io::NpyType::u8 && x_train.type != io::NpyType::f32)
    throw DataError(array_in(x_train.name, path) + " is " + io::to_string(x_train.type) +
                    "; images are uint8 (0..255) or float32 (x.astype(numpy.float32))");
  const Geometry g = geometry(x_train, path, layout);
  if (x_test.type != x_train.type)
    throw DataError(array_in(x_test.name, path) + " is " + io::to_string(x_test.type) + " but x_train is " +
                    io::to_string(x_train.type) + "; give both splits one dtype");
  if (x_test.shape.size() != x_train.shape.size() ||
      !std::equal(x_test.shape.begin() + 1, x_test.shape.end(), x_train.shape.begin() + 1))
    throw DataError(array_in(x_test.name, path) + " has the shape " + x_test.shape_str() + " but x_train " +
                    x_train.shape_str() + "; test images must be the training images' size and layout");
  for (const io::NpyArray* x : {&x_train, &x_test})
    if (x->shape[0] == 0)
      throw DataError(array_in(x->name, path) + " holds no images (shape " + x->shape_str() +
                      "); each split needs at least one");
  if (g.c == 0 || g.h == 0 || g.w == 0)
    throw DataError(array_in(x_train.name, path) + " has the shape " + x_train.shape_str() +
                    ": an image needs at least one pixel and one channel");
  ds.channels_ = g.c, ds.height_ = g.h, ds.width_ = g.w;
  ds.layout_ = g.layout;
  ds.float_pixels_ = x_train.type == io::NpyType::f32;
  if (g.layout == ImageLayout::nhwc)
    ds.stride_c_ = 1, ds.stride_y_ = g.w * g.c, ds.stride_x_ = g.c;
  else
    ds.stride_c_ = g.h * g.w, ds.stride_y_ = g.w, ds.stride_x_ = 1;
  if (g.layout != ImageLayout::automatic) {
    const auto& s = x_train.shape;
    ds.other_layout_ = g.layout == ImageLayout::nhwc ? Shape{s[1], s[2], s[3]} : Shape{s[3], s[1], s[2]};
  }
  ds.train_.stored = x_train.data;
  ds.test_.stored = x_test.data;
  ds.train_.labels = read_labels(y_train, x_train.shape[0], x_train.name, path);
  ds.test_.labels = read_labels(y_test, x_test.shape[0], x_test.name, path);
  int32_t largest = 0;
  for (int32_t v : ds.train_.labels) largest = std::max(largest, v);
  for (int32_t v : ds.test_.labels) largest = std::max(largest, v);
  ds.classes_ = largest + 1;

  // Per-channel statistics of x_train, in double (images.h): uint8 through a histogram of each
  // channel's 256 values, float32 in two passes (mean, then squared deviations).
  const int64_t n = x_train.shape[0], C = g.c, HW = g.h * g.w;
  ds.mean_.assign(static_cast<size_t>(C), 0.0f);
  ds.std_.assign(static_cast<size_t>(C), 1.0f);
  for (int64_t c = 0; c < C; ++c) {
    double mean = 0, var = 0;
    const double count = static_cast<double>(n * HW);
    if (!ds.float_pixels_) {
      std::vector<int64_t> hist(256, 0);
      const auto* p = reinterpret_cast<const uint8_t*>(x_train.data);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t y = 0; y < g.h; ++y)
          for (int64_t x = 0; x < g.w; ++x) ++hist[p[i * C * HW + c * ds.stride_c_ + y * ds.stride_y_ + x * ds.stride_x_]];
      for (int v = 0; v < 256; ++v) mean += static_cast<double>(hist[static_cast<size_t>(v)]) * (v / 255.0);
      mean /= count;
      for (int v = 0; v < 256; ++v) var += static_cast<double>(hist[static_cast<size_t>(v)]) * (v / 255.0 - mean) * (v / 255.0 - mean);
    } else {
      auto value = [&](int64_t i, int64_t y, int64_t x) {
        return static_cast<double>(x_train.at<float>(i * C * HW + c * ds.stride_c_ + y * ds.stride_y_ + x * ds.stride_x_));
      };
      for (int64_t i = 0; i < n; ++i)
        for (int64_t y = 0; y < g.h; ++y)
          for (int64_t x = 0; x < g.w; ++x) {
            const double v = value(i, y, x);
            if (!std::isfinite(v))
              throw DataError(array_in(x_train.name, path) + " holds " + std::to_string(v) + " in image " +
                              std::to_string(i) + " (channel " + std::to_string(c) + ", row " + std::to_string(y) +
                              ", column " + std::to_string(x) + "); images must be finite numbers");
            mean += v;
          }
      mean /= count;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t y = 0; y < g.h; ++y)
          for (int64_t x = 0; x < g.w; ++x) var += (value(i, y, x) - mean) * (value(i, y, x) - mean);
    }
    const double sd = std::sqrt(var / count);
    ds.mean_[static_cast<size_t>(c)] = static_cast<float>(mean);
    if (sd > 0) ds.std_[static_cast<size_t>(c)] = static_cast<float>(sd);
  }
  if (ds.float_pixels_) {  // x_test too must be finite (x_train was checked above)
    for (int64_t i = 0; i < x_test.numel(); ++i)
      if (!std::isfinite(x_test.at<float>(i)))
        throw DataError(array_in(x_test.name, path) + " holds " + std::to_string(x_test.at<float>(i)) +
                        " at flat index " + std::to_string(i) + "; images must be finite numbers");
  }
  ds.set_normalisation();

  const std::string layout_name = g.layout == ImageLayout::nhwc   ? "NHWC"
                                  : g.layout == ImageLayout::nchw ? "NCHW"
                                                                  : "NHW";
  ds.arrays_note_ = " (arrays x_train and x_test, read as " + layout_name + ")";
  ds.describe_ = "data: x_train " + std::to_string(n) + " x " + std::to_string(C) + " x " + std::to_string(g.h) +
                 " x " + std::to_string(g.w) + " " + io::to_string(x_train.type) + " (" + layout_name + "), mean " +
                 floats(ds.mean_) + " std " + floats(ds.std_) + "; x_test " + std::to_string(x_test.shape[0]);
  return ds;
}

}  // namespace meshtrain::train
