// The Python module `membudget` (pybind11): predict, estimate, fits, max_micro_batch,
// max_sequence_length, sweep. Results are dicts; bad input raises membudget.Error (a ValueError).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "membudget/api.hpp"
#include "membudget/report.hpp"

namespace py = pybind11;
using namespace membudget;

namespace {

ModelSpec model_of(const py::object& m) {
  if (py::isinstance<ModelSpec>(m)) return m.cast<ModelSpec>();
  if (py::isinstance<py::str>(m)) return load_model(m.cast<std::string>());
  // os.PathLike
  if (py::hasattr(m, "__fspath__")) return load_model(m.attr("__fspath__")().cast<std::string>());
  throw Error(ErrorKind::invalid_argument, "model: a path to a spec / config.json or a membudget.Model");
}

Job job_of(const py::kwargs& kw, std::initializer_list<const char*> skip = {}) {
  Job j;
  for (auto item : kw) {
    const std::string key = item.first.cast<std::string>();
    bool skipped = false;
    for (const char* s : skip) skipped |= key == s;
    if (skipped) continue;
    set_job_option(j, key, py::str(item.second).cast<std::string>());
  }
  j.validate();
  return j;
}

py::object loads(const std::string& s) { return py::module_::import("json").attr("loads")(s); }

py::dict estimate_dict(const Estimate& e) { return loads(to_json(e)).cast<py::dict>(); }

Device device_of(const py::object& device, std::uint64_t capacity) {
  if (!device.is_none()) return find_device(device.cast<std::string>());
  if (capacity == 0) throw Error(ErrorKind::invalid_argument, "give device='H100' or capacity=<bytes>");
  return Device{"custom", capacity};
}

// What both searches report: the answer under `key`, what it requires and the limit.
template <class Result>
py::dict search_dict(const char* key, std::uint64_t answer, const Result& r) {
  py::dict d;
  d[key] = answer;
  d["required"] = r.at_max.required;
  d["limit"] = r.limit;
  return d;
}

}  // namespace

