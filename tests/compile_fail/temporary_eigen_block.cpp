// Must not compile: a temporary (here a block made in the call) handed to dilocox::named.
// The test (ctest compile_fail.temporary_eigen_block) expects the short message.
#include <dilocox/diloco.hpp>
#include <dilocox/tensor_eigen.hpp>

int main() {
  Eigen::MatrixXf w(8, 8);
  auto t = dilocox::named("w", w.block(0, 0, 4, 4));
  return static_cast<int>(t.data.size());
}
