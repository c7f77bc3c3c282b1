// The pickle reader and writer: every opcode by hand, CPython's output, round trips, hostile input.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>

#include "diagnose/pickle.hpp"
#include "diagnose/pickle_writer.hpp"
#include "helpers.hpp"
#include "membudget/error.hpp"

using namespace membudget;
using namespace membudget::diagnose;

namespace {

std::string bytes(std::initializer_list<int> b) {
  std::string s;
  for (int c : b) s.push_back(static_cast<char>(c));
  return s;
}

// PROTO 2 + body + STOP
std::string p2(const std::string& body) { return bytes({0x80, 2}) + body + "."; }

PickleValue parse_root(const std::string& s, PickleDocument& keep) {
  keep = parse_pickle(s);
  return keep.root();
}

std::string parse_error(const std::string& s) {
  try {
    parse_pickle(s);
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::parse);
    return e.what();
  }
  FAIL("parsed hostile input without an error");
  return {};
}

std::string data_file(const char* name) { return std::string(MEMBUDGET_SOURCE_DIR) + "/tests/data/pickle/" + name; }

}  // namespace

TEST_CASE("scalars: ints of every width, floats, bools, None, strings, bytes") {
  PickleDocument d;
  CHECK(parse_root(p2(bytes({'K', 200})), d).as_int() == 200);
  CHECK(parse_root(p2(bytes({'M', 0x34, 0x12})), d).as_int() == 0x1234);
  CHECK(parse_root(p2(bytes({'J', 0xff, 0xff, 0xff, 0xff})), d).as_int() == -1);
  CHECK(parse_root(p2(bytes({'J', 0, 0, 0, 0x80})), d).as_int() == INT32_MIN);
  CHECK(parse_root(p2(bytes({0x8a, 0})), d).as_int() == 0);
  CHECK(parse_root(p2(bytes({0x8a, 5, 0, 0, 0, 0, 1})), d).as_int() == (1ll << 32));
  CHECK(parse_root(p2(bytes({0x8a, 1, 0xff})), d).as_int() == -1);
  CHECK(parse_root(p2(bytes({0x8a, 9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0})), d).as_uint() == UINT64_MAX);
  CHECK_THROWS_AS(parse_root(p2(bytes({0x8a, 9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0})), d).as_int(), Error);
  CHECK(parse_root(p2(bytes({0x8b, 2, 0, 0, 0, 0x00, 0x80})), d).as_int() == -32768);
  CHECK(parse_root(p2(bytes({'G', 0x3f, 0xf8, 0, 0, 0, 0, 0, 0})), d).as_double() == 1.5);
  CHECK(parse_root(p2(bytes({0x88})), d).as_bool() == true);
  CHECK(parse_root(p2(bytes({0x89})), d).as_bool() == false);
  CHECK(parse_root(p2(bytes({'N'})), d).is_none());
  CHECK(parse_root(p2(bytes({0x8c, 2}) + "hi"), d).as_string() == "hi");
  CHECK(parse_root(p2(bytes({'X', 3, 0, 0, 0}) + "abc"), d).as_string() == "abc");
  CHECK(parse_root(p2(bytes({0x8d, 1, 0, 0, 0, 0, 0, 0, 0}) + "z"), d).as_string() == "z");
  CHECK(parse_root(p2(bytes({'C', 2, 0, 1})), d).as_bytes() == std::string("\0\1", 2));
  CHECK(parse_root(p2(bytes({'B', 1, 0, 0, 0, 7})), d).as_bytes() == std::string("\7", 1));
  CHECK(parse_root(p2(bytes({0x8e, 0, 0, 0, 0, 0, 0, 0, 0})), d).as_bytes().empty());
}

