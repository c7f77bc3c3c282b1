// cmd_verify_stub.cpp: `verify` in the web page. The native command runs membudget's measurement
// harness (src/measure/, Eigen or CUDA), which the page's wasm leaves out; the subcommand stays
// so that a verify command line gets a clear refusal instead of CLI11's "unknown subcommand".
#include "cli.hpp"
#include "membudget/error.hpp"

namespace membudget::cli {
namespace {

Registrar reg("verify", 20, [](CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("verify", "measure a step with the harness (native CLI only)");
  cmd->allow_extras();
  cmd->callback([] {
    throw Error(ErrorKind::unsupported,
                "verify runs the measurement harness, which the web page does not include; run "
                "`membudget verify` from the native CLI");
  });
});

}  // namespace
}  // namespace membudget::cli
