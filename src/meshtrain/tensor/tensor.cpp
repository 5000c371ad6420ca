#include "meshtrain/tensor/tensor.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <set>
#include <sstream>
#include <stdexcept>
#include <tuple>
#include <vector>

#include <sys/mman.h>

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

// ---- storage arena ----

namespace {

constexpr size_t kArenaMin = size_t{1} << 20;       // smaller blocks: the C library's
constexpr size_t kArenaQuantum = size_t{64} << 10;  // sizes are rounded up to this
// Address space reserved per segment (MAP_NORESERVE: pages cost nothing until touched). A
// system that refuses it (strict overcommit) gets segments of the request's size instead.
constexpr size_t kSegmentBytes = size_t{16} << 30;

// Blocks of segments of reserved address space, split on allocation and coalesced with their
// free neighbours (within a segment) when freed. A request takes a free block of exactly its
// size if there is one (a training step frees and asks for the same sizes again and again),
// else the free block at the lowest address that holds it (first fit), so that the blocks in
// use stay packed towards the start of the segment. A segment's `extent` is the end of the
// furthest block ever handed out: the pages below it may be resident, none above. Against
// best fit (the smallest block that holds the request) on the allocation sequences of training
// runs, replayed: cnn-small's extent 52 MiB instead of 61 for a peak in use of 46, the other
// models' the same or lower (docs/architecture.md).
struct Arena {
  struct Segment {
    char* base;
    size_t size;
    size_t extent = 0;
  };
  struct Block {
    size_t size;
    int seg;
    bool free;
  };
  std::mutex mu;
  std::vector<Segment> segments;
  std::map<char*, Block> blocks;                    // every block, by address
  std::set<std::tuple<size_t, int, char*>> free_fit;  // free blocks by (size, segment, address)
  size_t in_use = 0, peak_used = 0, largest = 0;
  int64_t hits = 0;

  void add_free(char* at, size_t size, int seg) {
    blocks[at] = {size, seg, true};
    free_fit.insert({size, seg, at});
  }
  bool new_segment(size_t bytes) {
    for (size_t want : {std::max(kSegmentBytes, bytes), bytes}) {
      void* p = mmap(nullptr, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) continue;
      segments.push_back({static_cast<char*>(p), want});
      add_free(static_cast<char*>(p), want, static_cast<int>(segments.size()) - 1);
      return true;
    }
    return false;
  }
  void* take(size_t bytes) {
    std::lock_guard<std::mutex> lock(mu);
    largest = std::max(largest, bytes);
    auto it = free_fit.lower_bound({bytes, 0, nullptr});
    if (it == free_fit.end() || std::get<0>(*it) != bytes) {  // no exact fit: the first that holds it
      auto first = std::find_if(blocks.begin(), blocks.end(),
                                [&](const auto& b) { return b.second.free && b.second.size >= bytes; });
      if (first == blocks.end()) {
        if (!new_segment(bytes)) return nullptr;
        first = std::find_if(blocks.begin(), blocks.end(),
                             [&](const auto& b) { return b.second.free && b.second.size >= bytes; });
      }
      it = free_fit.find({first->second.size, first->second.seg, first->first});
    }
    const auto [size, seg, at] = *it;
    free_fit.erase(it);
    Block& b = blocks[at];
    b.free = false;
    if (size > bytes) {
      b.size = bytes;
      add_free(at + bytes, size - bytes, seg);
    }
    Segment& sg = segments[static_cast<size_t>(seg)];
    const size_t end = static_cast<size_t>(at - sg.base) + bytes;
    if (end <= sg.extent) ++hits;
    sg.extent = std::max(sg.extent, end);
    in_use += bytes;
    peak_used = std::max(peak_used, in_use);
    return at;
  }
  void give(void* q) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = blocks.find(static_cast<char*>(q));
    char* at = it->first;
    size_t size = it->second.size;
    const int seg = it->second.seg;
    in_use -= size;
    auto next = std::next(it);
    if (next != blocks.end() && next->second.free && next->second.seg == seg && next->first == at + size) {
      free_fit.erase({next->second.size, seg, next->first});
      size += next->second.size;
      blocks.erase(next);
    }
    if (it != blocks.begin()) {
      auto prev = std::prev(it);
      if (prev->second.free && prev->second.seg == seg && prev->first + prev->second.size == at) {
        free_fit.erase({prev->second.size, seg, prev->first});
        at = prev->first;
        size += prev->second.size;
        blocks.erase(it);
        it = prev;
      }
    }
    it->second = {size, seg, true};
    free_fit.insert({size, seg, at});
  }
  size_t extent() const {
    size_t e = 0;
    for (const Segment& sg : segments) e += sg.extent;
    return e;
  }
};

Arena& arena() {
  static auto* a = new Arena;  // never destroyed: tensors may be freed during exit
  return *a;
}

}  // namespace

int64_t tensor_cache_bytes() {
  Arena& a = arena();
  std::lock_guard<std::mutex> lock(a.mu);
  return static_cast<int64_t>(a.extent() - std::min(a.extent(), a.in_use));
}
int64_t tensor_cache_hits() {
  std::lock_guard<std::mutex> lock(arena().mu);
  return arena().hits;
}
int64_t tensor_cache_peak_bytes() {
  std::lock_guard<std::mutex> lock(arena().mu);
  return static_cast<int64_t>(arena().peak_used);
}
int64_t tensor_cache_largest_bytes() {
  std::lock_guard<std::mutex> lock(arena().mu);
  return static_cast<int64_t>(arena().largest);
}
int64_t tensor_cache_extent_bytes() {
  Arena& a = arena();
  std::lock_guard<std::mutex> lock(a.mu);
  return static_cast<int64_t>(a.extent());
}

// ---- storage ----

void Tensor::allocate(int64_t n) {
  capacity_ = n;
  if (n == 0) {
    data_.reset();
    return;
  }
  size_t bytes = (static_cast<size_t>(n) * sizeof(float) + 63) / 64 * 64;
  const bool cached = bytes >= kArenaMin;
  if (cached) bytes = (bytes + kArenaQuantum - 1) / kArenaQuantum * kArenaQuantum;
  void* p = cached ? arena().take(bytes) : std::aligned_alloc(64, bytes);
  if (!p) throw std::bad_alloc();
  const int64_t live = n * static_cast<int64_t>(sizeof(float));
  g_live_bytes.fetch_add(live, std::memory_order_relaxed);
  auto counter = thread_counter();
  const int64_t now = counter->fetch_add(live, std::memory_order_relaxed) + live;
  thread_peak() = std::max(thread_peak(), now);
  data_ = std::shared_ptr<float[]>(static_cast<float*>(p), [counter, live, cached](float* q) {
    if (cached)
      arena().give(q);
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
