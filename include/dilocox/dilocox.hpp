// dilocox/dilocox.hpp: the umbrella header: the host core (tensor views, quantizers,
// projector, error feedback, wire format, codecs, reducers, the compressors of
// compress/, outer optimizer, adaptive rank, overlap, OuterLoop) with the in-process and throttled
// communicators. Needs Eigen on the include path.
// MPI, NCCL and CUDA headers are included by name, never from here.
#pragma once

#include "dilocox/adaptive.hpp"
#include "dilocox/checksum.hpp"
#include "dilocox/codec.hpp"
#include "dilocox/comm/communicator.hpp"
#include "dilocox/comm/cost.hpp"
#include "dilocox/comm/thread.hpp"
#include "dilocox/comm/throttled.hpp"
#include "dilocox/comm/any.hpp"
#include "dilocox/compress/cocktail.hpp"
#include "dilocox/compress/compressor.hpp"
#include "dilocox/compress/dense.hpp"
#include "dilocox/compress/flat_layout.hpp"
#include "dilocox/compress/lowrank.hpp"
#include "dilocox/compress/registry.hpp"
#include "dilocox/compress/sparse.hpp"
#include "dilocox/config.hpp"
#include "dilocox/diloco.hpp"
#include "dilocox/error_feedback.hpp"
#include "dilocox/half.hpp"
#include "dilocox/lowrank.hpp"
#include "dilocox/named_tensor.hpp"
#include "dilocox/outer.hpp"
#include "dilocox/overlap.hpp"
#include "dilocox/quantize.hpp"
#include "dilocox/random.hpp"
#include "dilocox/sparse_code.hpp"
#include "dilocox/reduce.hpp"
#include "dilocox/shard.hpp"
#include "dilocox/tensor.hpp"
#include "dilocox/tensor_eigen.hpp"
#include "dilocox/wire.hpp"
