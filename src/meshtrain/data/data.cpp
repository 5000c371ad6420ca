// Token datasets: file loading (text, nanoGPT .bin, llm.c .bin), the split and the batch order.
// The layouts and the order are specified in data.h; this file only implements them.
#include "meshtrain/data/data.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "meshtrain/io/npy.h"
#include "meshtrain/tensor/rng.h"

namespace meshtrain::train {

static_assert(std::endian::native == std::endian::little,
              "token files are little-endian; a big-endian host needs byte swapping here");

namespace {

constexpr int32_t kLlmcMagic = 20240520;
constexpr int64_t kLlmcHeaderInts = 256;
constexpr int64_t kLlmcHeaderBytes = kLlmcHeaderInts * 4;
constexpr uint64_t kRowBits = 24;  // random order: index = step * 2^24 + row

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw DataError("data file " + path + ": " + what);
}

bool has_bin_extension(const std::string& path) {
  return std::filesystem::path(path).extension() == ".bin";
}

// An opened, non-empty data file; tokens are read straight into their final vector so a
// .bin file costs its size once (a text file twice: bytes, then uint16 tokens).
struct InFile {
  std::ifstream in;
  int64_t size = 0;
};

InFile open_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    fail(path, "does not exist; check the --data path (a text file or a uint16 .bin token file)");
  if (std::filesystem::is_directory(path, ec))
    fail(path, "is a directory; pass a text file or a uint16 .bin token file");
  // A FIFO would block the open forever, and a device such as /dev/zero has no end: only a
  // regular file (or a link to one) is read.
  if (!std::filesystem::is_regular_file(path, ec))
    fail(path, "is not a regular file (a pipe, socket or device); save the tokens to a file and pass that");
  InFile f{std::ifstream(path, std::ios::binary), 0};
  if (!f.in) fail(path, "cannot be opened for reading (" + std::string(std::strerror(errno)) +
                            "); check its permissions");
  f.in.seekg(0, std::ios::end);
  f.size = static_cast<int64_t>(f.in.tellg());
  if (f.size <= 0) fail(path, "is empty; it must hold at least a few tokens");
  return f;
}

void read_at(InFile& f, const std::string& path, int64_t offset, void* dst, int64_t n) {
  f.in.seekg(offset, std::ios::beg);
  if (n > 0 && !f.in.read(static_cast<char*>(dst), n)) fail(path, "could not be read completely");
}

std::vector<uint16_t> read_llmc(InFile& f, const std::string& path) {
  if (f.size < kLlmcHeaderBytes)
    fail(path, "starts with the llm.c magic 20240520 but is only " + std::to_string(f.size) +
                   " bytes, shorter than its 1024-byte header; the file is truncated, "
                   "regenerate it");
  int32_t header[kLlmcHeaderInts];
  read_at(f, path, 0, header, kLlmcHeaderBytes);
  if (header[1] != 1)
    fail(path, "has llm.c header version " + std::to_string(header[1]) +
                   ", only version 1 (uint16 tokens) is supported; re-export it with uint16 tokens");
  const int64_t count = header[2];
  const int64_t payload = f.size - kLlmcHeaderBytes;
  if (count < 0 || count * 2 != payload)
    fail(path, "has a malformed llm.c header: it records " + std::to_string(count) +
                   " tokens (" + std::to_string(count * 2) + " bytes) but " +
                   std::to_string(payload) +
                   " bytes follow the header; the file is truncated or corrupt, regenerate it");
  std::vector<uint16_t> tokens(static_cast<size_t>(count));
  read_at(f, path, kLlmcHeaderBytes, tokens.data(), count * 2);
  return tokens;
}

