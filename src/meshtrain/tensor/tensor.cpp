#include "meshtrain/tensor/tensor.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <sstream>
#include <stdexcept>

namespace meshtrain {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw std::invalid_argument("negative dimension in shape " + shape_str(shape));
    n *= d;
  }
  return n;
}

std::string shape_str(const Shape& shape) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ")";
  return os.str();
}

// ---- live-bytes accounting ----

namespace {

std::atomic<int64_t> g_live_bytes{0};

// The calling thread's counter; shared with the deleters of what it allocated, so storage
// freed after its thread has ended still finds a counter to debit.
const std::shared_ptr<std::atomic<int64_t>>& thread_counter() {
  thread_local auto counter = std::make_shared<std::atomic<int64_t>>(0);
  return counter;
}

// Its peak: only the owning thread raises the count (by allocating), so a plain thread_local.
int64_t& thread_peak() {
  thread_local int64_t peak = 0;
  return peak;
}

}  // namespace

int64_t tensor_bytes_live() { return g_live_bytes.load(std::memory_order_relaxed); }
int64_t tensor_bytes_live_thread() { return thread_counter()->load(std::memory_order_relaxed); }
int64_t tensor_bytes_peak_thread() { return std::max(thread_peak(), tensor_bytes_live_thread()); }
void reset_tensor_bytes_peak_thread() { thread_peak() = tensor_bytes_live_thread(); }

// ---- storage cache ----

namespace {

constexpr size_t kCacheMin = size_t{1} << 20;      // smaller blocks: malloc reuses them well
constexpr size_t kCacheQuantum = size_t{64} << 10;  // sizes are rounded up to this

struct StorageCache {
  std::mutex mu;
  std::map<size_t, std::vector<void*>> free;  // by rounded size
  size_t cached = 0;     // bytes in `free`
  size_t held = 0;       // bytes of cache-sized blocks obtained and not given back: in use + cached
  size_t peak_used = 0;  // the most of them ever in use at once (held - cached)
  size_t largest = 0;    // the largest block ever asked for
  int64_t hits = 0;
};

StorageCache& cache() {
  static auto* c = new StorageCache;  // never destroyed: tensors may be freed during exit
  return *c;
}

void* cache_take(size_t bytes) {
  StorageCache& c = cache();
  std::vector<void*> evict;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.free.find(bytes);
    if (it != c.free.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      c.cached -= bytes;
      ++c.hits;
      c.peak_used = std::max(c.peak_used, c.held - c.cached);
      return p;
    }
    // A miss: give back cached blocks, largest first, until in use + cached + this block is no
    // more than the peak in use plus one largest block (or, if this block raises that peak
    // further, until nothing is cached). The slack of one block is what a step needs: its
    // peak comes when the logits are allocated, while blocks that the backward pass will use
    // again are cached; a bound of the peak alone gave them back there, and the backward pass
    // then gave back the freed logits to get them again: gpt2-124m at 8 x 256 faulted in
    // 400 MiB a step that way.
    const size_t used = c.held - c.cached + bytes;
    c.largest = std::max(c.largest, bytes);
    const size_t bound = c.peak_used + c.largest;
    const size_t room = bound > used ? bound - used : 0;
    while (c.cached > room) {
      auto big = std::prev(c.free.end());
      if (big->second.empty()) {
        c.free.erase(big);
        continue;
      }
      evict.push_back(big->second.back());
      big->second.pop_back();
      c.cached -= big->first;
      c.held -= big->first;
    }
    c.held += bytes;
    c.peak_used = std::max(c.peak_used, used);
  }
  for (void* p : evict) std::free(p);
  void* p = std::aligned_alloc(64, bytes);
  if (!p) {
    std::lock_guard<std::mutex> lock(cache().mu);
    c.held -= bytes;
  }
  return p;
}

void cache_give(void* p, size_t bytes) {
  StorageCache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.free[bytes].push_back(p);
  c.cached += bytes;
}

}  // namespace

int64_t tensor_cache_bytes() {
  std::lock_guard<std::mutex> lock(cache().mu);
  return static_cast<int64_t>(cache().cached);
}
int64_t tensor_cache_hits() {
  std::lock_guard<std::mutex> lock(cache().mu);
  return cache().hits;
}
int64_t tensor_cache_peak_bytes() {
  std::lock_guard<std::mutex> lock(cache().mu);
  return static_cast<int64_t>(cache().peak_used);
}
int64_t tensor_cache_largest_bytes() {
  std::lock_guard<std::mutex> lock(cache().mu);
  return static_cast<int64_t>(cache().largest);
}

