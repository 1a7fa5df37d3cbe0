// reference_trainer/pseudo_gradient_dump.hpp: --dump-pseudo-gradients DIR. At the end
// of each outer round, replica 0 writes each stage's pseudo-gradient (the parameters at
// the round's start minus now, before the outer step) to DIR/round<NNNN>-stage<S>.bin:
// one dilocox wire payload (dense fp32, named and shaped, checksummed) per tensor.
// examples/compress_tensors --from FILE compresses them every way the library can.
#pragma once

#include "model/stage_model.hpp"

#include <dilocox/wire.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace dilocox::trainer {

class PseudoGradientDump {
 public:
  PseudoGradientDump(std::string dir, int stage) : dir_(std::move(dir)), stage_(stage) {
    std::filesystem::create_directories(dir_);
  }

  void begin_round(StageModel& model) {
    anchor_.assign(model.params().begin(), model.params().end());
  }

  void write(std::uint64_t round, StageModel& model) {
    char name[64];
    std::snprintf(name, sizeof name, "round%04llu-stage%d.bin", static_cast<unsigned long long>(round), stage_);
    std::vector<std::byte> out;
    std::vector<float> delta;
    for (const auto& t : model.tensors()) {
      const auto phi = model.param(t);
      delta.resize(phi.size());
      for (std::size_t i = 0; i < phi.size(); ++i) delta[i] = anchor_[t.offset + i] - phi[i];
      const PayloadHeader h{PayloadKind::dense_f32, t.dims(), {}, 0};
      const std::size_t at = out.size();
      out.resize(at + payload_size(h, t.name));
      write_payload(h, t.name, std::as_bytes(std::span<const float>(delta)), std::span(out).subspan(at));
    }
    std::ofstream f(std::filesystem::path(dir_) / name, std::ios::binary);
    f.write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size()));
    dilocox::detail::require(static_cast<bool>(f), "PseudoGradientDump", "cannot write " + dir_ + "/" + name);
  }

 private:
  std::string dir_;
  int stage_;
  std::vector<float> anchor_;  // the stage's parameters at the start of the round
};

}  // namespace dilocox::trainer