// A .npy of token ids: one 1-d integer array, every value a uint16.
std::vector<uint16_t> read_npy_tokens(const std::string& path) {
  std::shared_ptr<const io::NpyFile> f;
  try {
    f = io::NpyFile::open(path);
  } catch (const io::NpyError& e) {
    throw DataError(std::string(e.what()) + "; token models read one 1-d integer array (numpy.save(\"tokens.npy\", a))");
  }
  const io::NpyArray& a = f->arrays().at(0);
  const std::string where = "data file " + path + ": the array " + a.name;
  if (!io::npy_is_integer(a.type))
    throw DataError(where + " is " + io::to_string(a.type) +
                    "; tokens are integers: save a.astype(numpy.uint16) (or any integer dtype)");
  if (a.shape.size() != 1)
    throw DataError(where + " has the shape " + a.shape_str() +
                    "; tokens are one 1-d array in reading order: save a.reshape(-1)");
  std::vector<uint16_t> tokens(static_cast<size_t>(a.numel()));
  for (int64_t i = 0; i < a.numel(); ++i) {
    const int64_t v = a.integer_at(i, path);
    if (v < 0 || v > 65535)
      throw DataError(where + " holds " + std::to_string(v) + " at index " + std::to_string(i) +
                      "; tokens must fit uint16 (0..65535): map the ids into that range");
    tokens[static_cast<size_t>(i)] = static_cast<uint16_t>(v);
  }
  return tokens;
}

}  // namespace

// ---- enums ----

const char* to_string(Split split) { return split == Split::train ? "train" : "val"; }

const char* to_string(DataOrder order) {
  return order == DataOrder::random ? "random" : "sequential";
}

DataOrder parse_data_order(const std::string& text) {
  if (text == "random") return DataOrder::random;
  if (text == "sequential") return DataOrder::sequential;
  throw std::invalid_argument("unknown data order '" + text +
                              "'; use 'random' (windows drawn from seed and step) or "
                              "'sequential' (llm.c's order)");
}

const char* to_string(ImageLayout layout) {
  return layout == ImageLayout::nhwc ? "nhwc" : layout == ImageLayout::nchw ? "nchw" : "automatic";
}

ImageLayout parse_image_layout(const std::string& text) {
  if (text == "nhwc") return ImageLayout::nhwc;
  if (text == "nchw") return ImageLayout::nchw;
  throw std::invalid_argument("--data-layout must be nhwc (N x H x W x C) or nchw (N x C x H x W), not '" + text +
                              "'");
}

// ---- loading ----

TokenDataset TokenDataset::from_tokens(std::vector<uint16_t> tokens, double val_fraction,
                                       std::string name) {
  if (!(val_fraction >= 0.0 && val_fraction < 1.0))
    throw std::invalid_argument("val_fraction must be in [0, 1), got " +
                                std::to_string(val_fraction));
  TokenDataset ds;
  ds.path_ = std::move(name);
  const auto n = static_cast<int64_t>(tokens.size());
  const auto n_val = static_cast<int64_t>(std::floor(static_cast<double>(n) * val_fraction));
  ds.n_train_ = n - n_val;
  uint16_t max_token = 0;
  for (uint16_t t : tokens) max_token = std::max(max_token, t);
  ds.vocab_size_ = n > 0 ? static_cast<int32_t>(max_token) + 1 : 0;
  ds.tokens_ = std::move(tokens);
  return ds;
}

TokenDataset TokenDataset::open(const std::string& path, double val_fraction,
                                int64_t min_window) {
  if (min_window < 1)
    throw std::invalid_argument("min_window must be at least 1, got " +
                                std::to_string(min_window));
  InFile f = open_file(path);
  Format format = Format::text;
  std::vector<uint16_t> tokens;
  int32_t first = 0;
  if (f.size >= 4) read_at(f, path, 0, &first, 4);
  if (io::looks_like_npy(path)) {
    format = Format::npy;
    tokens = read_npy_tokens(path);
  } else if (io::looks_like_numpy(path)) {
    fail(path, "is an .npz archive of several arrays; a token model reads one 1-d integer array saved as .npy "
               "(numpy.save(\"tokens.npy\", a))");
  } else if (!has_bin_extension(path)) {
    std::string bytes(static_cast<size_t>(f.size), '\0');
    read_at(f, path, 0, bytes.data(), f.size);
    tokens.assign(reinterpret_cast<const unsigned char*>(bytes.data()),
                  reinterpret_cast<const unsigned char*>(bytes.data()) + bytes.size());
  } else if (first == kLlmcMagic) {
    format = Format::llmc_bin;
    tokens = read_llmc(f, path);
  } else {
    format = Format::nanogpt_bin;
    if (f.size % 2 != 0)
      fail(path, "has an odd size (" + std::to_string(f.size) +
                     " bytes) for a raw uint16 token file; it is truncated or not a token "
                     "file (text files must not end in .bin)");
    tokens.resize(static_cast<size_t>(f.size / 2));
    read_at(f, path, 0, tokens.data(), f.size);
  }
  TokenDataset ds = from_tokens(std::move(tokens), val_fraction, path);
  ds.format_ = format;
  if (format == Format::text) ds.vocab_size_ = 256;
  const int64_t need = min_window + 1;
  const int64_t n_val = ds.num_tokens(Split::val);
  if (ds.n_train_ < need || (val_fraction > 0.0 && n_val < need))
    fail(path, "is too short: " + std::to_string(ds.tokens_.size()) + " tokens give " +
                   std::to_string(ds.n_train_) + " training and " + std::to_string(n_val) +
                   " validation tokens, but a window of T=" + std::to_string(min_window) +
                   " needs " + std::to_string(need) +
                   " in each split; use a longer file, a shorter sequence or another val_fraction");
  return ds;
}