TEST_CASE("containers: dict, list, tuples, MARK forms and the memo") {
  PickleDocument d;
  // {'a': 1, 'b': [2, 3]} via SETITEM and APPENDS
  auto v = parse_root(p2(bytes({'}', 0x8c, 1, 'a', 'K', 1, 's', 0x8c, 1, 'b', ']', '(', 'K', 2, 'K', 3, 'e', 's'})), d);
  CHECK(v.repr() == "{'a': 1, 'b': [2, 3]}");
  CHECK(v.at("b").items().size() == 2);
  CHECK(v.depth() == 2);
  // SETITEMS, APPEND
  v = parse_root(p2(bytes({'}', '(', 'K', 1, 'N', 'K', 2, ']', 'K', 9, 'a', 'u'})), d);
  CHECK(v.repr() == "{1: None, 2: [9]}");
  // tuples
  CHECK(parse_root(p2(bytes({')'})), d).repr() == "()");
  CHECK(parse_root(p2(bytes({'K', 1, 0x85})), d).repr() == "(1,)");
  CHECK(parse_root(p2(bytes({'K', 1, 'K', 2, 0x86})), d).repr() == "(1, 2)");
  CHECK(parse_root(p2(bytes({'K', 1, 'K', 2, 'K', 3, 0x87})), d).repr() == "(1, 2, 3)");
  CHECK(parse_root(p2(bytes({'(', 'K', 1, 'K', 2, 'K', 3, 'K', 4, 't'})), d).repr() == "(1, 2, 3, 4)");
  // memo: BINPUT / BINGET, LONG_BINPUT / LONG_BINGET, MEMOIZE
  v = parse_root(p2(bytes({']', '(', 0x8c, 1, 'x', 'q', 5, 'h', 5, 'r', 1, 0, 0, 0, 'j', 1, 0, 0, 0, 'e'})), d);
  CHECK(v.repr() == "['x', 'x', 'x']");
  // protocol 4: FRAME, MEMOIZE; a finished list referenced twice
  v = parse_root(bytes({0x80, 4, 0x95, 10, 0, 0, 0, 0, 0, 0, 0, ']', 0x94, '(', 'K', 1, 'e', 'h', 0, 0x86, '.'}), d);
  CHECK(d.protocol() == 4);
  CHECK(v.repr() == "([1], [1])");
}

TEST_CASE("typed access reports the wrong type") {
  PickleDocument d;
  auto v = parse_root(p2(bytes({'K', 1})), d);
  CHECK_THROWS_AS(v.as_string("segments"), Error);
  CHECK_THROWS_AS(v.items("blocks"), Error);
  CHECK(v.find("x") == nullptr);
  CHECK(v.as_double() == 1.0);
  auto m = parse_root(p2(bytes({'J', 0xff, 0xff, 0xff, 0xff})), d);
  CHECK_THROWS_AS(m.as_uint("size"), Error);
}

TEST_CASE("CPython's protocol 2 and 4 pickles read back exactly") {
  for (const char* name : {"cpython_protocol2.pickle", "cpython_protocol4.pickle"}) {
    CAPTURE(name);
    PickleDocument d = read_pickle_file(data_file(name));
    const PickleValue& r = d.root();
    REQUIRE(r.is_dict());
    CHECK(r.at("ints").repr() ==
          "[0, 1, 255, 256, 65535, 65536, -1, -2147483648, 2147483647, 2147483648, -2147483649, "
          "9223372036854775807, -9223372036854775808, 18446744073709551615, 1099511627776]");
    CHECK(r.at("floats").repr() == "[0.5, -1.0000000000000001e+300, 3.25]");
    CHECK(r.at("nested").repr() ==
          "{'t': (1, (2, (3,))), 'e': (), 'l': [[], {}], 'none': None, 'b': [True, False]}");
    CHECK(r.at("unicode").as_string() == "h\xc3\xa9llo \xe2\x98\x83");
    CHECK(r.at("shared").repr() == "[['frame', 7], ['frame', 7]]");
    const auto& longs = r.at("long_list").items();
    REQUIRE(longs.size() == 2500);
    for (std::size_t i = 0; i < longs.size(); ++i) CHECK(longs[i].as_int() == static_cast<std::int64_t>(i));
    CHECK(r.at("repeated").repr() == "['address', 'address', 'address']");
    bool int_key = false, tuple_key = false;
    for (const auto& [k, v] : r.entries()) {
      if (k.is_int() && k.as_int() == 1) int_key = v.as_string() == "int key";
      if (k.is_tuple() && k.repr() == "(1, 2)") tuple_key = v.as_string() == "tuple key";
    }
    CHECK(int_key);
    CHECK(tuple_key);
  }
  PickleDocument d4 = read_pickle_file(data_file("cpython_protocol4.pickle"));
  CHECK(d4.protocol() == 4);
  CHECK(d4.root().at("bytes").as_bytes() == std::string("\0\1\xff", 3));
}

