// Tensor: a contiguous, row-major float32 array with a shape. Storage is 64-byte aligned (SIMD
// kernels and BLAS see aligned rows) and shared: copying a Tensor shares its storage (as a
// PyTorch tensor does), so saving an activation for backward costs a reference count, not a
// copy. `clone()` makes a deep copy.
// Limits: no strides (kernels take raw pointers plus sizes, llm.c style); views are contiguous
// ranges of another tensor's storage; bf16 storage
// comes later behind the same class. Concurrency: one rank owns a tensor; no locking.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

namespace meshtrain {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& shape);
std::string shape_str(const Shape& shape);  // "(4, 64, 128)"

class Tensor {
 public:
  Tensor() = default;
  // Zero-filled tensor of the given shape.
  explicit Tensor(Shape shape);
  Tensor(std::initializer_list<int64_t> shape) : Tensor(Shape(shape)) {}
  // Tensor whose contents are left unspecified (for outputs a kernel overwrites in full).
  static Tensor empty(Shape shape);
  static Tensor zeros(Shape shape) { return Tensor(std::move(shape)); }
  static Tensor from(Shape shape, const std::vector<float>& values);

  // Shallow: shares storage. Use clone() for an independent copy.
  Tensor(const Tensor&) = default;
  Tensor& operator=(const Tensor&) = default;
  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(Tensor&&) noexcept = default;
  Tensor clone() const;
  // A tensor of `shape` over `base`'s storage from element `offset` on; it shares ownership,
  // so the storage lives while any view does (data-parallel buckets keep each parameter's
  // gradient as a view into one flat buffer).
  static Tensor view(const Tensor& base, int64_t offset, Shape shape);
  // Copies other's values into this tensor's storage; the shapes must be equal (throws
  // std::invalid_argument naming both otherwise).
  void copy_from(const Tensor& other);

  float* data() { return data_.get(); }
  const float* data() const { return data_.get(); }
  float& operator[](int64_t i) { return data_.get()[i]; }
  float operator[](int64_t i) const { return data_.get()[i]; }

  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_.at(i < 0 ? i + ndim() : i); }
  int64_t numel() const { return numel_; }
  int64_t bytes() const { return numel_ * static_cast<int64_t>(sizeof(float)); }

  void zero();
  void fill(float v);
  // Changes the shape; reallocates (leaving other sharers on the old storage) only when the
  // element count grows past the capacity.
  void resize(Shape shape);
  // Same storage, new shape of the same element count.
  Tensor& reshape(Shape shape);

 private:
  void allocate(int64_t n);

  Shape shape_;
  int64_t numel_ = 0;
  int64_t capacity_ = 0;
  std::shared_ptr<float[]> data_;
};

// ---- live-bytes accounting ----
// Bytes of tensor storage allocated and not yet freed (element bytes, alignment padding not
// counted). Storage is charged to the thread that allocated it until it is freed, whichever
// thread frees it, so a rank thread's count is what that rank holds (tests measure ZeRO's
// per-rank memory with it). Both are exact at any moment; each costs one atomic load.
int64_t tensor_bytes_live();         // the whole process
int64_t tensor_bytes_live_thread();  // storage allocated by the calling thread
// The highest tensor_bytes_live_thread() since the last reset (or the thread's start): checked
// at every allocation of the calling thread, the only moment its count can rise.
int64_t tensor_bytes_peak_thread();
void reset_tensor_bytes_peak_thread();  // the peak becomes the current live count

// ---- storage arena ----
// Tensors of 1 MiB and more take their storage from one arena per process instead of the C
// library: a training step allocates the same activations, logits and gathered units every
// step, and glibc returns such blocks to the kernel (a large block is its own mapping; a rank
// thread's arena drops a heap once it is empty), so every step paid a page fault and a page
// clearing for each 4 KiB of them (17% of a gpt2-124m bf16 step). The arena reserves address
// space in large segments and serves a request from a free block of exactly its size if there
// is one, else from the free block at the lowest address that holds it (first fit), splitting
// it; a freed block merges with its free neighbours. Pages once touched stay, so a repeated
// step reuses the same blocks and faults nothing in, and the memory the arena holds is the
// extent its blocks ever reached, which this policy keeps near the most ever in use at once
// (cnn-small: 52 MiB for 46 in use; best fit reached 61, and an earlier cache that kept freed
// blocks per exact size 1.9x the peak: a block of one size could not serve another). The
// live-bytes counts above are unaffected (a free block is not live).
int64_t tensor_cache_bytes();          // free bytes below the extent: held, not in use
int64_t tensor_cache_hits();           // allocations served below the extent (no new pages) so far
int64_t tensor_cache_peak_bytes();     // the most arena storage ever in use at once
int64_t tensor_cache_largest_bytes();  // the largest block asked for
int64_t tensor_cache_extent_bytes();   // the arena's extent: in use + free below it

// Largest absolute element-wise difference; the shapes must match.
float max_abs_diff(const Tensor& a, const Tensor& b);

}  // namespace meshtrain