int64_t TokenDataset::num_tokens(Split split) const {
  return split == Split::train ? n_train_ : static_cast<int64_t>(tokens_.size()) - n_train_;
}

const uint16_t* TokenDataset::tokens(Split split) const {
  return tokens_.data() + (split == Split::train ? 0 : n_train_);
}

// ---- batches ----

void TokenDataset::check_batch_args(Split split, DataOrder order, int64_t step, int64_t B,
                                    int64_t T) const {
  if (B < 1 || T < 1)
    throw std::invalid_argument("batch size and sequence length must be positive, got B=" +
                                std::to_string(B) + " T=" + std::to_string(T));
  if (step < 0) throw std::invalid_argument("step must be >= 0, got " + std::to_string(step));
  const int64_t n = num_tokens(split);
  const std::string where = std::string("the ") + to_string(split) + " split of " + path_;
  if (order == DataOrder::random) {
    if (B > (int64_t{1} << kRowBits))
      throw std::invalid_argument("random data order supports at most 2^24 rows per batch, got B=" +
                                  std::to_string(B));
    if (n < T + 1)
      throw DataError(where + " has " + std::to_string(n) + " tokens, fewer than the T+1=" +
                      std::to_string(T + 1) +
                      " of one window; use a shorter sequence, a longer file or another "
                      "val_fraction");
  } else if (n < B * T + 1) {
    throw DataError(where + " has " + std::to_string(n) + " tokens, fewer than the B*T+1=" +
                    std::to_string(B * T + 1) +
                    " of one sequential batch; use a smaller batch or sequence, or a longer file");
  }
}

int64_t TokenDataset::window_start(Split split, DataOrder order, uint64_t seed, int64_t step,
                                   int64_t B, int64_t T, int64_t row) const {
  const int64_t n = num_tokens(split);
  if (order == DataOrder::random) {
    const uint64_t key = stream_key(seed, split == Split::train ? "data.train" : "data.val");
    const uint64_t index = (static_cast<uint64_t>(step) << kRowBits) + static_cast<uint64_t>(row);
    return static_cast<int64_t>(philox_u64(key, index) % static_cast<uint64_t>(n - T));
  }
  const int64_t per_pass = (n - 1) / (B * T);  // whole batches before wrapping (>= 1)
  return (step % per_pass) * B * T + row * T;
}

void TokenDataset::batch(Split split, DataOrder order, uint64_t seed, int64_t step, int64_t B,
                         int64_t T, int64_t row_begin, int64_t row_end, int32_t* tokens,
                         int32_t* targets) const {
  check_batch_args(split, order, step, B, T);
  if (row_begin < 0 || row_end > B || row_begin > row_end)
    throw std::invalid_argument("rows [" + std::to_string(row_begin) + ", " +
                                std::to_string(row_end) + ") are not inside a batch of B=" +
                                std::to_string(B));
  const uint16_t* src = this->tokens(split);
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint16_t* w = src + window_start(split, order, seed, step, B, T, r);
    int32_t* x = tokens + (r - row_begin) * T;
    int32_t* y = targets + (r - row_begin) * T;
    for (int64_t t = 0; t < T; ++t) {
      x[t] = w[t];
      y[t] = w[t + 1];
    }
  }
}

}  // namespace meshtrain::train
