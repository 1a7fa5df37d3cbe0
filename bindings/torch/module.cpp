// bindings/torch/module.cpp: the Python module dilocox._C (wrapped by the package
// dilocox/__init__.py): OuterLoop over torch parameters and a torch.distributed group,
// the registry's methods, and dilocox.Error. Reports come back as dicts; every call
// that may wait on the group releases the GIL.
#include <torch/extension.h>

#include <pybind11/stl.h>

#include <dilocox/compress/registry.hpp>

#include <optional>
#include <string>
#include <vector>

#include "lowrank_hook.hpp"
#include "torch_outer_loop.hpp"

namespace py = pybind11;
using namespace dilocox;
using dilocox::torch_binding::HookOptions;
using dilocox::torch_binding::LoopOptions;
using dilocox::torch_binding::LowRankHook;
using dilocox::torch_binding::TorchOuterLoop;

namespace {

template <class E>
E parse_enum(const std::string& value, std::initializer_list<E> all, const char* what) {
  std::string names;
  for (E e : all) {
    if (value == to_string(e)) return e;
    names += (names.empty() ? "" : ", ") + std::string(to_string(e));
  }
  throw Error(std::string(what) + ": '" + value + "' is not one of " + names);
}

py::dict report(const SyncStats& s) {
  py::dict d;
  d["sync"] = s.sync, d["round"] = s.round, d["fragment"] = s.fragment, d["local_steps"] = s.local_steps;
  d["steps"] = s.steps, d["low_rank"] = s.low_rank, d["wire_bytes"] = s.wire_bytes;
  d["fp32_sync_bytes"] = s.fp32_sync_bytes, d["allreduce_step_bytes"] = s.allreduce_step_bytes;
  d["ratio_vs_fp32_sync"] = s.ratio_vs_fp32_sync, d["ratio_vs_allreduce_steps"] = s.ratio_vs_allreduce_steps;
  d["comm_seconds"] = s.comm_seconds, d["wait_seconds"] = s.wait_seconds, d["hidden_seconds"] = s.hidden_seconds;
  d["contributors"] = s.contributors;
  py::list dropped;
  for (const auto& r : s.dropped) dropped.append(py::dict(py::arg("rank") = r.replica, py::arg("tensor") = r.tensor));
  d["dropped"] = dropped;
  return d;
}

py::list reports(const std::vector<SyncStats>& v) {
  py::list l;
  for (const auto& s : v) l.append(report(s));
  return l;
}

py::list method_table() {
  py::list l;
  for (const auto& m : methods()) {
    py::list knobs;
    for (const auto& k : m.knobs)
      knobs.append(py::dict(py::arg("name") = k.name, py::arg("default") = k.value, py::arg("help") = k.help,
                            py::arg("allowed") = k.allowed));
    l.append(py::dict(py::arg("name") = m.name, py::arg("help") = m.help, py::arg("defaults") = m.defaults,
                      py::arg("knobs") = knobs, py::arg("per_step") = m.per_step, py::arg("differs") = m.differs));
  }
  return l;
}

std::unique_ptr<TorchOuterLoop> make_loop(std::vector<std::string> names, std::vector<at::Tensor> params,
                                          c10::intrusive_ptr<c10d::ProcessGroup> group, const std::string& method,
                                          const std::map<std::string, double>& knobs, int local_steps,
                                          std::optional<int> max_local_steps, int fragments,
                                          std::optional<bool> overlap, std::optional<int> overlap_steps,
                                          std::optional<std::string> rebase, std::optional<std::string> momentum_at,
                                          std::optional<float> outer_lr, std::optional<float> outer_momentum,
                                          const std::string& momentum_storage, double timeout_s, std::uint64_t seed) {
  LoopOptions o;
  o.method = method;
  o.knobs = KnobValues(knobs.begin(), knobs.end());
  LoopChoices& c = o.choices;
  c.local_steps = local_steps;
  c.max_local_steps = max_local_steps.value_or(std::max(c.max_local_steps, local_steps));
  c.fragments = fragments;
  c.overlap = overlap, c.overlap_steps = overlap_steps, c.outer_lr = outer_lr, c.outer_momentum = outer_momentum;
  if (rebase)
    c.rebase = parse_enum(*rebase, {Rebase::keep, Rebase::overwrite, Rebase::blend, Rebase::mix}, "rebase");
  if (momentum_at) c.momentum_at = parse_enum(*momentum_at, {MomentumAt::replica, MomentumAt::mean}, "momentum_at");
  c.momentum_storage = parse_enum(momentum_storage, {MomentumStorage::fp32, MomentumStorage::bf16}, "momentum_storage");
  dilocox::detail::require(timeout_s > 0, "OuterLoop", "timeout must be positive");
  o.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000));
  o.seed = seed;
  py::gil_scoped_release nogil;
  return std::make_unique<TorchOuterLoop>(std::move(names), std::move(params), std::move(group), o);
}

