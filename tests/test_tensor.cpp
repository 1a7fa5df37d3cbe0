// Conformance of the Tensor concept: which types are tensors (contiguous storage
// with a shape) and which are not, and the first-dim x rest reshape rule.
#include <dilocox/tensor.hpp>
#include <dilocox/tensor_eigen.hpp>
#include <gtest/gtest.h>

#include <span>
#include <vector>

namespace dx = dilocox;

using RowM = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ColM = Eigen::MatrixXf;

static_assert(dx::Tensor<std::vector<float>>);
static_assert(dx::Tensor<const std::vector<float>>);
static_assert(dx::Tensor<std::span<float>>);
static_assert(dx::Tensor<std::span<const float>>);
static_assert(dx::Tensor<std::span<float, 16>>);
static_assert(dx::Tensor<dx::TensorView<float>>);
static_assert(dx::Tensor<dx::TensorView<float, dx::cuda_space>>);
static_assert(dx::Tensor<dx::MatrixView<float>>);
static_assert(dx::Tensor<RowM>);
static_assert(dx::Tensor<ColM>);
static_assert(dx::Tensor<Eigen::VectorXf>);
static_assert(dx::Tensor<Eigen::Map<RowM>>);
static_assert(dx::Tensor<Eigen::Map<const RowM>>);
// Not tensors: no silent copies of strided or lazy data.
static_assert(!dx::Tensor<Eigen::Block<RowM>>);
static_assert(!dx::Tensor<decltype(std::declval<RowM&>().block(0, 0, 2, 2))>);
static_assert(!dx::Tensor<decltype(std::declval<ColM&>().row(0))>);
static_assert(!dx::Tensor<Eigen::Map<RowM, 0, Eigen::OuterStride<>>>);
static_assert(!dx::Tensor<decltype(std::declval<RowM&>() * 2.0f)>);
static_assert(!dx::Tensor<float*>);
static_assert(!dx::Tensor<int>);

static_assert(std::is_same_v<dx::memory_space_t<dx::TensorView<float, dx::cuda_space>>, dx::cuda_space>);
static_assert(std::is_same_v<dx::memory_space_t<std::vector<float>>, dx::host_space>);
static_assert(std::is_same_v<dx::element_type_t<std::span<const float>>, float>);

TEST(TensorConcept, ReshapeIsFirstDimTimesRest) {
  EXPECT_EQ(dx::matrix_shape(dx::Shape{}), (std::array<std::size_t, 2>{1, 1}));
  EXPECT_EQ(dx::matrix_shape(dx::Shape{7}), (std::array<std::size_t, 2>{7, 1}));
  EXPECT_EQ(dx::matrix_shape(dx::Shape{4, 5}), (std::array<std::size_t, 2>{4, 5}));
  EXPECT_EQ(dx::matrix_shape(dx::Shape{64, 3, 3, 2}), (std::array<std::size_t, 2>{64, 18}));
  EXPECT_EQ(dx::matrix_shape(dx::Shape{0, 3}), (std::array<std::size_t, 2>{0, 3}));
}

TEST(TensorConcept, RawPointerAndShapeAdapter) {
  std::vector<float> buf(2 * 3 * 4);
  dx::TensorView<float> t{buf.data(), {2, 3, 4}};
  auto m = dx::as_matrix(t);
  EXPECT_EQ(m.data, buf.data());
  EXPECT_EQ(m.rows, 2u);
  EXPECT_EQ(m.cols, 12u);
  EXPECT_EQ(dx::as_span(t).size(), 24u);
  m(1, 11) = 5.0f;
  EXPECT_EQ(buf[23], 5.0f);
}

TEST(TensorConcept, EigenShapesFollowMemoryOrder) {
  RowM r(3, 5);
  ColM c(3, 5);
  EXPECT_EQ(dx::tensor_shape(r), (dx::Shape{3, 5}));
  EXPECT_EQ(dx::tensor_shape(c), (dx::Shape{5, 3}));  // column-major (3,5) is row-major (5,3)
  EXPECT_EQ(dx::tensor_data(c), c.data());
  Eigen::VectorXf v(9);
  EXPECT_EQ(dx::tensor_shape(v), (dx::Shape{9}));
  Eigen::Map<const RowM> map(r.data(), 3, 5);
  EXPECT_EQ(dx::as_matrix(map).data, r.data());
}

TEST(TensorConcept, VectorAndSpanAreOneDimensional) {
  std::vector<float> v(10);
  EXPECT_EQ(dx::tensor_shape(v), (dx::Shape{10}));
  std::span<const float> s(v);
  EXPECT_EQ(dx::as_matrix(s).rows, 10u);
  EXPECT_EQ(dx::as_matrix(s).cols, 1u);
}

TEST(TensorConcept, ShapeRejectsTooManyDimensions) {
  EXPECT_THROW((dx::Shape{1, 2, 3, 4, 5, 6, 7}), dx::Error);
}
