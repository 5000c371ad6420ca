// Image data sets: opening the four IDX files or an .npz (images_npz.cpp), the epoch
// permutation, augmentation and batches. The layouts and the order are specified in images.h;
// this file only implements them.
#include "meshtrain/data/images.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "meshtrain/data/idx.h"
#include "meshtrain/io/npy.h"
#include "meshtrain/tensor/rng.h"

namespace meshtrain::train {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kRowBits = 24;   // augmentation counter: step * 2^24 + row
constexpr int64_t kMaxStep = int64_t{1} << 39;
constexpr int kFeistelRounds = 6;

constexpr const char* kFileNames[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                       "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};

const char* split_stream(Split split) {
  return split == Split::train ? "images.train.order" : "images.val.order";
}

// ---- locating the files ----

std::string resolve_directory(const std::string& spec) {
  std::error_code ec;
  if (spec == ImageDataset::kFashionMnist) {
    const std::string dir = ImageDataset::kFashionMnistDir;
    if (!fs::is_directory(dir, ec))
      throw DataError("data set fashion-mnist: " + dir +
                      " does not exist; install the Debian package dataset-fashion-mnist "
                      "(scripts/setup.sh does) or pass a directory holding the four IDX files");
    return dir;
  }
  if (!fs::exists(spec, ec))
    throw DataError("data directory " + spec +
                    " does not exist; pass fashion-mnist or a directory holding the four IDX "
                    "files of an image data set");
  if (!fs::is_directory(spec, ec))
    throw DataError("data directory " + spec +
                    " is not a directory; image data is a directory holding "
                    "train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte "
                    "and t10k-labels-idx1-ubyte (each may end in .gz), or an .npz holding x_train, y_train, x_test "
                    "and y_test (numpy.savez)");
  return spec;
}

// `name` or `name.gz` inside dir, the plain one first.
std::string find_file(const std::string& dir, const std::string& name) {
  std::error_code ec;
  for (const std::string& candidate : {name, name + ".gz"}) {
    const fs::path p = fs::path(dir) / candidate;
    if (fs::exists(p, ec)) return p.string();
  }
  throw DataError("data directory " + dir + " has neither " + name + " nor " + name +
                  ".gz; it must hold the four IDX files train-images-idx3-ubyte, "
                  "train-labels-idx1-ubyte, t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte "
                  "(each may end in .gz)");
}

// One split's images and labels, checked to pair one to one.
void check_pair(const IdxImages& images, const IdxLabels& labels) {
  const auto n_labels = static_cast<int64_t>(labels.labels.size());
  if (images.count != n_labels)
    throw DataError("data files " + images.path + " and " + labels.path + ": the first holds " +
                    std::to_string(images.count) + " images but the second " +
                    std::to_string(n_labels) +
                    " labels; an image file and its label file must pair one to one (check they "
                    "come from the same data set and split)");
  if (images.count == 0)
    throw DataError("data file " + images.path +
                    " holds no images; each split needs at least one");
  if (images.rows == 0 || images.cols == 0)
    throw DataError("data file " + images.path + " declares images of " +
                    std::to_string(images.rows) + " x " + std::to_string(images.cols) +
                    " pixels; an image needs at least one");
}

}  // namespace

// ---- the permutation ----

int64_t epoch_position(uint64_t key, int64_t n, int64_t k) {
  if (n < 1 || k < 0 || k >= n)
    throw std::invalid_argument("epoch_position needs 0 <= k < n, got k=" + std::to_string(k) +
                                " n=" + std::to_string(n));
  int bits = 2;
  while ((int64_t{1} << bits) < n) bits += 2;  // even, so both halves have bits/2
  const int half = bits / 2;
  const uint64_t mask = (uint64_t{1} << half) - 1;
  auto x = static_cast<uint64_t>(k);
  do {  // cycle walking: stays on the cycle through k, which returns below n
    uint64_t left = x >> half;
    uint64_t right = x & mask;
    for (int r = 0; r < kFeistelRounds; ++r) {
      const uint64_t f = philox_u64(key, (static_cast<uint64_t>(r) << 32) | right) & mask;
      const uint64_t next = left ^ f;
      left = right;
      right = next;
    }
    x = (left << half) | right;
  } while (x >= static_cast<uint64_t>(n));
  return static_cast<int64_t>(x);
}

// ---- opening ----

ImageDataset ImageDataset::open(const std::string& spec, ImageLayout layout) {
  std::error_code ec;
  // A NumPy file (told by its first bytes) is an .npz; any other file is refused as not a directory.
  if (spec != kFashionMnist && fs::is_regular_file(spec, ec) && io::looks_like_numpy(spec)) return open_npz(spec, layout);
  ImageDataset ds;
  ds.path_ = resolve_directory(spec);
  std::string files[4];
  for (int i = 0; i < 4; ++i) files[i] = find_file(ds.path_, kFileNames[i]);
  IdxImages train_images = read_idx_images(files[0]);
  IdxLabels train_labels = read_idx_labels(files[1], kClasses);
  check_pair(train_images, train_labels);
  IdxImages test_images = read_idx_images(files[2]);
  IdxLabels test_labels = read_idx_labels(files[3], kClasses);
  check_pair(test_images, test_labels);
  if (test_images.rows != train_images.rows || test_images.cols != train_images.cols)
    throw DataError("data files " + train_images.path + " and " + test_images.path +
                    " hold images of different sizes (" + std::to_string(train_images.rows) +
                    " x " + std::to_string(train_images.cols) + " and " +
                    std::to_string(test_images.rows) + " x " + std::to_string(test_images.cols) +
                    "); both splits must come from one data set");
  ds.height_ = train_images.rows;
  ds.width_ = train_images.cols;
  ds.stride_y_ = ds.width_;
  ds.train_.owned = std::move(train_images.pixels);
  ds.train_.labels.assign(train_labels.labels.begin(), train_labels.labels.end());
  ds.test_.owned = std::move(test_images.pixels);
  ds.test_.labels.assign(test_labels.labels.begin(), test_labels.labels.end());
  ds.mean_ = {kMean};
  ds.std_ = {kStd};
  ds.set_normalisation();
  return ds;
}

void ImageDataset::set_normalisation() {
  normalised_.assign(static_cast<size_t>(channels_), {});
  padding_.assign(static_cast<size_t>(channels_), 0.0f);
  for (size_t c = 0; c < normalised_.size(); ++c) {
    for (int v = 0; v < 256; ++v) normalised_[c][v] = (static_cast<float>(v) / 255.0f - mean_[c]) / std_[c];
    padding_[c] = float_pixels_ ? (0.0f - mean_[c]) / std_[c] : normalised_[c][0];
  }
}

int64_t ImageDataset::num_images(Split split) const {
  return static_cast<int64_t>(part(split).labels.size());
}

const uint8_t* ImageDataset::pixels(Split split) const {
  return float_pixels_ ? nullptr : reinterpret_cast<const uint8_t*>(part(split).pixels());
}

const int32_t* ImageDataset::labels(Split split) const { return part(split).labels.data(); }

// ---- order and augmentation ----

int64_t ImageDataset::image_index(Split split, DataOrder order, uint64_t seed, int64_t step,
                                  int64_t B, int64_t row) const {
  const int64_t n = num_images(split);
  const int64_t position = step * B + row;
  if (order == DataOrder::sequential) return position % n;
  const uint64_t epoch_key =
      philox_u64(stream_key(seed, split_stream(split)), static_cast<uint64_t>(position / n));
  return epoch_position(epoch_key, n, position % n);
}

Augmentation ImageDataset::augmentation(uint64_t seed, int64_t step, int64_t row) {
  const uint64_t bits = philox_u64(stream_key(seed, "images.augment"),
                                   (static_cast<uint64_t>(step) << kRowBits) +
                                       static_cast<uint64_t>(row));
  Augmentation a;
  a.dy = static_cast<int>((bits & 0xffff) % (2 * kPad + 1));
  a.dx = static_cast<int>(((bits >> 16) & 0xffff) % (2 * kPad + 1));
  a.flip = ((bits >> 32) & 1) != 0;
  return a;
}

void ImageDataset::write_image(const Part& p, int64_t index, const Augmentation& aug,
                               float* out) const {
  const int64_t elem = float_pixels_ ? 4 : 1;
  const std::byte* sample = p.pixels() + index * channels_ * height_ * width_ * elem;
  const int64_t shift_y = aug.dy - kPad;  // out(y, x) = src(y + shift_y, x + shift_x)
  const int64_t shift_x = aug.dx - kPad;
  const int64_t k = scale_, W = width_ * k;  // each source pixel a k x k square
  for (int64_t c = 0; c < channels_; ++c) {
    const std::byte* src = sample + c * stride_c_ * elem;
    const std::array<float, 256>& table = normalised_[static_cast<size_t>(c)];
    const float mean = mean_[static_cast<size_t>(c)], std = std_[static_cast<size_t>(c)];
    const float pad = padding_[static_cast<size_t>(c)];
    float* plane = out + c * height_ * k * W;
    for (int64_t y = 0; y < height_; ++y) {
      const int64_t sy = y + shift_y;
      float* row = plane + y * k * W;
      for (int64_t x = 0; x < width_; ++x) {
        const int64_t sx = (aug.flip ? width_ - 1 - x : x) + shift_x;
        float v = pad;
        if (sy >= 0 && sy < height_ && sx >= 0 && sx < width_) {
          const int64_t at = sy * stride_y_ + sx * stride_x_;
          if (float_pixels_) {
            float f;
            std::memcpy(&f, src + at * 4, 4);  // a mapped member may be unaligned (io/npy.h)
            v = (f - mean) / std;
          } else {
            v = table[static_cast<uint8_t>(src[at])];
          }
        }
        for (int64_t j = 0; j < k; ++j) row[x * k + j] = v;
      }
      for (int64_t i = 1; i < k; ++i) std::copy(row, row + W, row + i * W);
    }
  }
}

void ImageDataset::fit_to(const model::ModelSpec& spec, const std::string& flag) {
  const int64_t scale = spec.cnn() ? spec.cnn()->scale : 1;
  const Shape want = spec.sample_shape();
  const Shape files{channels(), height_, width_};
  if (want.size() != 3 || want[0] != files[0] || want[1] != files[1] * scale || want[2] != files[2] * scale) {
    std::string why = want.size() == 3 && scale == 1 && want[1] % files[1] == 0 && want[2] % files[2] == 0 &&
                              want[1] / files[1] == want[2] / files[2] && want[0] == files[0]
                          ? "; to train on them upsampled, give a config with \"scale\": " +
                                std::to_string(want[1] / files[1])
                          : "";
    if (!other_layout_.empty() && want.size() == 3 && other_layout_ == Shape{want[0], want[1] / scale, want[2] / scale})
      why = std::string("; read the other way they fit: give --data-layout ") + (layout_ == ImageLayout::nchw ? "nhwc" : "nchw");
    throw DataError("the images of " + flag + " " + path_ + arrays_note_ + " are " + shape_str(files) +
                    (scale > 1 ? " (" + shape_str({files[0], files[1] * scale, files[2] * scale}) + " at the config's " +
                                     "\"scale\": " + std::to_string(scale) + ")"
                               : std::string()) +
                    ", but " + spec.name() + " takes " + shape_str(want) +
                    (file_ ? " (channels, height, width); give arrays" : "; give a data set") + " of that size" + why);
  }
  if (file_) {  // an .npz: every label inside the model's classes
    for (Split split : {Split::train, Split::val}) {
      const std::vector<int32_t>& labels = part(split).labels;
      for (size_t i = 0; i < labels.size(); ++i)
        if (labels[i] >= spec.classes())
          throw DataError("the array " + std::string(split == Split::train ? "y_train" : "y_test") + " of " + flag +
                          " " + path_ + " holds the label " + std::to_string(labels[i]) + " at row " +
                          std::to_string(i) + ", outside the " + std::to_string(spec.classes()) + " classes of " +
                          spec.name() + " (0.." + std::to_string(spec.classes() - 1) +
                          "); give labels of that range or a model with more classes");
    }
    classes_ = static_cast<int32_t>(spec.classes());
  } else if (classes() != spec.classes()) {
    throw DataError("the images of " + flag + " " + path_ + " are in " + std::to_string(classes()) + " classes, but " +
                    spec.name() + " has " + std::to_string(spec.classes()) + "; give a data set of that many");
  }
  set_scale(scale);
}

void ImageDataset::set_scale(int64_t scale) {
  if (scale < 1 || scale > 16)
    throw std::invalid_argument("an image scale must be 1..16, got " + std::to_string(scale));
  scale_ = scale;
}

// ---- batches ----

namespace {

void check_rows(int64_t B, int64_t row_begin, int64_t row_end) {
  if (B < 1 || B > (int64_t{1} << kRowBits))
    throw std::invalid_argument("image batches hold 1..2^24 rows, got B=" + std::to_string(B));
  if (row_begin < 0 || row_end > B || row_begin > row_end)
    throw std::invalid_argument("rows [" + std::to_string(row_begin) + ", " +
                                std::to_string(row_end) + ") are not inside a batch of B=" +
                                std::to_string(B));
}

}  // namespace

void ImageDataset::batch(Split split, DataOrder order, uint64_t seed, int64_t step, int64_t B,
                         int64_t row_begin, int64_t row_end, float* images, int32_t* labels,
                         bool augment) const {
  check_rows(B, row_begin, row_end);
  if (step < 0 || step >= kMaxStep)
    throw std::invalid_argument("step must be in 0..2^39-1, got " + std::to_string(step));
  const Part& p = part(split);
  const int64_t pixels = channels_ * height() * width();  // floats a row
  for (int64_t r = row_begin; r < row_end; ++r) {
    const int64_t index = image_index(split, order, seed, step, B, r);
    const Augmentation aug = augment ? augmentation(seed, step, r) : Augmentation{kPad, kPad, false};
    write_image(p, index, aug, images + (r - row_begin) * pixels);
    labels[r - row_begin] = p.labels[static_cast<size_t>(index)];
  }
}

int64_t ImageDataset::num_eval_batches(Split split, int64_t B) const {
  if (B < 1) throw std::invalid_argument("batch size must be positive, got B=" + std::to_string(B));
  return (num_images(split) + B - 1) / B;
}

int64_t ImageDataset::eval_batch(Split split, int64_t j, int64_t B, int64_t row_begin,
                                 int64_t row_end, float* images, int32_t* labels) const {
  check_rows(B, row_begin, row_end);
  const int64_t batches = num_eval_batches(split, B);
  if (j < 0 || j >= batches)
    throw std::invalid_argument("evaluation batch " + std::to_string(j) + " is outside 0.." +
                                std::to_string(batches - 1) + " for B=" + std::to_string(B) +
                                " over the " + to_string(split) + " split's " +
                                std::to_string(num_images(split)) + " images");
  const Part& p = part(split);
  const int64_t pixels = channels_ * height() * width();  // floats a row
  const int64_t n = num_images(split);
  int64_t real = 0;
  for (int64_t r = row_begin; r < row_end; ++r) {
    float* out = images + (r - row_begin) * pixels;
    const int64_t index = j * B + r;
    if (index < n) {
      write_image(p, index, Augmentation{kPad, kPad, false}, out);
      labels[r - row_begin] = p.labels[static_cast<size_t>(index)];
      ++real;
    } else {
      std::fill(out, out + pixels, 0.0f);
      labels[r - row_begin] = -1;
    }
  }
  return real;
}

}  // namespace meshtrain::train