py::bytes as_bytes_object(const std::vector<std::byte>& b) {
  return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
}

void bind_hook(py::module_& m) {
  py::class_<LowRankHook>(m, "LowRankHook")
      .def(py::init([](c10::intrusive_ptr<c10d::ProcessGroup> group, int rank, int bits, double min_compression_rate,
                       bool error_feedback, std::uint64_t seed, double timeout_s, const std::vector<std::string>& names,
                       const std::vector<std::vector<std::int64_t>>& shapes) {
             dilocox::detail::require(timeout_s > 0, "lowrank_hook", "timeout must be positive");
             HookOptions o{.rank = rank, .bits = bits, .min_compression_rate = min_compression_rate,
                           .error_feedback = error_feedback, .seed = seed,
                           .timeout = std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000))};
             return std::make_unique<LowRankHook>(std::move(group), o, names, shapes);
           }),
           py::arg("group"), py::arg("rank"), py::arg("bits"), py::arg("min_compression_rate"),
           py::arg("error_feedback"), py::arg("seed"), py::arg("timeout"), py::arg("names"), py::arg("shapes"))
      .def("reduce",
           [](LowRankHook& h, const std::vector<std::int64_t>& index, const std::vector<at::Tensor>& grads) {
             py::gil_scoped_release nogil;
             return h.reduce(index, grads);
           })
      .def_property_readonly("wire_bytes", &LowRankHook::wire_bytes)
      .def("describe", &LowRankHook::describe)
      .def("save_state", [](const LowRankHook& h) { return as_bytes_object(h.save_state()); })
      .def("load_state", [](LowRankHook& h, const py::bytes& b) {
        const std::string s = b;
        h.load_state(std::as_bytes(std::span(s.data(), s.size())));
      });
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "dilocox: DiLoCoX's outer loop and compressors for PyTorch trainers";
  py::register_exception<Error>(m, "Error", PyExc_RuntimeError);
  m.def("methods", &method_table, "The registry's methods: name, help, defaults, knobs, what differs from the paper");

  bind_hook(m);
  py::class_<TorchOuterLoop>(m, "OuterLoop")
      .def(py::init(&make_loop), py::arg("names"), py::arg("params"), py::arg("group"), py::arg("method"),
           py::arg("knobs"), py::arg("local_steps"), py::arg("max_local_steps"), py::arg("fragments"),
           py::arg("overlap"), py::arg("overlap_steps"), py::arg("rebase"), py::arg("momentum_at"),
           py::arg("outer_lr"), py::arg("outer_momentum"), py::arg("momentum_storage"), py::arg("timeout"),
           py::arg("seed"))
      .def("step", [](TorchOuterLoop& l) {
        std::vector<SyncStats> out;
        {
          py::gil_scoped_release nogil;
          out = l.step();
        }
        return reports(out);
      })
      .def("finish", [](TorchOuterLoop& l) {
        std::vector<SyncStats> out;
        {
          py::gil_scoped_release nogil;
          out = l.finish();
        }
        return reports(out);
      })
      .def("save_state", [](TorchOuterLoop& l) {
        std::vector<std::byte> bytes;
        {
          py::gil_scoped_release nogil;
          bytes = l.save_state();
        }
        return as_bytes_object(bytes);
      })
      .def("load_state", [](TorchOuterLoop& l, const py::bytes& b) {
        const std::string s = b;
        py::gil_scoped_release nogil;
        l.load_state(std::as_bytes(std::span(s.data(), s.size())));
      })
      .def("global_parameter", &TorchOuterLoop::global)
      .def("take_log", &TorchOuterLoop::take_log)
      .def_property_readonly("local_steps", [](TorchOuterLoop& l) { return l.loop().local_steps(); })
      .def_property_readonly("step_in_round", [](TorchOuterLoop& l) { return l.loop().step_in_round(); })
      .def_property_readonly("round", [](TorchOuterLoop& l) { return l.loop().round(); })
      .def_property_readonly("rank", [](TorchOuterLoop& l) { return l.comm().rank(); })
      .def_property_readonly("size", [](TorchOuterLoop& l) { return l.comm().size(); })
      .def("describe", [](TorchOuterLoop& l) { return l.loop().describe(); })
      .def("memory", [](TorchOuterLoop& l) {
        const OuterMemory mem = l.loop().memory();
        return py::dict(py::arg("global") = mem.global, py::arg("anchor") = mem.anchor,
                        py::arg("momentum") = mem.momentum, py::arg("workspace") = mem.workspace,
                        py::arg("compressor") = mem.compressor, py::arg("total") = mem.total());
      });
}