TEST_CASE("the writer round-trips every kind of value through the reader") {
  PickleWriter w;
  w.begin_dict();
  w.string("ints");
  w.begin_list();
  for (std::int64_t v : std::initializer_list<std::int64_t>{0ll, 1ll, 255ll, 256ll, 65535ll, 65536ll, -1ll, -129ll, 2147483647ll, 2147483648ll,
                         -2147483648ll, -2147483649ll, 1099511627776ll, INT64_MAX, INT64_MIN, -(1ll << 40)})
    w.integer(v);
  w.uinteger(UINT64_MAX);
  w.uinteger(1ull << 63);
  w.end_list();
  w.string("f");
  w.floating(-0.125);
  w.string("t");
  w.begin_tuple();
  w.integer(0);
  w.integer(0);
  w.end_tuple();
  w.string("empty");
  w.begin_tuple();
  w.end_tuple();
  w.string("flags");
  w.begin_list();
  w.boolean(true);
  w.boolean(false);
  w.none();
  w.end_list();
  w.string("big");
  w.begin_list();
  for (int i = 0; i < 2345; ++i) w.integer(i);
  w.end_list();
  w.string("bigdict");
  w.begin_dict();
  for (int i = 0; i < 1500; ++i) {
    w.integer(i);
    w.string("v" + std::to_string(i % 300));  // > 256 memo entries: LONG_BINPUT / LONG_BINGET
  }
  w.end_dict();
  w.end_dict();
  std::string out = w.finish();

  PickleDocument d = parse_pickle(out);
  const PickleValue& r = d.root();
  CHECK(r.at("ints").repr() ==
        "[0, 1, 255, 256, 65535, 65536, -1, -129, 2147483647, 2147483648, -2147483648, -2147483649, "
        "1099511627776, 9223372036854775807, -9223372036854775808, -1099511627776, 18446744073709551615, "
        "9223372036854775808]");
  CHECK(r.at("f").as_double() == -0.125);
  CHECK(r.at("t").repr() == "(0, 0)");
  CHECK(r.at("empty").repr() == "()");
  CHECK(r.at("flags").repr() == "[True, False, None]");
  REQUIRE(r.at("big").size() == 2345);
  CHECK(r.at("big").items()[2344].as_int() == 2344);
  const auto& e = r.at("bigdict").entries();
  REQUIRE(e.size() == 1500);
  CHECK(e[1499].first.as_int() == 1499);
  CHECK(e[1499].second.as_string() == "v299");
  CHECK(e[600].second.as_string() == "v0");
}

TEST_CASE("the writer memoizes repeated strings") {
  PickleWriter once;
  once.begin_list();
  once.string("address");
  once.end_list();
  PickleWriter many;
  many.begin_list();
  for (int i = 0; i < 100; ++i) many.string("address");
  many.end_list();
  CHECK(many.finish().size() == once.finish().size() + 99 * 2);  // each repeat is a 2-byte BINGET
}

TEST_CASE("the writer refuses unbalanced containers") {
  PickleWriter w;
  w.begin_dict();
  w.string("k");
  CHECK_THROWS_AS(w.end_dict(), Error);
  PickleWriter v;
  v.begin_list();
  CHECK_THROWS_AS(v.end_dict(), Error);
  CHECK_THROWS_AS(v.finish(), Error);
}

TEST_CASE("hostile input: each failure is a parse error with offset and opcode") {
  // empty, truncated, no STOP
  CHECK(parse_error("").find("byte 0") != std::string::npos);
  CHECK(parse_error(bytes({0x80, 2, 'K'})).find("BININT1") != std::string::npos);
  CHECK(parse_error(bytes({0x80, 2, 'N'})).find("before STOP") != std::string::npos);
  // lengths past the end, huge declared sizes
  CHECK(parse_error(p2(bytes({'X', 0xff, 0xff, 0xff, 0x7f}) + "ab")).find("BINUNICODE") != std::string::npos);
  CHECK(parse_error(p2(bytes({0x8d, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}))).find("bytes") != std::string::npos);
  CHECK(parse_error(bytes({0x80, 4, 0x95, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 'N', '.'})).find("FRAME") !=
        std::string::npos);
  CHECK(parse_error(p2(bytes({0x8b, 0xff, 0xff, 0xff, 0x7f}))).find("LONG4") != std::string::npos);
  CHECK(parse_error(p2(bytes({0x8b, 0xff, 0xff, 0xff, 0xff}))).find("negative") != std::string::npos);
  CHECK(parse_error(p2(bytes({0x8a, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}))).find("64 bits") != std::string::npos);
  // unknown and refused opcodes
  std::string unknown = parse_error(p2(bytes({0xfe})));
  CHECK(unknown.find("byte 2") != std::string::npos);
  CHECK(unknown.find("0xfe") != std::string::npos);
  CHECK(parse_error(p2("cos\nsystem\n")).find("GLOBAL") != std::string::npos);
  CHECK(parse_error(p2(bytes({'N', 'N', 'R'}))).find("REDUCE") != std::string::npos);
  CHECK(parse_error(bytes({0x80, 9, 'N', '.'})).find("protocol 9") != std::string::npos);
  // stack underflow, marks
  CHECK(parse_error(p2(bytes({'a'}))).find("underflow") != std::string::npos);
  CHECK(parse_error(p2(bytes({'s'}))).find("underflow") != std::string::npos);
  CHECK(parse_error(p2(bytes({0x87}))).find("underflow") != std::string::npos);
  CHECK(parse_error(p2(bytes({'K', 1, '(', 0x85}))).find("underflow") != std::string::npos);
  CHECK(parse_error(p2(bytes({'e'}))).find("MARK") != std::string::npos);
  CHECK(parse_error(p2(bytes({'(', 'K', 1, 'e'}))).find("underflow") != std::string::npos);
  CHECK(parse_error(p2(bytes({'K', 1, '(', 'K', 1, 'e'}))).find("list") != std::string::npos);
  CHECK(parse_error(p2(bytes({'}', '(', 'K', 1, 'u'}))).find("odd") != std::string::npos);
  CHECK(parse_error(p2(bytes({'(', 'N'}))).find("MARK") != std::string::npos);
  CHECK(parse_error(p2(bytes({'N', 'N'}))).find("2 values") != std::string::npos);
  // memo
  CHECK(parse_error(p2(bytes({'h', 3}))).find("memo index 3") != std::string::npos);
  CHECK(parse_error(p2(bytes({'j', 0xff, 0xff, 0xff, 0xff}))).find("never stored") != std::string::npos);
  CHECK(parse_error(p2(bytes({'q', 0}))).find("memoize") != std::string::npos);
  // a sparse LONG_BINPUT index allocates nothing large and still works
  PickleDocument d = parse_pickle(p2(bytes({'K', 7, 'r', 0xff, 0xff, 0xff, 0xff, 'N', 0x86, 'j', 0xff, 0xff, 0xff, 0xff, 0x86})));
  CHECK(d.root().repr() == "((7, None), 7)");
}

