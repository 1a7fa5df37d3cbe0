// dilocox/dilocox.hpp: the umbrella header: the host core (tensor views, quantizers,
// projector, error feedback, wire format). Needs Eigen on the include path.
// MPI, NCCL and CUDA headers are included by name, never from here.
#pragma once

#include "dilocox/checksum.hpp"
#include "dilocox/config.hpp"
#include "dilocox/error_feedback.hpp"
#include "dilocox/lowrank.hpp"
#include "dilocox/quantize.hpp"
#include "dilocox/random.hpp"
#include "dilocox/tensor.hpp"
#include "dilocox/tensor_eigen.hpp"
#include "dilocox/wire.hpp"
