// Image classification data sets and their batches: Fashion-MNIST, or a user's own arrays in
// an .npz (DESIGN decision 1 and "Interfaces": Data, for the convolutional networks).
//
// An ImageDataset holds a training and a test set of images with one label each, from one of:
//   - four IDX files (data/idx.h) in one directory, grey uint8 images (one byte a pixel:
//     Fashion-MNIST's 70,000 images of 28x28 take 55 MB):
//       train-images-idx3-ubyte  train-labels-idx1-ubyte  t10k-images-idx3-ubyte  t10k-labels-idx1-ubyte
//     each plain or gzip-compressed (with or without ".gz" in the name; when both names exist the
//     plain file is read). The spec `fashion-mnist` names the directory where Debian's package
//     dataset-fashion-mnist installs them, /usr/share/datasets/fashion-mnist (scripts/setup.sh
//     installs it); any other directory is read the same way (write ./fashion-mnist for a local
//     folder of that name).
//   - a NumPy .npz file (io/npy.h; a file that starts as NumPy's do) holding the arrays
//     x_train, y_train, x_test, y_test (the names keras.datasets returns). Images are uint8 or
//     float32, N x H x W (one channel), N x H x W x C or N x C x H x W; a 4-d array is read NHWC
//     when only its dim 3 is at most 4, NCHW when only its dim 1 is, and otherwise (both or
//     neither) only with an explicit layout (--data-layout nhwc|nchw; also accepted where the
//     shape is plain). x_test has x_train's dtype and sample shape. Labels: any integer dtype,
//     shape (N,) or (N, 1) (keras' CIFAR), N the images', values 0 .. the model's classes - 1
//     (checked by fit_to, which knows the model). Images are read where the file holds them: a
//     stored member straight from the mapping (uint8 stays one byte a pixel, nothing copied), a
//     savez_compressed member from its one inflated copy; labels are copied (int32).
//
// Splits: the published ones, never re-cut. Split::train is the training set (60,000 images),
// Split::val the test set (t10k, 10,000). The test set plays the validation split because that is
// the split the trainer evaluates: one enum for token and image data keeps one evaluation path,
// and no hold-out is carved from the training set, so results compare with published ones.
//
// Layouts: images are served as float32 (rows, channels, height, width), NCHW, normalised per
// channel c to (x - mean_c) / std_c; labels as int32 (rows,) in 0..classes()-1. IDX files:
// x = pixel/255 and Fashion-MNIST's published mean 0.2860 and std 0.3530 (kMean, kStd), whatever
// directory is read. An .npz: x = pixel/255 for uint8 images, the value as given for float32
// ones, and mean_c, std_c those of x over every pixel of channel c of x_train (the population
// standard deviation, numpy's x.std(); a constant channel takes std 1), computed in double and
// rounded to float; x_test is normalised with x_train's statistics. describe() prints them.
//
// Training order, fixed by (order, seed, step, B) so every layout sees the same global batch.
// DataOrder::random (the default) visits the images epoch by epoch, each epoch a permutation of
// the split; DataOrder::sequential reads them in file order, so another framework can replay
// the exact batches from the IDX files alone:
//   sequential: row i of step s is image (s*B + i) mod n of the split (n = split size), every
//   epoch in file order, a batch that straddles the end wrapping to image 0. The seed is unused.
//   random: row i of step s
//   is position p = s*B + i of that sequence: epoch e = p / n, image perm_{seed,e}(p mod n)
//   (n = split size). perm is a keyed Feistel permutation with cycle walking (epoch_position),
//   a pure function of (seed, split, e, position): any rank computes any row alone, in O(1),
//   without building or sharing the permutation, and every image appears once per epoch.
//   Epochs need not align with batches: a batch that straddles an epoch end takes its first
//   rows from epoch e and the rest from epoch e+1.
// Augmentation (optional, for training; the trainer refuses it with the sequential order, whose
// point is batches another reader can rebuild without meshtrain's draws): row i of step s is cropped from the image padded by
// kPad = 2 zero pixels on each side (zero: raw pixel 0 (x = 0), the background, before normalisation,
// as torchvision's RandomCrop(28, padding=2) before Normalize) at offsets dy, dx in 0..4, then
// mirrored left-right with probability 1/2. The draw is philox_u64(stream_key(seed,
// "images.augment"), s * 2^24 + i): keyed by the global row, so a data-parallel rank filling
// rows r0..r1 gets exactly the single-rank batch's rows.
// Evaluation order: batch j holds images j*B .. j*B+B-1 of the split, no augmentation. The last
// batch keeps its B rows: rows past the end are padding, zero images (the mean after
// normalisation) with label -1, which the cross-entropy kernel ignores; eval_batch returns how
// many of the requested rows are real, so an average divides by the real count and every rank
// keeps the batch shape.
//
// Concurrency: a dataset is immutable after open(); batch() and eval_batch() are const and keep
// no state, so rank threads may share one dataset.
// Limits: IDX directories are grey uint8 images of 10 classes; the normalisation constants of an
// IDX directory are Fashion-MNIST's whatever it holds; a float32 image holding NaN or infinity is
// refused; the .npz must not be rewritten in place while it is read (its pages are mapped);
// B <= 2^24 and step < 2^39 (the augmentation counter).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/data/data.h"
#include "meshtrain/model/spec.h"

