// Tensor::copy_from insists on the same shape: equal element counts are not enough (a (2, 3)
// table copied into a (3, 2) one would scramble its rows).
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "meshtrain/tensor/tensor.h"

using namespace meshtrain;

TEST(TensorCopyFrom, SameShapeCopiesTheValues) {
  Tensor a({2, 3}), b({2, 3});
  for (int64_t i = 0; i < 6; ++i) a.data()[i] = static_cast<float>(i) + 0.5f;
  b.copy_from(a);
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(b.data()[i], a.data()[i]);
}

TEST(TensorCopyFrom, SameCountOtherShapeIsRefusedNamingBothShapes) {
  for (const Shape& other : {Shape{3, 2}, Shape{6}, Shape{1, 2, 3}}) {
    Tensor a(other), b({2, 3});
    b.fill(7.f);
    try {
      b.copy_from(a);
      FAIL() << "copied " << shape_str(other) << " into (2, 3)";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(shape_str(other)), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(shape_str({2, 3})), std::string::npos) << e.what();
    }
    for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(b.data()[i], 7.f) << "the refused copy changed the target";
  }
}

TEST(TensorCopyFrom, OtherCountIsRefused) {
  Tensor a({4}), b({2, 3});
  EXPECT_THROW(b.copy_from(a), std::invalid_argument);
}