// ---- storage ----

void Tensor::allocate(int64_t n) {
  capacity_ = n;
  if (n == 0) {
    data_.reset();
    return;
  }
  size_t bytes = (static_cast<size_t>(n) * sizeof(float) + 63) / 64 * 64;
  const bool cached = bytes >= kCacheMin;
  if (cached) bytes = (bytes + kCacheQuantum - 1) / kCacheQuantum * kCacheQuantum;
  void* p = cached ? cache_take(bytes) : std::aligned_alloc(64, bytes);
  if (!p) throw std::bad_alloc();
  const int64_t live = n * static_cast<int64_t>(sizeof(float));
  g_live_bytes.fetch_add(live, std::memory_order_relaxed);
  auto counter = thread_counter();
  const int64_t now = counter->fetch_add(live, std::memory_order_relaxed) + live;
  thread_peak() = std::max(thread_peak(), now);
  data_ = std::shared_ptr<float[]>(static_cast<float*>(p), [counter, live, cached, bytes](float* q) {
    if (cached)
      cache_give(q, bytes);
    else
      std::free(q);
    g_live_bytes.fetch_sub(live, std::memory_order_relaxed);
    counter->fetch_sub(live, std::memory_order_relaxed);
  });
}

Tensor::Tensor(Shape shape) : shape_(std::move(shape)), numel_(shape_numel(shape_)) {
  allocate(numel_);
  zero();
}

Tensor Tensor::empty(Shape shape) {
  Tensor t;
  t.shape_ = std::move(shape);
  t.numel_ = shape_numel(t.shape_);
  t.allocate(t.numel_);
  return t;
}

Tensor Tensor::from(Shape shape, const std::vector<float>& values) {
  Tensor t = empty(std::move(shape));
  if (static_cast<int64_t>(values.size()) != t.numel_)
    throw std::invalid_argument("Tensor::from: " + std::to_string(values.size()) +
                                " values for shape " + shape_str(t.shape_));
  std::copy(values.begin(), values.end(), t.data());
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_);
  if (numel_) std::memcpy(t.data(), data(), bytes());
  return t;
}

Tensor Tensor::view(const Tensor& base, int64_t offset, Shape shape) {
  Tensor t;
  t.numel_ = shape_numel(shape);
  if (offset < 0 || offset + t.numel_ > base.numel_)
    throw std::invalid_argument("view of " + shape_str(shape) + " at " + std::to_string(offset) +
                                " outside a tensor of " + std::to_string(base.numel_) + " elements");
  t.shape_ = std::move(shape);
  t.capacity_ = t.numel_;
  t.data_ = std::shared_ptr<float[]>(base.data_, base.data_.get() + offset);
  return t;
}

void Tensor::copy_from(const Tensor& other) {
  // The same shape, not only the same element count: a (128, 256) table copied into a
  // (256, 128) one would scramble every row.
  if (other.shape_ != shape_)
    throw std::invalid_argument("copy_from: a tensor of shape " + shape_str(other.shape_) +
                                " cannot be copied into one of shape " + shape_str(shape_));
  if (numel_ && data() != other.data()) std::memcpy(data(), other.data(), bytes());
}

void Tensor::zero() {
  if (numel_) std::memset(data(), 0, bytes());
}

void Tensor::fill(float v) { std::fill(data(), data() + numel_, v); }

void Tensor::resize(Shape shape) {
  int64_t n = shape_numel(shape);
  if (n > capacity_) allocate(n);
  shape_ = std::move(shape);
  numel_ = n;
}

Tensor& Tensor::reshape(Shape shape) {
  if (shape_numel(shape) != numel_)
    throw std::invalid_argument("reshape " + shape_str(shape_) + " -> " + shape_str(shape) +
                                " changes the element count");
  shape_ = std::move(shape);
  return *this;
}

float max_abs_diff(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape())
    throw std::invalid_argument("max_abs_diff: shapes " + shape_str(a.shape()) + " and " +
                                shape_str(b.shape()) + " differ");
  float m = 0.f;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

}  // namespace meshtrain
