// membudget/error.hpp: the one error type of the library.
//
// Every bad input (a malformed spec, a missing or negative field, an unknown option, a byte count
// that would overflow, a failed device call) is reported as a membudget::Error carrying a kind, a
// location ("configs/x.yaml:12: hidden_size") and a message that says what to do. The command-line
// tool maps kinds to exit codes in exactly one place (exit_code()).
#pragma once

#include <stdexcept>
#include <string>

namespace membudget {

enum class ErrorKind {
  invalid_spec,      // a model spec field is missing, negative, inconsistent
  invalid_job,       // a job option is out of range or an unknown enum value
  invalid_argument,  // a command-line or API argument is malformed
  parse,             // a file could not be parsed (YAML, JSON, pickle, OOM text)
  overflow,          // a byte count would not fit in 64 bits
  unsupported,       // a valid combination this version does not implement
  out_of_memory,     // the harness ran out of (real or simulated) device memory
  device,            // a CUDA / cuBLAS call failed
  io,                // a file could not be read or written
};

const char* to_string(ErrorKind kind) noexcept;

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(without_nul(message)), kind_(kind) {}

  ErrorKind kind() const noexcept { return kind_; }

  // Process exit code for the command-line tool: 2 for bad input, 3 for out-of-memory in the
  // harness, 4 for a device failure, 5 for an I/O failure.
  int exit_code() const noexcept;

  // "<where>: <field>: <what>" — where is a file (and line) or an API entry point.
  static Error field(ErrorKind kind, const std::string& where, const std::string& field,
                     const std::string& what) {
    std::string msg = where.empty() ? std::string() : where + ": ";
    msg += field + ": " + what;
    return Error(kind, msg);
  }

 private:
  // what() is a C string: a NUL byte quoted from the input would end the message there
  static std::string without_nul(const std::string& message) {
    if (message.find('\0') == std::string::npos) return message;
    std::string out;
    for (char c : message) out += c == '\0' ? std::string("\\x00") : std::string(1, c);
    return out;
  }
  ErrorKind kind_;
};

inline const char* to_string(ErrorKind kind) noexcept {
  switch (kind) {
    case ErrorKind::invalid_spec: return "invalid model spec";
    case ErrorKind::invalid_job: return "invalid job";
    case ErrorKind::invalid_argument: return "invalid argument";
    case ErrorKind::parse: return "parse error";
    case ErrorKind::overflow: return "overflow";
    case ErrorKind::unsupported: return "unsupported";
    case ErrorKind::out_of_memory: return "out of memory";
    case ErrorKind::device: return "device error";
    case ErrorKind::io: return "I/O error";
  }
  return "error";
}

inline int Error::exit_code() const noexcept {
  switch (kind_) {
    case ErrorKind::out_of_memory: return 3;
    case ErrorKind::device: return 4;
    case ErrorKind::io: return 5;
    default: return 2;
  }
}

}  // namespace membudget
