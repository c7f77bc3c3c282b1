#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "membudget/leaks.hpp"

using namespace membudget;

namespace {

std::string csv_error(const std::string& text) {
  try {
    read_steps_csv(text, "steps.csv");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::parse);
    return e.what();
  }
  FAIL("no error for: " << text);
  return {};
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("flat series: no leak") {
  std::vector<bytes_t> a(20, 3 * GiB);
  auto r = detect_leak(a);
  CHECK_FALSE(r.leak);
  CHECK(r.growth_per_step == 0);
  CHECK_FALSE(r.start_step);
  CHECK(r.steps == 20);
}

TEST_CASE("staircase from step 5") {
  std::vector<bytes_t> a;
  for (int i = 0; i < 15; ++i) a.push_back(2 * GiB + (i > 5 ? (i - 5) * 40 * MiB : 0));
  auto r = detect_leak(a);
  CHECK(r.leak);
  CHECK(r.growth_per_step == 40 * MiB);
  REQUIRE(r.start_step);
  CHECK(*r.start_step == 5);
  CHECK(r.growth_total == 9 * 40 * MiB);
}

TEST_CASE("staircase from step 0, and step labels from the CSV") {
  std::vector<bytes_t> a;
  std::vector<std::int64_t> steps;
  for (int i = 0; i < 6; ++i) {
    a.push_back(GiB + i * 512);  // the smallest leak the allocator can make: one 512-byte block
    steps.push_back(100 + 10 * i);
  }
  auto r = detect_leak(a, steps);
  CHECK(r.leak);
  CHECK(r.growth_per_step == 512);
  CHECK(*r.start_step == 100);
}

TEST_CASE("noisy flat series: no leak") {
  std::mt19937_64 rng(7);
  std::normal_distribution<double> noise(0, 4.0 * MiB);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<bytes_t> a;
    for (int i = 0; i < 50; ++i)
      a.push_back(static_cast<bytes_t>(static_cast<double>(10 * GiB) + noise(rng)));
    INFO("trial " << trial);
    CHECK_FALSE(detect_leak(a).leak);
  }
}

TEST_CASE("noisy staircase: leak found, growth close to the true one") {
  std::mt19937_64 rng(11);
  std::normal_distribution<double> noise(0, 1.0 * MiB);
  std::vector<bytes_t> a;
  for (int i = 0; i < 40; ++i)
    a.push_back(static_cast<bytes_t>(static_cast<double>(10 * GiB) +
                                     (i > 20 ? (i - 20) * 16.0 * MiB : 0) + noise(rng)));
  auto r = detect_leak(a);
  CHECK(r.leak);
  CHECK(*r.start_step == 20);
  CHECK(r.growth_per_step > 13 * MiB);
  CHECK(r.growth_per_step < 19 * MiB);
}

TEST_CASE("a one-time jump (optimizer state) is not a leak") {
  std::vector<bytes_t> a{2 * GiB, 6 * GiB, 6 * GiB, 6 * GiB, 6 * GiB, 6 * GiB, 6 * GiB};
  CHECK_FALSE(detect_leak(a).leak);
  // ... nor is it counted in a staircase that follows it.
  std::vector<bytes_t> b{2 * GiB, 6 * GiB, 6 * GiB + 8 * MiB, 6 * GiB + 16 * MiB,
                         6 * GiB + 24 * MiB, 6 * GiB + 32 * MiB};
  auto r = detect_leak(b);
  CHECK(r.leak);
  CHECK(*r.start_step == 1);
  CHECK(r.growth_per_step == 8 * MiB);
  CHECK(contains(r.explanation, "one-time"));
}

TEST_CASE("a sawtooth that climbs back to earlier heights is not a leak") {
  std::vector<bytes_t> a;
  for (int i = 0; i < 20; ++i) a.push_back(GiB + (i % 5) * 100 * MiB);
  CHECK_FALSE(detect_leak(a).leak);
}

TEST_CASE("too few steps and mismatched labels") {
  std::vector<bytes_t> a{1, 2, 3};
  CHECK_FALSE(detect_leak(a).leak);
  std::vector<std::int64_t> steps{1, 2};
  CHECK_THROWS_AS(detect_leak(a, steps), Error);
}

TEST_CASE("CSV: header, single column, units, comments") {
  auto s = read_steps_csv("step,allocated,reserved\n0,100,200\n1,200,300\n\n# note\n5,1.5 GiB,0\n");
  CHECK(s.steps == std::vector<std::int64_t>{0, 1, 5});
  CHECK(s.allocated == std::vector<bytes_t>{100, 200, 1610612736ull});
  auto one = read_steps_csv("1024\n2048\r\n4096\n");
  CHECK(one.steps == std::vector<std::int64_t>{0, 1, 2});
  CHECK(one.allocated == std::vector<bytes_t>{1024, 2048, 4096});
  auto named = read_steps_csv("\xEF\xBB\xBFiter,time,allocated_bytes.all.current\n3,0.1,10\n4,0.2,20\n");
  CHECK(named.steps == std::vector<std::int64_t>{3, 4});
  CHECK(named.allocated == std::vector<bytes_t>{10, 20});
  auto two = read_steps_csv("10,5\n20,6\n");
  CHECK(two.steps == std::vector<std::int64_t>{10, 20});
  CHECK(two.allocated == std::vector<bytes_t>{5, 6});
}

TEST_CASE("CSV: garbage is an error naming the line and the column") {
  std::string e = csv_error("step,allocated\n0,100\n1,abc\n");
  CHECK(contains(e, "steps.csv:3: column 2 (allocated)"));
  CHECK(contains(e, "'abc'"));
  CHECK(contains(csv_error("step,allocated\n0,-5\n"), "steps.csv:2: column 2"));
  CHECK(contains(csv_error("step,allocated\nx,5\n"), "steps.csv:2: column 1 (step)"));
  CHECK(contains(csv_error("step,allocated\n0,5\n0,6\n"), "steps must increase"));
  CHECK(contains(csv_error("step,allocated\n0\n"), "steps.csv:2: expected 2 columns, found 1"));
  CHECK(contains(csv_error("time,reserved\n0,5\n"), "no 'allocated' column"));
  CHECK(contains(csv_error("step,allocated\n0,\n"), "empty"));
  CHECK(contains(csv_error(""), "no data rows"));
  CHECK(contains(csv_error("# only a comment\n"), "no data rows"));
  CHECK(contains(csv_error("1,1e30\n"), "steps.csv:1: column 2"));
}

TEST_CASE("CSV file errors") {
  try {
    read_steps_csv_file("/nonexistent/steps.csv");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::io);
  }
}

TEST_CASE("to_json") {
  std::vector<bytes_t> a;
  for (int i = 0; i < 10; ++i) a.push_back(GiB + (i > 5 ? (i - 5) * MiB : 0));
  const auto j = nlohmann::json::parse(to_json(detect_leak(a)));
  CHECK(j["leak"] == true);
  CHECK(j["growth_per_step"] == MiB);
  CHECK(j["start_step"] == 5);
  const auto flat = nlohmann::json::parse(to_json(detect_leak(std::vector<bytes_t>(10, GiB))));
  CHECK(flat["leak"] == false);
  CHECK(flat["start_step"].is_null());
  CHECK(flat["growth_per_step"] == 0);
}
