// entry.cpp: the web page's one entry point into membudget, the command line itself.
//
// The page builds an argv from its knobs (or a self-test case), writes dropped files into
// emscripten's in-memory file system, and calls mb_run with the argv as a JSON array of strings.
// mb_run runs cli::run, the same function the native executable's main() calls, so the page and
// the CLI share one code path: every byte the page shows is what `membudget ...` prints. stdout and
// stderr are collected byte by byte on the JavaScript side (web/app.js); here they are flushed so
// that nothing stays in a C buffer between two calls.
#include <emscripten/emscripten.h>

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli.hpp"

extern "C" EMSCRIPTEN_KEEPALIVE int mb_run(const char* argv_json) {
  std::vector<std::string> args;
  try {
    const auto j = nlohmann::json::parse(argv_json);
    if (!j.is_array()) throw std::invalid_argument("not an array");
    for (const auto& a : j) args.push_back(a.get<std::string>());
  } catch (const std::exception& e) {
    std::cerr << "membudget: error: mb_run expects a JSON array of strings (" << e.what() << ")\n";
    std::cerr.flush();
    return 2;
  }
  args.insert(args.begin(), "membudget");  // argv[0], as the shell gives it
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  const int code = membudget::cli::run(static_cast<int>(argv.size()), argv.data());
  std::cout.flush();
  std::cerr.flush();
  std::fflush(stdout);
  std::fflush(stderr);
  return code;
}
