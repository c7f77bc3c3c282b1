// Runs the built membudget binary: `oom` and `leaks`, their JSON and their exit codes.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace fs = std::filesystem;

namespace {

struct Run {
  int code = -1;
  std::string out;
};

// Runs `membudget <args>` through the shell, capturing stdout (stderr to stdout when asked).
Run membudget(const std::string& args, bool with_stderr = false) {
  std::string cmd = std::string("'") + MEMBUDGET_CLI + "' " + args + (with_stderr ? " 2>&1" : "");
  Run r;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  std::size_t n = 0;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           ("membudget_cli_oom_" + std::to_string(static_cast<long long>(::getpid())));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path write(const std::string& name, const std::string& content) const {
    std::ofstream(path / name, std::ios::binary) << content;
    return path / name;
  }
};

// github.com/pytorch/pytorch/issues/138002
const char* kHip =
    "Traceback (most recent call last):\n"
    "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 6.64 GiB. GPU 0 has a total "
    "capacity of 19.92 GiB of which 6.22 GiB is free. Of the allocated memory 5.34 GiB is "
    "allocated by PyTorch, and 7.10 GiB is reserved by PyTorch but unallocated.\n";

}  // namespace

TEST_CASE("membudget oom --file --format json") {
  TempDir dir;
  auto f = dir.write("oom.txt", kHip);
  Run r = membudget("oom --file '" + f.string() + "' --format json");
  CHECK(r.code == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["requested"] == 7129645711ull);
  CHECK(j["capacity"] == 21388937134ull);
  CHECK(j["free"] == 6678674145ull);
  CHECK(j["allocated"] == 5733781340ull);
  CHECK(j["reserved_unallocated"] == 7623566950ull);
  CHECK(j["classification"] == "fragmentation");
  CHECK(j["first_fix"].get<std::string>().find("expandable_segments:True") != std::string::npos);
  CHECK(j["line"] == 2);
}

TEST_CASE("membudget oom: a log of several messages reads the first and lists the others") {
  TempDir dir;
  const std::string gpu1 =
      "[rank1]: CUDA out of memory. Tried to allocate 8.00 GiB. GPU 1 has a total capacity of 79.10 GiB of which\n"
      "[rank1]:  100.00 KiB is free. Of the allocated memory 78.00 GiB is allocated by PyTorch, and 1.00 GiB is\n"
      "[rank1]:  reserved by PyTorch but unallocated.\n";
  auto f = dir.write("two.txt", std::string(kHip) + gpu1);
  Run table = membudget("oom --file '" + f.string() + "'");
  CHECK(table.code == 0);
  CHECK(table.out.find("HIP out-of-memory message at line 2") != std::string::npos);
  CHECK(table.out.find("The input holds 1 more out-of-memory message; the figures above are the first's:") != std::string::npos);
  // (one rank's tag names it too)
  CHECK(table.out.find("  line 3: GPU 1, rank 1, tried to allocate 8.00 GiB, 79.00 GiB reserved: shortage") != std::string::npos);
  Run json = membudget("oom --file '" + f.string() + "' --format json");
  CHECK(json.code == 0);
  const auto j = nlohmann::json::parse(json.out);
  CHECK(j["requested"] == 7129645711ull);  // the first message's figures
  REQUIRE(j["other_messages"].size() == 1);
  CHECK(j["other_messages"][0]["line"] == 3);
  CHECK(j["other_messages"][0]["gpu"] == 1);
  CHECK(j["other_messages"][0]["classification"] == "shortage");
  CHECK(j["other_messages"][0]["rank"] == 1);
  // "-" is standard input, as TEXT or as --file
  for (const char* dash : {"oom - < '", "oom --file - < '"}) {
    Run r = membudget(dash + dir.write("stdin.txt", kHip).string() + "' --format json");
    CHECK_MESSAGE(r.code == 0, dash);
    CHECK(r.out.find("\"requested\": 7129645711") != std::string::npos);
  }
  // one message alone has no list
  CHECK(!nlohmann::json::parse(membudget("oom --file '" + dir.write("one.txt", kHip).string() + "' --format json").out)
             .contains("other_messages"));
}

