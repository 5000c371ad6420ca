// Token datasets and batches (DESIGN decision 1 and "Interfaces": Data).
//
// A TokenDataset holds a whole token file in memory as uint16 tokens and serves (B, T) batches
// of int32 tokens and targets (targets = tokens shifted by one). Four file layouts:
//   - a NumPy .npy array (io/npy.h; told by its magic "\x93NUMPY", whatever the name): one
//     1-d array of any integer dtype whose values are tokens 0..65535 (a value outside is
//     refused naming the array, the value and its index); vocab: the largest + 1. An .npz is
//     refused (a token model reads one array);
//   - text (any other file whose extension is not .bin): every byte is a token, vocab 256;
//   - nanoGPT .bin: a raw little-endian uint16 array, no header (the extension says so);
//   - llm.c .bin: a 256 x int32 header (magic 20240520, version 1, token count in header[2])
//     followed by that many uint16 tokens. A .bin file whose first int32 is the magic is read
//     this way; anything else with .bin is the raw layout.
//
// Split: of the n tokens, the last floor(n * val_fraction) are the validation split and the
// first n - floor(n * val_fraction) the training split. The split never depends on B, T or seed.
//
// Batch order, fixed by (seed, step) so every layout sees the same global batch:
//   - random: row i of step s is the window starting at
//       philox_u64(stream_key(seed, "data.train" | "data.val"), s * 2^24 + i) mod (n - T)
//     of its split (n = split length), so row i does not depend on B or on other rows and a
//     data-parallel rank can fill only its slice. Requires B <= 2^24 and n >= T + 1.
//   - sequential (llm.c's reader): batch k is tokens [p_k, p_k + B*T + 1) of the split, row i
//     the tokens [p_k + i*T, p_k + i*T + T] (targets shifted by one). Wrapping rule: llm.c
//     advances by B*T and goes back to 0 when the next batch would run past the end, so with
//     m = floor((n - 1) / (B*T)) whole batches per pass, p_k = (k mod m) * B*T. Requires m >= 1.
// Validation uses the same function with Split::val (the trainer evaluates steps 0..K-1 of the
// val split with a fixed seed, so the estimate is the same every time).
//
// Limits: tokens must fit uint16 (GPT-2's 50257 do); llm.c version 2 files (uint32 tokens) are
// refused; the whole file is read into memory (2 bytes per token; a .npy is converted to uint16
// from its mapping).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace meshtrain::train {

// ---- errors and enums ----

// A data file that cannot be used; the message names the file, the problem and what to do.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class Split { train, val };
enum class DataOrder { random, sequential };
// How a 4-d image array of an .npz lays out a sample (data/images.h): N x H x W x C or
// N x C x H x W; automatic: told from the shape where it is unambiguous (--data-layout).
enum class ImageLayout { automatic, nhwc, nchw };

const char* to_string(Split split);
const char* to_string(DataOrder order);
const char* to_string(ImageLayout layout);  // "automatic", "nhwc", "nchw"
// "random" or "sequential"; anything else throws std::invalid_argument with a sentence.
DataOrder parse_data_order(const std::string& text);
// "nhwc" or "nchw"; anything else throws std::invalid_argument with a sentence.
ImageLayout parse_image_layout(const std::string& text);

// ---- TokenDataset ----

class TokenDataset {
 public:
  enum class Format { text, nanogpt_bin, llmc_bin, npy };

  // Loads `path` (layout from the header comment) and splits it. `min_window` is the
  // smallest T the caller will ask for: each non-empty split must hold min_window + 1 tokens
  // (the training split always must). Throws DataError for a missing, empty, too short or
  // malformed file; std::invalid_argument for val_fraction outside [0, 1) or min_window < 1.
  static TokenDataset open(const std::string& path, double val_fraction = 0.1,
                           int64_t min_window = 1);

  // Builds a dataset from tokens in memory (tests, generated data); `name` stands for the path
  // in messages.
  static TokenDataset from_tokens(std::vector<uint16_t> tokens, double val_fraction = 0.1,
                                  std::string name = "<memory>");

  const std::string& path() const { return path_; }
  Format format() const { return format_; }
  // 256 for text; for .bin files the largest token + 1 (a model may use a larger vocab).
  int32_t vocab_size() const { return vocab_size_; }
  int64_t num_tokens(Split split) const;
  // The split's tokens, num_tokens(split) of them.
  const uint16_t* tokens(Split split) const;

  // Fills rows [row_begin, row_end) of the global (B, T) batch of `step`:
  // tokens and targets point at (row_end - row_begin, T) buffers. See the header comment for
  // the order. Throws DataError when the split is too short for one batch, and
  // std::invalid_argument for bad sizes or a negative step.
  void batch(Split split, DataOrder order, uint64_t seed, int64_t step, int64_t B, int64_t T,
             int64_t row_begin, int64_t row_end, int32_t* tokens, int32_t* targets) const;

  // Start of row `row` of `step` within its split (the window is [start, start + T]).
  int64_t window_start(Split split, DataOrder order, uint64_t seed, int64_t step, int64_t B,
                       int64_t T, int64_t row) const;

 private:
  void check_batch_args(Split split, DataOrder order, int64_t step, int64_t B, int64_t T) const;

  std::string path_;
  Format format_ = Format::text;
  std::vector<uint16_t> tokens_;  // (n,) train split first, then val
  int64_t n_train_ = 0;
  int32_t vocab_size_ = 0;
};

}  // namespace meshtrain::train
