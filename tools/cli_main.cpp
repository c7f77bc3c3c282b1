// The command-line tool as a function: the registry of subcommands, the exit status, and run(),
// which both the `membudget` executable (tools/membudget.cpp) and the Python module's
// `python -m membudget` (python/membudget_module.cpp, cli_main) call.
#include <algorithm>
#include <cstdio>
#include <iostream>

#include "cli.hpp"
#include "membudget/error.hpp"
#include "membudget/input.hpp"

namespace membudget::cli {

std::vector<Command>& registry() {
  static std::vector<Command> commands;
  return commands;
}
namespace {
int g_exit_status = 0;
}
void set_exit_status(int code) { g_exit_status = code; }
int exit_status() { return g_exit_status; }

void require_one_of(const std::string& value, const char* flag, std::initializer_list<const char*> choices) {
  std::string names;
  for (const char* c : choices) {
    if (value == c) return;
    names += (names.empty() ? "" : ", ") + std::string(c);
  }
  throw Error(ErrorKind::invalid_argument, std::string(flag) + ": '" + value + "' is not one of " + names);
}

int run(int argc, const char* const* argv) {
  g_exit_status = 0;  // a process may run several commands (the Python module)
  std::cout.clear();
  std::clearerr(stdout);
  CLI::App app{"membudget: predict, measure and explain the GPU memory of a transformer step"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "membudget 0.1.0");
  auto& commands = registry();
  std::sort(commands.begin(), commands.end(), [](const Command& a, const Command& b) { return a.order < b.order; });
  for (auto& c : commands) c.add(app);
  // An option given an empty value (`--batch ''`) is no value: each command reads an empty string
  // as "not given", which silently meant the default. Refused for every command, before it runs.
  for (CLI::App* sub : app.get_subcommands({}))
    sub->parse_complete_callback([sub] {
      for (const CLI::Option* o : sub->get_options())
        if (o->count() > 0 && o->get_type_size() != 0)
          for (const std::string& v : o->results())
            if (v.empty())
              throw Error(ErrorKind::invalid_argument, o->get_name() + ": the value is empty; give one or leave the option out");
    });
  int code = 0;
  try {
    app.parse(argc, argv);
    code = exit_status();
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {  // --help, --version
      code = app.exit(e);
    } else {  // CLI11's own message ("--batch: At Most 1 required but received 2"), as membudget's errors read
      std::cerr << "membudget: error: " << printable(e.what()) << "\nRun with --help for more information.\n";
      code = 2;
    }
  } catch (const Error& e) {
    // Messages quote names, keys and values from the input: escaped for the terminal.
    std::cerr << "membudget: error: " << printable(e.what()) << "\n";
    code = e.exit_code();
  } catch (const std::bad_alloc&) {
    std::cerr << "membudget: error: out of host memory\n";
    code = 3;
  } catch (const std::exception& e) {
    std::cerr << "membudget: internal error: " << printable(e.what()) << "\n";
    code = 70;
  }
  // The output is the command's result: one that cannot be written (a full disk, a closed pipe)
  // is a failure, not an empty success.
  std::cout.flush();
  if (!std::cout || std::fflush(stdout) != 0 || std::ferror(stdout)) {
    std::cerr << "membudget: error: the output could not be written to standard output\n";
    if (code == 0) code = Error(ErrorKind::io, "").exit_code();
  }
  return code;
}

}  // namespace membudget::cli