TEST_CASE("membudget oom reads stdin, takes context flags, prints a table") {
  TempDir dir;
  // vllm-project/vllm issue on Llama-4-Scout, 2xH100 NVL (see test_oom.cpp)
  auto f = dir.write(
      "oom.txt",
      "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.25 GiB. GPU 1 has a total "
      "capacity of 93.02 GiB of which 1.18 GiB is free. Process 2752205 has 91.82 GiB memory in "
      "use. Of the allocated memory 90.63 GiB is allocated by PyTorch, and 120.54 MiB is reserved "
      "by PyTorch but unallocated.");
  Run j = membudget("oom --format json --step 0 < '" + f.string() + "'");
  CHECK(j.code == 0);
  auto json = nlohmann::json::parse(j.out);
  CHECK(json["classification"] == "shortage");
  CHECK(json["situation"] == "first_steps");
  CHECK(json["gpu"] == 1);
  CHECK(json["other_processes"][0]["pid"] == 2752205);
  Run eval = membudget("oom --phase eval --format json < '" + f.string() + "'");
  CHECK(nlohmann::json::parse(eval.out)["situation"] == "eval_only");
  Run t = membudget("oom < '" + f.string() + "'");
  CHECK(t.code == 0);
  CHECK(t.out.find("classification: shortage") != std::string::npos);
  CHECK(t.out.find("first fix:") != std::string::npos);
}

TEST_CASE("membudget oom: text argument, bad input exits 2") {
  Run ok = membudget(std::string("oom --format json \"$(cat <<'EOF'\n") + kHip + "EOF\n)\"");
  CHECK(ok.code == 0);
  Run bad = membudget("oom 'no message here'", true);
  CHECK(bad.code == 2);
  CHECK(bad.out.find("no PyTorch out-of-memory message") != std::string::npos);
  CHECK(membudget("oom --format xml 'x'", true).code == 2);
  CHECK(membudget("oom --phase lunch 'x'", true).code == 2);
  CHECK(membudget("oom --file /nonexistent/oom.txt", true).code == 5);
}

TEST_CASE("membudget leaks: exit 0 flat, 1 leak, 2 bad input") {
  TempDir dir;
  std::string flat = "step,allocated\n", stairs = "step,allocated\n";
  for (int i = 0; i < 12; ++i) {
    flat += std::to_string(i) + "," + std::to_string(i == 0 ? 1000000000 : 3000000000) + "\n";
    stairs += std::to_string(i) + "," + std::to_string(3000000000LL + (i > 5 ? (i - 5) * 41943040LL : 0)) + "\n";
  }
  Run f = membudget("leaks '" + dir.write("flat.csv", flat).string() + "' --format json");
  CHECK(f.code == 0);
  auto fj = nlohmann::json::parse(f.out);
  CHECK(fj["leak"] == false);
  CHECK(fj["start_step"].is_null());
  Run s = membudget("leaks '" + dir.write("stairs.csv", stairs).string() + "' --format json");
  CHECK(s.code == 1);
  auto sj = nlohmann::json::parse(s.out);
  CHECK(sj["leak"] == true);
  CHECK(sj["growth_per_step"] == 41943040);
  CHECK(sj["start_step"] == 5);
  Run t = membudget("leaks '" + (dir.path / "stairs.csv").string() + "'");
  CHECK(t.code == 1);
  CHECK(t.out.find("leak:            yes") != std::string::npos);

  Run garbage = membudget("leaks '" + dir.write("bad.csv", "step,allocated\n0,12\n1,lots\n").string() + "'", true);
  CHECK(garbage.code == 2);
  CHECK(garbage.out.find("bad.csv:3: column 2 (allocated)") != std::string::npos);
  Run pickle = membudget("leaks '" + dir.write("snap.pickle", "\x80\x04").string() + "'", true);
  CHECK(pickle.code == 2);
  CHECK(pickle.out.find("snap.pickle") != std::string::npos);  // a truncated snapshot: a parse error naming it
  CHECK(membudget("leaks", true).code == 2);
}
