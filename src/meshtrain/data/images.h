// Image classification data sets and their batches: Fashion-MNIST (DESIGN decision 1 and
// "Interfaces": Data, for the convolutional networks).
//
// An ImageDataset holds a training and a test set of grey images as uint8 (one byte a pixel:
// Fashion-MNIST's 70,000 images of 28x28 take 55 MB) with one label each, read from four IDX
// files (data/idx.h) in one directory:
//     train-images-idx3-ubyte  train-labels-idx1-ubyte  t10k-images-idx3-ubyte  t10k-labels-idx1-ubyte
// each plain or gzip-compressed (with or without ".gz" in the name; when both names exist the
// plain file is read). The spec `fashion-mnist` names the directory where Debian's package
// dataset-fashion-mnist installs them, /usr/share/datasets/fashion-mnist (scripts/setup.sh
// installs it); anything else is a directory path (write ./fashion-mnist for a local folder of
// that name).
//
// Splits: the published ones, never re-cut. Split::train is the training set (60,000 images),
// Split::val the test set (t10k, 10,000). The test set plays the validation split because that is
// the split the trainer evaluates: one enum for token and image data keeps one evaluation path,
// and no hold-out is carved from the training set, so results compare with published ones.
//
// Layouts: images are served as float32 (rows, channels, height, width) = (rows, 1, 28, 28),
// NCHW, normalised to (x/255 - kMean) / kStd with Fashion-MNIST's mean 0.2860 and std 0.3530;
// labels as int32 (rows,) in 0..classes()-1.
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
// kPad = 2 zero pixels on each side (zero: raw pixel 0, the background, before normalisation,
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
// Limits: one channel (grey images), uint8 pixels, at most 256 classes (fixed at 10 by open());
// the normalisation constants are Fashion-MNIST's whatever directory is read; B <= 2^24 and
// step < 2^39 (the augmentation counter).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/data/data.h"
#include "meshtrain/model/spec.h"

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

  // Opens `spec`: "fashion-mnist" or a directory (header comment). Throws DataError with one
  // sentence naming the directory or file and the problem: a missing directory or package, a
  // directory lacking one of the four files, any refusal of the IDX reader (wrong magic, sizes,
  // truncated gzip, a label outside 0..9), image and label counts that differ, a split with no
  // images, or training and test images of different sizes.
  static ImageDataset open(const std::string& spec);

  // The directory read.
  const std::string& path() const { return path_; }
  int64_t channels() const { return 1; }
  // The size of the images batches hold: the files' times the scale.
  int64_t height() const { return height_ * scale_; }
  int64_t width() const { return width_ * scale_; }
  // Batches hold the images upsampled `scale` times in each direction (nearest neighbour: each
  // pixel a scale x scale square; augmentation shifts in the files' pixels), for models that
  // take larger inputs (a CNN config's "scale"). 1: as read.
  void set_scale(int64_t scale);
  int64_t scale() const { return scale_; }
  int32_t classes() const { return classes_; }
  int64_t num_images(Split split) const;
  // The split's pixels (num_images, height, width), as read, and labels (num_images,).
  const uint8_t* pixels(Split split) const;
  const uint8_t* labels(Split split) const;

  // Index within the split of the image in row `row` of training batch `step` (header comment).
  int64_t image_index(Split split, DataOrder order, uint64_t seed, int64_t step, int64_t B,
                      int64_t row) const;
  // The augmentation of row `row` of step `step` under `seed`.
  static Augmentation augmentation(uint64_t seed, int64_t step, int64_t row);

  // Fills rows [row_begin, row_end) of the global training batch of `step` (B rows):
  // images points at (row_end - row_begin, 1, height, width) floats, labels at
  // (row_end - row_begin) int32. Throws std::invalid_argument for B outside 1..2^24, a step
  // outside 0..2^39-1 or rows outside [0, B).
  void batch(Split split, DataOrder order, uint64_t seed, int64_t step, int64_t B,
             int64_t row_begin, int64_t row_end, float* images, int32_t* labels,
             bool augment) const;

  // Sets the scale `spec` asks for (a CNN config's "scale"; 1 otherwise) and refuses, with
  // DataError naming `flag`, the data and both sizes, images that are then not the model's
  // input, or labels of another number of classes: an image is never resized to fit.
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
    std::vector<uint8_t> pixels;  // (n, height, width)
    std::vector<uint8_t> labels;  // (n,)
  };
  const Part& part(Split split) const { return split == Split::train ? train_ : test_; }
  // Writes image `index` of the split to out (1, height, width), cropped and flipped as `aug`.
  void write_image(const Part& p, int64_t index, const Augmentation& aug, float* out) const;

  std::string path_;
  Part train_;
  Part test_;
  int64_t height_ = 0;  // of the files' images
  int64_t width_ = 0;
  int64_t scale_ = 1;
  int32_t classes_ = kClasses;
  std::array<float, 256> normalised_{};  // pixel value -> (x/255 - kMean) / kStd
};

}  // namespace meshtrain::train