TEST_CASE("hostile input: recursion, depth and expansion bombs are refused") {
  // a list appended to itself
  CHECK(parse_error(p2(bytes({']', 'q', 0, 'h', 0, 'a'}))).find("itself") != std::string::npos);
  // the two-list cycle: Z=[Y], Y=[X]; then X.append(Y)
  std::string cycle = bytes({']', ']', 'q', 0, ']', 'q', 1, 'a', 'a', 'h', 1, 'h', 0, 'a', 'a'});
  CHECK(parse_error(p2(cycle)).find("recursive") != std::string::npos);
  // deep nesting with constant stack: TUPLE1 repeated
  std::string deep = "N" + std::string(kMaxPickleDepth + 5, static_cast<char>(0x85));
  CHECK(parse_error(p2(deep)).find("deeper") != std::string::npos);
  std::string ok = "N" + std::string(kMaxPickleDepth - 1, static_cast<char>(0x85));
  CHECK(parse_pickle(p2(ok)).root().depth() == kMaxPickleDepth - 1);
  // a billion-laughs DAG: each level holds the previous one twice
  std::string bomb = bytes({'N', 'q', 0});
  for (int i = 0; i < 60; ++i) bomb += bytes({'h', 0, 'h', 0, 0x86, 'q', 0});
  CHECK(parse_error(p2(bomb)).find("expands") != std::string::npos);
  // many MARKs
  std::string marks(kMaxPickleStack + 10, '(');
  CHECK(parse_error(p2(marks)).find("stack") != std::string::npos);
}

TEST_CASE("a 10 MB pickle parses well under a second") {
  PickleWriter w;
  w.begin_dict();
  w.string("segments");
  w.begin_list();
  int blocks = 0;
  for (int s = 0; s < 6600; ++s) {
    w.begin_dict();
    w.string("address");
    w.uinteger(0x7f0000000000ull + s * (1ull << 21));
    w.string("total_size");
    w.integer(1 << 21);
    w.string("blocks");
    w.begin_list();
    for (int b = 0; b < 40; ++b, ++blocks) {
      w.begin_dict();
      w.string("address");
      w.uinteger(0x7f0000000000ull + s * (1ull << 21) + b * 512);
      w.string("size");
      w.integer(512);
      w.string("state");
      w.string(b % 2 ? "active_allocated" : "inactive");
      w.string("frames");
      w.begin_list();
      w.begin_dict();
      w.string("filename");
      w.string("membudget/harness");
      w.string("name");
      w.string("forward:layers." + std::to_string(b) + ".mlp (matmul)");
      w.end_dict();
      w.end_list();
      w.end_dict();
    }
    w.end_list();
    w.end_dict();
  }
  w.end_list();
  w.end_dict();
  std::string big = w.finish();
  CHECK(big.size() > 10'000'000);
  // Best of three, so a busy machine does not make the test flaky.
  double s = 1e9;
  for (int run = 0; run < 3; ++run) {
    auto t0 = std::chrono::steady_clock::now();
    PickleDocument d = parse_pickle(big);
    s = std::min(s, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    CHECK(d.root().at("segments").size() == 6600);
  }
  CHECK(s < 1.0 * test::kTimeScale);
  MESSAGE("parsed " << blocks << " blocks in " << s << " s");
}
