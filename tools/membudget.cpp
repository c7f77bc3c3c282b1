// membudget: predict, verify and explain the GPU memory of a transformer step.
#include <algorithm>
#include <iostream>

#include "cli.hpp"
#include "membudget/error.hpp"
#include "membudget/input.hpp"

namespace membudget::cli {
std::vector<Command>& registry() {
  static std::vector<Command> commands;
  return commands;
}
static int g_exit_status = 0;
void set_exit_status(int code) { g_exit_status = code; }
int exit_status() { return g_exit_status; }
}  // namespace membudget::cli

int main(int argc, char** argv) {
  using namespace membudget;
  CLI::App app{"membudget: predict, measure and explain the GPU memory of a transformer step"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "membudget 0.1.0");
  auto& commands = cli::registry();
  std::sort(commands.begin(), commands.end(),
            [](const cli::Command& a, const cli::Command& b) { return a.order < b.order; });
  for (auto& c : commands) c.add(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const Error& e) {
    // Messages quote names, keys and values from the input: escaped for the terminal.
    std::cerr << "membudget: error: " << printable(e.what()) << "\n";
    return e.exit_code();
  } catch (const std::bad_alloc&) {
    std::cerr << "membudget: error: out of host memory\n";
    return 3;
  } catch (const std::exception& e) {
    std::cerr << "membudget: internal error: " << printable(e.what()) << "\n";
    return 70;
  }
  return cli::exit_status();
}
