// Tensor: a contiguous, row-major float32 array with a shape. It owns its storage (64-byte
// aligned, so SIMD kernels and BLAS see aligned rows); copies are deep, moves are cheap.
// Limits: no strides or views (kernels take raw pointers plus sizes, llm.c style); bf16 storage
// comes later behind the same class.
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

  Tensor(const Tensor& other);
  Tensor& operator=(const Tensor& other);
  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(Tensor&&) noexcept = default;

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
  // Changes the shape; reallocates only when the element count grows past the capacity.
  void resize(Shape shape);
  // Same storage, new shape of the same element count.
  Tensor& reshape(Shape shape);

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  void allocate(int64_t n);

  Shape shape_;
  int64_t numel_ = 0;
  int64_t capacity_ = 0;
  std::unique_ptr<float[], Free> data_;
};

// Largest absolute element-wise difference; the shapes must match.
float max_abs_diff(const Tensor& a, const Tensor& b);

}  // namespace meshtrain
