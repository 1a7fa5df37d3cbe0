// Must not compile: a block of an Eigen matrix is strided, not a dilocox::Tensor. The test
// (ctest compile_fail.strided_eigen_block) expects the short message from dilocox::named.
#include <dilocox/diloco.hpp>
#include <dilocox/tensor_eigen.hpp>

int main() {
  Eigen::MatrixXf w(8, 8);
  auto block = w.block(0, 0, 4, 4);
  auto t = dilocox::named("w", block);
  return static_cast<int>(t.data.size());
}