namespace meshtrain::io {
class NpyFile;
}

namespace meshtrain::train {

// ---- the permutation and the augmentation draw (exposed for tests and other readers) ----

// Position k (0 <= k < n) of a pseudo-random permutation of 0..n-1 chosen by `key`: a 6-round
// Feistel network on the smallest even number of bits covering n, applied again while the
// value lands at n or above (cycle walking; under 4 applications on average). Pure, O(1).
int64_t epoch_position(uint64_t key, int64_t n, int64_t k);

struct Augmentation {
  int dy = 0;         // crop offset in the padded image, 0..2*kPad (kPad: no shift)
  int dx = 0;
  bool flip = false;  // mirror left-right after the crop
};

// ---- ImageDataset ----

class ImageDataset {
 public:
  static constexpr const char* kFashionMnist = "fashion-mnist";
  static constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
  static constexpr float kMean = 0.2860f;  // of x/255 over Fashion-MNIST's training pixels
  static constexpr float kStd = 0.3530f;
  static constexpr int kPad = 2;           // augmentation: zero padding before the crop
  static constexpr int32_t kClasses = 10;

  // The arrays an .npz must hold (keras.datasets' names).
  static constexpr const char* kArrays[4] = {"x_train", "y_train", "x_test", "y_test"};

  // Opens `spec`: "fashion-mnist", a directory of IDX files or an .npz file (header comment);
  // `layout` reads 4-d .npz images (automatic: from the shape). Throws DataError with one
  // sentence naming the directory, file or array and the problem: a missing directory or
  // package, a directory lacking one of the four files, any refusal of the IDX reader (wrong
  // magic, sizes, truncated gzip, a label outside 0..9), image and label counts that differ, a
  // split with no images, or training and test images of different sizes; for an .npz, any
  // refusal of the NumPy reader (a file that is not NumPy's), a missing array (naming the four),
  // images that are not uint8 or float32 or not 3-d or 4-d, an ambiguous 4-d shape without a
  // layout, labels that are not integers or not one per image, a negative label, a float32
  // pixel that is not finite.
  static ImageDataset open(const std::string& spec, ImageLayout layout = ImageLayout::automatic);

  // The directory or file read.
  const std::string& path() const { return path_; }
  int64_t channels() const { return channels_; }
  // The size of the images batches hold: the files' times the scale.
  int64_t height() const { return height_ * scale_; }
  int64_t width() const { return width_ * scale_; }
  // Batches hold the images upsampled `scale` times in each direction (nearest neighbour: each
  // pixel a scale x scale square; augmentation shifts in the files' pixels), for models that
  // take larger inputs (a CNN config's "scale"). 1: as read.
  void set_scale(int64_t scale);
  int64_t scale() const { return scale_; }
  // IDX: 10. An .npz: the largest label + 1 until fit_to sets the model's classes.
  int32_t classes() const { return classes_; }
  int64_t num_images(Split split) const;
  // The split's pixels as stored, when they are uint8 (nullptr for float32 images): IDX
  // (num_images, height, width); an .npz in its own layout. Labels (num_images,).
  const uint8_t* pixels(Split split) const;
  const int32_t* labels(Split split) const;
  // The normalisation of each channel: x -> (x - mean[c]) / std[c] (header comment).
  const std::vector<float>& mean() const { return mean_; }
  const std::vector<float>& std_dev() const { return std_; }
  // An .npz's arrays and statistics in one line ("data: x_train 50000 x 3 x 32 x 32 uint8
  // (NHWC), mean [...] std [...]; x_test 10000"); empty for IDX files.
  const std::string& describe() const { return describe_; }

