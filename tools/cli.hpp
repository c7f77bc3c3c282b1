// tools/cli.hpp: how subcommands plug into the membudget command-line tool.
//
// Each subcommand lives in its own tools/cmd_<name>.cpp and registers itself with a static
// Registrar; run() (tools/cli_main.cpp) builds the CLI11 app from the registry, runs it, and maps
// membudget::Error to exit codes in one place: the executable's main() and the Python module's
// cli_main() both call it. A subcommand reports a non-error failure (a job that
// does not fit, a verify outside tolerance) through set_exit_status().
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

namespace membudget::cli {

struct Command {
  std::string name;
  int order;                                  // position in --help
  std::function<void(CLI::App& parent)> add;  // adds the subcommand and its callback to parent
};

std::vector<Command>& registry();
void set_exit_status(int code);
int exit_status();

// Runs one command line (argv[0] is the program name) and returns its exit status: 0, 1 for a
// non-error failure (set_exit_status), 2 for bad input, 3 out of host memory, 70 internal.
int run(int argc, const char* const* argv);

// Refuses `value` for `flag` unless it is one of `choices`, naming them. (Not CLI11's IsMember: its
// check runs before the empty-value check of every option, and says "--format:  not in {table,json}".)
void require_one_of(const std::string& value, const char* flag, std::initializer_list<const char*> choices);

struct Registrar {
  Registrar(std::string name, int order, std::function<void(CLI::App&)> add) {
    registry().push_back({std::move(name), order, std::move(add)});
  }
};

}  // namespace membudget::cli