PYBIND11_MODULE(membudget, m) {
  m.doc() = "membudget: predict the GPU memory of a transformer training step (docs/api.md)";
  m.attr("__version__") = "0.1.0";
  py::register_exception<Error>(m, "Error", PyExc_ValueError);

  py::class_<ModelSpec>(m, "Model")
      .def_readonly("name", &ModelSpec::name)
      .def_readonly("num_layers", &ModelSpec::num_layers)
      .def_readonly("hidden_size", &ModelSpec::hidden_size)
      .def_readonly("vocab_size", &ModelSpec::vocab_size)
      .def_readonly("max_positions", &ModelSpec::max_positions)
      .def_property_readonly("parameters", [](const ModelSpec& s) { return s.parameters().total; })
      .def_static("from_yaml", [](const std::string& text) { return parse_model_yaml(text); })
      .def_static("from_config_json", [](const std::string& text) { return parse_hf_config(text); })
      .def("__repr__", [](const ModelSpec& s) {
        return "<membudget.Model " + s.name + ": " + std::to_string(s.parameters().total) + " parameters>";
      });

  m.def("clear_cache", [] { clear_estimate_cache(); }, "Empties this thread's compiled plans and memo table of estimates.");

  m.def("load_model", [](const std::string& path) { return load_model(path); }, py::arg("path"),
        "A model from our YAML schema or a Hugging Face config.json.");

  m.def(
      "predict",
      [](const py::object& model, const py::kwargs& kw) {
        const std::string s = to_json_string(predict(model_of(model), job_of(kw)), std::nullopt, false, -1);
        return loads(s);
      },
      py::arg("model"),
      "The full budget as a dict (the JSON of `membudget predict --format json`). Job options are keyword "
      "arguments: batch=4, seq=4096, precision='amp-bf16', optimizer, optimizer_impl, recompute, attention, loss, …");

  m.def(
      "estimate", [](const py::object& model, const py::kwargs& kw) { return estimate_dict(estimate(model_of(model), job_of(kw))); },
      py::arg("model"), "The numbers only (peak, required, terms, phases): from a plan compiled per (model, recipe), microseconds.");

  m.def(
      "fits",
      [](const py::object& model, const py::object& device, std::uint64_t capacity, double headroom,
         const py::kwargs& kw) {
        const FitResult f = fits(model_of(model), job_of(kw), device_of(device, capacity), headroom);
        py::dict d;
        d["fits"] = f.fits;
        d["required"] = f.required;
        d["limit"] = f.limit;
        d["capacity"] = f.capacity;
        d["estimate"] = estimate_dict(f.estimate);
        return d;
      },
      py::arg("model"), py::arg("device") = py::none(), py::arg("capacity") = 0, py::arg("headroom") = 0.05);

  m.def(
      "max_micro_batch",
      [](const py::object& model, const py::object& device, std::uint64_t capacity, double headroom,
         std::uint64_t global_batch, std::uint64_t data_parallel, const py::kwargs& kw) {
        SearchOptions o;
        o.headroom = headroom;
        o.global_batch = global_batch;
        o.data_parallel = data_parallel;
        const MaxBatchResult r = max_micro_batch(model_of(model), job_of(kw), device_of(device, capacity), o);
        py::dict d = search_dict("max_micro_batch", r.max_micro_batch, r);
        d["estimate"] = estimate_dict(r.at_max);
        if (global_batch) {
          d["accum_micro_batch"] = r.accum_micro_batch;
          d["grad_accum_steps"] = r.grad_accum_steps;
        }
        d["evaluations"] = r.evaluations;
        return d;
      },
      py::arg("model"), py::arg("device") = py::none(), py::arg("capacity") = 0, py::arg("headroom") = 0.05,
      py::arg("global_batch") = 0, py::arg("data_parallel") = 1,
      "The largest micro-batch that fits (0: none) and the estimate there.");

  m.def(
      "max_sequence_length",
      [](const py::object& model, const py::object& device, std::uint64_t capacity, double headroom,
         std::uint64_t multiple_of, const py::kwargs& kw) {
        SearchOptions o;
        o.headroom = headroom;
        o.multiple_of = multiple_of;
        const MaxSeqResult r = max_sequence_length(model_of(model), job_of(kw), device_of(device, capacity), o);
        return search_dict("max_seq", r.max_seq, r);
      },
      py::arg("model"), py::arg("device") = py::none(), py::arg("capacity") = 0, py::arg("headroom") = 0.05,
      py::arg("multiple_of") = 1);

  m.def(
      "sweep",
      [](const py::object& model, std::vector<std::uint64_t> batches, std::vector<std::uint64_t> seqs,
         std::vector<std::string> precisions, const py::object& device, std::uint64_t capacity, double headroom,
         const py::kwargs& kw) {
        SweepGrid g;
        g.batches = std::move(batches);
        g.seqs = std::move(seqs);
        for (const auto& p : precisions) g.precisions.push_back(parse_precision(p));
        std::optional<Device> dev;
        if (!device.is_none() || capacity) dev = device_of(device, capacity);
        py::list out;
        for (const auto& p : sweep(model_of(model), job_of(kw), g, dev, headroom)) {
          py::dict d;
          d["batch"] = p.batch;
          d["seq"] = p.seq;
          d["precision"] = to_string(p.precision);
          d["ok"] = p.ok;
          if (p.ok) {
            d["peak"] = p.estimate.peak;
            d["required"] = p.estimate.required;
            if (dev) d["fits"] = p.fits;
            d["beyond_max_positions"] = p.beyond_max_positions;
          } else {
            d["error"] = p.error;
          }
          out.append(d);
        }
        return out;
      },
      py::arg("model"), py::arg("batches") = std::vector<std::uint64_t>{}, py::arg("seqs") = std::vector<std::uint64_t>{},
      py::arg("precisions") = std::vector<std::string>{}, py::arg("device") = py::none(), py::arg("capacity") = 0,
      py::arg("headroom") = 0.05);
}