  // Index within the split of the image in row `row` of training batch `step` (header comment).
  int64_t image_index(Split split, DataOrder order, uint64_t seed, int64_t step, int64_t B,
                      int64_t row) const;
  // The augmentation of row `row` of step `step` under `seed`.
  static Augmentation augmentation(uint64_t seed, int64_t step, int64_t row);

  // Fills rows [row_begin, row_end) of the global training batch of `step` (B rows):
  // images points at (row_end - row_begin, channels, height, width) floats, labels at
  // (row_end - row_begin) int32. Throws std::invalid_argument for B outside 1..2^24, a step
  // outside 0..2^39-1 or rows outside [0, B).
  void batch(Split split, DataOrder order, uint64_t seed, int64_t step, int64_t B,
             int64_t row_begin, int64_t row_end, float* images, int32_t* labels,
             bool augment) const;

  // Sets the scale `spec` asks for (a CNN config's "scale"; 1 otherwise) and refuses, with
  // DataError naming `flag`, the data (an .npz's array) and both shapes, images that are then
  // not the model's input (an image is never resized to fit), IDX labels of another number of
  // classes, or an .npz label outside the model's classes (naming the array, the value and its
  // row). An .npz then has the model's classes.
  void fit_to(const model::ModelSpec& spec, const std::string& flag);

  // Evaluation batches in order: ceil(num_images / B) of them.
  int64_t num_eval_batches(Split split, int64_t B) const;
  // Fills rows [row_begin, row_end) of evaluation batch j (layouts as batch(); rows past the
  // split's end are padding: zero images, label -1) and returns how many of them are real
  // images. Throws std::invalid_argument for j outside 0..num_eval_batches-1 or bad rows.
  int64_t eval_batch(Split split, int64_t j, int64_t B, int64_t row_begin, int64_t row_end,
                     float* images, int32_t* labels) const;

 private:
  struct Part {
    std::vector<uint8_t> owned;            // IDX: (n, height, width)
    const std::byte* stored = nullptr;     // .npz: the array in file_ (maybe unaligned)
    std::vector<int32_t> labels;           // (n,)
    const std::byte* pixels() const {
      return stored ? stored : reinterpret_cast<const std::byte*>(owned.data());
    }
  };
  static ImageDataset open_npz(const std::string& path, ImageLayout layout);
  const Part& part(Split split) const { return split == Split::train ? train_ : test_; }
  // Writes image `index` of the split to out (channels, height, width), cropped and flipped as `aug`.
  void write_image(const Part& p, int64_t index, const Augmentation& aug, float* out) const;
  // Sets the normalisation (normalised_, padding_) from mean_ and std_.
  void set_normalisation();

  std::string path_;
  std::shared_ptr<const io::NpyFile> file_;  // an .npz: keeps the arrays' memory alive
  Part train_;
  Part test_;
  int64_t channels_ = 1;
  int64_t height_ = 0;  // of the files' images
  int64_t width_ = 0;
  bool float_pixels_ = false;  // float32 images (else uint8)
  ImageLayout layout_ = ImageLayout::automatic;  // an .npz's 4-d images: how they were read
  // Element strides of a stored image: channel, row, column (a sample is channels*height*width).
  int64_t stride_c_ = 0, stride_y_ = 0, stride_x_ = 1;
  int64_t scale_ = 1;
  int32_t classes_ = kClasses;
  std::vector<float> mean_, std_;                    // per channel
  std::vector<std::array<float, 256>> normalised_;  // uint8: per channel, pixel -> (x/255 - mean) / std
  std::vector<float> padding_;                       // per channel: a raw 0 normalised
  std::string describe_;
  std::string arrays_note_;  // an .npz: " (arrays x_train, x_test, read as NHWC)", for messages
  Shape other_layout_;       // an .npz of 4-d images: C, H, W read in the other layout (messages)
};

}  // namespace meshtrain::train
