// Parameters as users hold them: Eigen matrices of either storage order (the shape read
// from the type: a column-major (r, c) matrix is the tensor (c, r), its memory order),
// maps, std::vector through a shape, spans; the low-rank compressor then sees the matrix
// the memory holds. A strided view does not compile (tests/compile_fail/).
#include <dilocox/diloco.hpp>
#include <dilocox/tensor_eigen.hpp>
#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <vector>

namespace dx = dilocox;

TEST(Named, ShapesComeFromTheTypeInMemoryOrder) {
  Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> row(6, 4);
  Eigen::MatrixXf col(6, 4);  // column-major: its memory is the (4, 6) row-major matrix
  Eigen::VectorXf bias(5);
  std::vector<float> buf(24);
  Eigen::Map<Eigen::MatrixXf> map(buf.data(), 3, 8);
  const auto a = dx::named("row", row), b = dx::named("col", col), c = dx::named("bias", bias);
  const auto d = dx::named("buf", dx::TensorView<float>{buf.data(), {2, 12}}), e = dx::named("map", map);
  EXPECT_EQ(a.shape, (dx::Shape{6, 4}));
  EXPECT_EQ(b.shape, (dx::Shape{4, 6}));
  EXPECT_EQ(c.shape, (dx::Shape{5}));
  EXPECT_EQ(d.shape, (dx::Shape{2, 12}));
  EXPECT_EQ(e.shape, (dx::Shape{8, 3}));
  EXPECT_EQ(a.data.data(), row.data());
  EXPECT_EQ(b.data.data(), col.data());
  EXPECT_EQ(e.data.size(), 24u);
}

// A column-major matrix of rank 1 stays rank 1 as the loop sees it (its transpose): the
// reshape never scrambles it, whatever the storage order.
TEST(Named, ColumnMajorLowRankStructureSurvives) {
  Eigen::MatrixXf col = Eigen::VectorXf::LinSpaced(40, 1, 2) * Eigen::RowVectorXf::LinSpaced(30, -1, 1);
  const auto t = dx::named("w", col);
  const auto [m, n] = dx::matrix_shape(t.shape);
  Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>> seen(t.data.data(),
                                                                                                static_cast<Eigen::Index>(m),
                                                                                                static_cast<Eigen::Index>(n));
  Eigen::JacobiSVD<Eigen::MatrixXf> svd(seen);
  EXPECT_GT(svd.singularValues()[0], 1.0f);
  EXPECT_LT(svd.singularValues()[1], 1e-4f * svd.singularValues()[0]);
  EXPECT_TRUE(seen.isApprox(col.transpose()));
}
