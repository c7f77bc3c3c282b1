// The Python module `membudget` (pybind11): predict, estimate, fits, max_micro_batch,
// max_sequence_length, sweep. Results are dicts; bad input raises membudget.Error (a ValueError), a
// wrongly typed argument included.
//
// Threads. Every call that reads a file or computes (load_model, the Model.from_* parsers,
// predict, estimate, fits, the searches, sweep) converts its Python arguments to C++ values while
// holding the GIL, releases it for the library call, and takes it back to build the result: a
// threaded scheduler runs them in parallel. The library is thread-safe (api.hpp).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <limits>
#include <variant>

#include "membudget/api.hpp"
#include "membudget/input.hpp"
#include "membudget/report.hpp"
#include "membudget/trainer_args.hpp"
#include "cli.hpp"  // tools/: the command line, for cli_main

namespace py = pybind11;
using namespace membudget;

namespace {

// ---- arguments: each converted by its type, or Error(invalid_argument) naming it ----

std::string type_name(const py::handle& v) { return py::str(py::type::handle_of(v).attr("__name__")); }

Error wrong_type(const char* name, const char* want, const py::handle& v) {
  return Error(ErrorKind::invalid_argument, std::string(name) + ": expected " + want + ", got " + type_name(v));
}

std::string str_arg(const py::handle& v, const char* name) {
  if (!py::isinstance<py::str>(v)) throw wrong_type(name, "a str", v);
  return v.cast<std::string>();
}

// An int (not a bool) in [0, 2^64): a Python int beyond 64 bits is refused, never wrapped.
std::uint64_t u64_arg(const py::handle& v, const char* name) {
  if (!py::isinstance<py::int_>(v) || py::isinstance<py::bool_>(v)) throw wrong_type(name, "an int", v);
  if (v < py::int_(0) || v > py::int_(std::numeric_limits<std::uint64_t>::max()))
    throw Error(ErrorKind::invalid_argument,
                std::string(name) + ": " + std::string(py::str(v)) + " is outside 0 .. 2^64-1");
  return v.cast<std::uint64_t>();
}

double float_arg(const py::handle& v, const char* name) {
  if (py::isinstance<py::bool_>(v) || !(py::isinstance<py::float_>(v) || py::isinstance<py::int_>(v)))
    throw wrong_type(name, "a float", v);
  return v.cast<double>();
}

std::vector<std::uint64_t> u64_list(const py::handle& v, const char* name) {
  if (py::isinstance<py::str>(v) || py::isinstance<py::bytes>(v) || !py::isinstance<py::sequence>(v))
    throw wrong_type(name, "a list of ints", v);
  std::vector<std::uint64_t> out;
  for (const auto& item : v.cast<py::sequence>()) out.push_back(u64_arg(item, name));
  return out;
}

std::vector<std::string> str_list(const py::handle& v, const char* name) {
  if (py::isinstance<py::str>(v) || py::isinstance<py::bytes>(v) || !py::isinstance<py::sequence>(v))
    throw wrong_type(name, "a list of str", v);
  std::vector<std::string> out;
  for (const auto& item : v.cast<py::sequence>()) out.push_back(str_arg(item, name));
  return out;
}

// A model argument: a membudget.Model (copied, so no Python object is touched without the GIL) or
// a path to load once the GIL is released.
using ModelArg = std::variant<ModelSpec, std::string>;

ModelArg model_arg(const py::object& m) {
  if (py::isinstance<ModelSpec>(m)) return m.cast<ModelSpec>();
  if (py::isinstance<py::str>(m)) return m.cast<std::string>();
  if (py::hasattr(m, "__fspath__")) return str_arg(m.attr("__fspath__")(), "model (os.fspath)");
  throw wrong_type("model", "a path (str or os.PathLike) to a spec / config.json, or a membudget.Model", m);
}

ModelSpec resolve(ModelArg m) {  // without the GIL
  if (auto* path = std::get_if<std::string>(&m)) return load_model(*path);
  return std::get<ModelSpec>(std::move(m));
}

// Job options from keyword arguments (any value is read through str(): 2 and "2" are the same);
// an option the job's mode does not use is refused, as in the CLI.
Job job_of(const py::kwargs& kw) {
  Job j;
  std::vector<std::string> given;
  for (auto item : kw) {
    const std::string key = str_arg(item.first, "keyword");
    set_job_option(j, key, py::str(item.second).cast<std::string>());
    given.push_back(key);
  }
  j.validate();
  check_options_apply(j, given);
  return j;
}

std::optional<Device> device_arg(const py::object& device, const py::object& capacity) {
  if (!device.is_none()) {
    const std::string name = str_arg(device, "device");
    if (u64_arg(capacity, "capacity") != 0)
      throw Error(ErrorKind::invalid_argument, "give device= or capacity=, not both");
    return find_device(name);
  }
  const std::uint64_t c = u64_arg(capacity, "capacity");
  if (c == 0) return std::nullopt;
  return Device{"custom", c};
}

Device required_device(const py::object& device, const py::object& capacity) {
  auto d = device_arg(device, capacity);
  if (!d) throw Error(ErrorKind::invalid_argument, "give device='H100' or capacity=<bytes>");
  return *d;
}

py::object loads(const std::string& s) { return py::module_::import("json").attr("loads")(s); }

py::dict estimate_dict(const Estimate& e) { return loads(to_json(e)).cast<py::dict>(); }

// Runs f() with the GIL released (f must not touch Python objects).
template <typename F>
auto nogil(F&& f) {
  py::gil_scoped_release release;
  return f();
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

PYBIND11_MODULE(_core, m) {
  m.doc() = "membudget's compiled core: the library's API (docs/api.md) and the command line (cli_main)";
  m.attr("__version__") = "0.1.0";
  static py::exception<Error> error_type(m, "Error", PyExc_ValueError);
  // Messages quote the input (names, keys, file names): escaped, so they are valid UTF-8 and carry
  // no terminal control characters.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      PyErr_SetString(error_type.ptr(), printable(e.what()).c_str());
    }
  });

  py::class_<ModelSpec>(m, "Model")
      .def_readonly("name", &ModelSpec::name)
      .def_readonly("num_layers", &ModelSpec::num_layers)
      .def_readonly("hidden_size", &ModelSpec::hidden_size)
      .def_readonly("vocab_size", &ModelSpec::vocab_size)
      .def_readonly("max_positions", &ModelSpec::max_positions)
      .def_property_readonly("parameters", [](const ModelSpec& s) { return s.parameters().total; })
      .def_static("from_yaml",
                  [](const py::object& text) {
                    const std::string t = str_arg(text, "text");
                    return nogil([&] { return parse_model_yaml(t); });
                  })
      .def_static("from_config_json",
                  [](const py::object& text) {
                    const std::string t = str_arg(text, "text");
                    return nogil([&] { return parse_hf_config(t); });
                  })
      .def("__repr__", [](const ModelSpec& s) {
        return "<membudget.Model " + s.name + ": " + std::to_string(s.parameters().total) + " parameters>";
      });

  m.def("clear_cache", [] { clear_estimate_cache(); }, "Empties this thread's compiled plans and memo table of estimates.");

  m.def(
      "load_model",
      [](const py::object& path) {
        ModelArg a = model_arg(path);
        if (std::holds_alternative<ModelSpec>(a)) throw wrong_type("path", "a str or os.PathLike", path);
        return nogil([&] { return resolve(std::move(a)); });
      },
      py::arg("path"), "A model from our YAML schema or a Hugging Face config.json.");

  m.def(
      "from_training_arguments",
      [](const py::object& model, const py::object& args) {
        // the JSON transformers writes: TrainingArguments.to_json_string(), a dict, or the text itself
        std::string text;
        if (py::isinstance<py::str>(args)) text = args.cast<std::string>();
        else if (py::isinstance<py::dict>(args)) text = py::module_::import("json").attr("dumps")(args).cast<std::string>();
        else if (py::hasattr(args, "to_json_string")) text = args.attr("to_json_string")().cast<std::string>();
        else throw wrong_type("args", "a TrainingArguments, its dict or its JSON text", args);
        ModelArg a = model_arg(model);
        const ModelSpec spec = resolve(std::move(a));
        const Job j = apply_training_arguments(Job{}, text, "TrainingArguments");
        j.validate();
        (void)spec;  // the model is resolved so that a bad path fails here, with the job
        py::dict out;
        out["batch"] = j.batch;
        out["precision"] = to_string(j.precision);
        out["optimizer"] = to_string(j.optimizer);
        if (j.optimizer_impl) out["optimizer_impl"] = to_string(*j.optimizer_impl);
        out["recompute"] = to_string(j.recompute);
        if (j.grad_accum_steps > 1) out["grad_accum_steps"] = j.grad_accum_steps;
        return out;
      },
      py::arg("model"), py::arg("args"),
      "The job a Hugging Face Trainer runs with these TrainingArguments (the object, its to_dict() or its JSON), as "
      "predict()'s keyword arguments: predict(model, seq=2048, **from_training_arguments(model, args)). Settings that "
      "change memory in a way not modelled (fp16, fsdp, ...) raise membudget.Error naming the field; "
      "gradient_accumulation_steps above 1 is grad_accum_steps.");

  m.def(
      "predict",
      [](const py::object& model, bool reserved, const std::string& allocator_conf, const py::kwargs& kw) {
        ModelArg a = model_arg(model);
        const Job j = job_of(kw);
        PredictOptions po;
        po.reserved = reserved;
        po.allocator_conf = allocator_conf;
        const std::string s = nogil(
            [&] { return to_json_string(predict(resolve(std::move(a)), j, po), std::nullopt, false, -1); });
        return loads(s);
      },
      py::arg("model"), py::kw_only(), py::arg("reserved") = true, py::arg("allocator_conf") = "",
      "The full budget as a dict (the JSON of `membudget predict --format json`, reserved memory included: "
      "reserved=False skips its replay; allocator_conf is a PYTORCH_CUDA_ALLOC_CONF string). Job options are "
      "keyword arguments: batch=4, seq=4096, precision='amp-bf16', optimizer, optimizer_impl, recompute, attention, loss, …");

  m.def(
      "estimate",
      [](const py::object& model, const py::kwargs& kw) {
        ModelArg a = model_arg(model);
        const Job j = job_of(kw);
        return estimate_dict(nogil([&] { return estimate(resolve(std::move(a)), j); }));
      },
      py::arg("model"), "The numbers only (peak, required, terms, phases): from a plan compiled per (model, recipe), microseconds.");

  m.def(
      "fits",
      [](const py::object& model, const py::object& device, const py::object& capacity, const py::object& headroom,
         bool reserved, const std::string& allocator_conf, const py::kwargs& kw) {
        ModelArg a = model_arg(model);
        const Device dev = required_device(device, capacity);
        const double h = float_arg(headroom, "headroom");
        const Job j = job_of(kw);
        const FitResult f = nogil([&] { return fits(resolve(std::move(a)), j, dev, h, reserved, allocator_conf); });
        py::dict d;
        d["fits"] = f.fits;
        d["required"] = f.required;
        d["basis"] = f.on_reserved ? "reserved" : "allocated";
        d["limit"] = f.limit;
        d["capacity"] = f.capacity;
        d["estimate"] = estimate_dict(f.estimate);
        return d;
      },
      py::arg("model"), py::arg("device") = py::none(), py::arg("capacity") = 0, py::arg("headroom") = 0.05,
      py::arg("reserved") = false, py::arg("allocator_conf") = "");

  m.def(
      "max_micro_batch",
      [](const py::object& model, const py::object& device, const py::object& capacity, const py::object& headroom,
         const py::object& global_batch, const py::object& data_parallel, bool reserved,
         const std::string& allocator_conf, const py::kwargs& kw) {
        ModelArg a = model_arg(model);
        const Device dev = required_device(device, capacity);
        SearchOptions o;
        o.headroom = float_arg(headroom, "headroom");
        o.global_batch = u64_arg(global_batch, "global_batch");
        o.data_parallel = u64_arg(data_parallel, "data_parallel");
        o.reserved = reserved;
        o.allocator_conf = allocator_conf;
        const Job j = job_of(kw);
        const MaxBatchResult r = nogil([&] { return max_micro_batch(resolve(std::move(a)), j, dev, o); });
        py::dict d = search_dict("max_micro_batch", r.max_micro_batch, r);
        d["at_limit"] = r.at_limit;
        d["estimate"] = estimate_dict(r.at_max);
        if (o.global_batch) {
          d["accum_micro_batch"] = r.accum_micro_batch;
          d["grad_accum_steps"] = r.grad_accum_steps;
          d["data_parallel"] = r.data_parallel;
        }
        d["evaluations"] = r.evaluations;
        if (r.reserved_required) d["reserved_required"] = r.reserved_required;
        d["basis"] = r.reserved_required ? "reserved" : "allocated";
        return d;
      },
      py::arg("model"), py::arg("device") = py::none(), py::arg("capacity") = 0, py::arg("headroom") = 0.05,
      py::arg("global_batch") = 0, py::arg("data_parallel") = 1, py::arg("reserved") = false,
      py::arg("allocator_conf") = "",
      "The largest micro-batch that fits (0: none) and the estimate there; reserved=True decides on the reserved "
      "memory + overhead (what nvidia-smi shows), as `membudget max-batch` does.");

  m.def(
      "max_sequence_length",
      [](const py::object& model, const py::object& device, const py::object& capacity, const py::object& headroom,
         const py::object& multiple_of, const py::kwargs& kw) {
        ModelArg a = model_arg(model);
        const Device dev = required_device(device, capacity);
        SearchOptions o;
        o.headroom = float_arg(headroom, "headroom");
        o.multiple_of = u64_arg(multiple_of, "multiple_of");
        const Job j = job_of(kw);
        const MaxSeqResult r = nogil([&] { return max_sequence_length(resolve(std::move(a)), j, dev, o); });
        return search_dict("max_seq", r.max_seq, r);
      },
      py::arg("model"), py::arg("device") = py::none(), py::arg("capacity") = 0, py::arg("headroom") = 0.05,
      py::arg("multiple_of") = 1);

  m.def(
      "sweep",
      [](const py::object& model, const py::object& batches, const py::object& seqs, const py::object& precisions,
         const py::object& device, const py::object& capacity, const py::object& headroom, bool reserved,
         const py::kwargs& kw) {
        ModelArg a = model_arg(model);
        SweepGrid g;
        g.batches = u64_list(batches, "batches");
        g.seqs = u64_list(seqs, "seqs");
        const std::vector<std::string> names = str_list(precisions, "precisions");
        for (const auto& p : names) g.precisions.push_back(parse_precision(p));
        const std::optional<Device> dev = device_arg(device, capacity);
        const double h = float_arg(headroom, "headroom");
        const Job j = job_of(kw);
        if (!names.empty()) check_options_apply(j, {"precision"});
        const auto points = nogil([&] { return sweep(resolve(std::move(a)), j, g, dev, h, reserved); });
        py::list out;
        for (const auto& p : points) {
          py::dict d;
          d["batch"] = p.batch;
          d["seq"] = p.seq;
          d["precision"] = to_string(p.precision);
          d["ok"] = p.ok;
          if (p.ok) {
            d["peak"] = p.estimate.peak;
            d["required"] = p.estimate.required;
            if (dev) d["fits"] = p.fits;
            if (dev) d["basis"] = p.on_reserved ? "reserved" : "allocated";
            if (p.reserved_required) d["reserved_required"] = p.reserved_required;
            d["beyond_max_positions"] = p.beyond_max_positions;
          } else {
            d["error"] = printable(p.error);
          }
          out.append(d);
        }
        return out;
      },
      py::arg("model"), py::arg("batches") = py::list(), py::arg("seqs") = py::list(), py::arg("precisions") = py::list(),
      py::arg("device") = py::none(), py::arg("capacity") = 0, py::arg("headroom") = 0.05,
      py::arg("reserved") = false);

  m.def(
      "cli_main",
      [](const std::vector<std::string>& argv) {
        if (argv.empty()) throw Error(ErrorKind::invalid_argument, "cli_main: argv needs the program name first");
        std::vector<const char*> raw;
        raw.reserve(argv.size());
        for (const auto& a : argv) raw.push_back(a.c_str());
        py::module_::import("sys").attr("stdout").attr("flush")();
        return nogil([&] { return cli::run(static_cast<int>(raw.size()), raw.data()); });
      },
      py::arg("argv"),
      "Runs the membudget command line (argv[0] is the program name) in this process, writing to the process's "
      "stdout and stderr, and returns its exit status: what `python -m membudget` calls.");
}
