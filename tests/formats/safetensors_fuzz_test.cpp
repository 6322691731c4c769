// A bounded, deterministic fuzz of the safetensors reader: seeded random mutations of a valid file
// (byte flips, truncations, header-length edits, spliced header text) and random JSON-ish
// headers. Each case must either read, with every tensor inside the data section and holding
// numel(shape) values, or throw stp::Error; never crash, hang, over-read (ASan builds check
// that) or throw anything else. A few thousand cases, well under a second in a release build.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "formats/safetensors.h"
#include "tests/support/files.h"
#include "tests/support/fuzz_text.h"

using namespace stp;
using stp::testing::random_fragments;
using stp::testing::ScratchDir;

namespace {

enum class Outcome { Read, Error };

// Reads `bytes` as a file and checks the invariants of a successful read against the header.
Outcome read_case(const std::string& path, const std::string& bytes) {
  stp::testing::write_bytes(path, bytes);
  try {
    SafetensorsFile f = read_safetensors_file(path);
    std::uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    std::uint64_t data_bytes = bytes.size() - 8 - n;
    SafetensorsHeader h = parse_safetensors_header(std::string_view(bytes).substr(8, n), data_bytes, path);
    EXPECT_EQ(h.tensors.size(), f.tensors.size());
    for (const SafetensorsEntry& e : h.tensors) {
      EXPECT_LE(e.begin, e.end);
      EXPECT_LE(e.end, data_bytes) << e.name;
      const HostTensor& t = f.tensors.at(e.name);
      EXPECT_EQ(static_cast<std::int64_t>(t.data.size()), numel(t.shape)) << e.name;
      EXPECT_EQ(t.shape, e.shape);
    }
    return Outcome::Read;
  } catch (const Error&) {
    return Outcome::Error;
  }  // anything else escapes and fails the test
}

std::string with_header(const std::string& header, const std::string& data) {
  std::uint64_t n = header.size();
  return std::string(reinterpret_cast<const char*>(&n), 8) + header + data;
}

// Random JSON-ish text built from fragments a safetensors header is made of, nested and
// recombined with no regard for validity.
std::string random_header(std::mt19937& rng) {
  static const char* const kTokens[] = {"{",
                                        "}",
                                        "[",
                                        "]",
                                        ",",
                                        ":",
                                        "\"a\"",
                                        "\"b\"",
                                        "\"__metadata__\"",
                                        "\"dtype\"",
                                        "\"shape\"",
                                        "\"data_offsets\"",
                                        "\"F32\"",
                                        "\"BF16\"",
                                        "\"F16\"",
                                        "\"I8\"",
                                        "0",
                                        "1",
                                        "2",
                                        "4",
                                        "8",
                                        "16",
                                        "-1",
                                        "1.5",
                                        "1e3",
                                        "4611686018427387904",
                                        "18446744073709551615",
                                        "18446744073709551616",
                                        "null",
                                        "true",
                                        "\"\\u0000\"",
                                        "\"\\ud800\"",
                                        "\" \"",
                                        "\xff",
                                        "\"x"};
  return random_fragments(kTokens, rng);
}

// A plausible header: one to three entries with random dtype, shape and offsets.
std::string random_entries(std::mt19937& rng) {
  static const char* const kDtypes[] = {"F32", "BF16", "F16", "F64"};
  static const char* const kNums[] = {"0",
                                      "1",
                                      "2",
                                      "3",
                                      "4",
                                      "8",
                                      "12",
                                      "16",
                                      "20",
                                      "24",
                                      "-4",
                                      "2.0",
                                      "1e1",
                                      "9223372036854775807",
                                      "18446744073709551615"};
  auto num = [&] { return std::string(kNums[rng() % (sizeof kNums / sizeof *kNums)]); };
  std::string h = "{";
  int n = 1 + static_cast<int>(rng() % 3);
  for (int i = 0; i < n; ++i) {
    h += (i ? ",\"" : "\"") + std::string(1, static_cast<char>('a' + rng() % 3)) + "\":{\"dtype\":\"" +
         kDtypes[rng() % 4] + "\",\"shape\":[";
    int dims = static_cast<int>(rng() % 3);
    for (int d = 0; d < dims; ++d) h += (d ? "," : "") + num();
    h += "],\"data_offsets\":[" + num() + "," + num() + "]}";
  }
  return h + "}";
}

}  // namespace

TEST(SafetensorsFuzz, MutatedFilesReadOrFailCleanly) {
  ScratchDir dir;
  HostTensor a{{3, 4}, std::vector<float>(12, 1.5f)};
  HostTensor b{{5}, std::vector<float>(5, -2.0f)};
  HostTensor e{{0, 7}, {}};
  std::string good_path = dir.file("good.safetensors");
  write_safetensors(good_path, {{"a", &a}, {"b", &b}, {"e", &e}}, {{"m", "v"}});
  const std::string good = stp::testing::read_bytes(good_path);
  std::uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, good.data(), 8);
  const std::string header = good.substr(8, header_bytes), data = good.substr(8 + header_bytes);
  ASSERT_EQ(read_case(dir.file("f.safetensors"), good), Outcome::Read);

  std::mt19937 rng(20);
  std::string path = dir.file("f.safetensors");
  int cases = 0, reads = 0;
  auto run = [&](const std::string& bytes) {
    ++cases;
    reads += read_case(path, bytes) == Outcome::Read;
  };
  for (int i = 0; i < 1500; ++i) {  // byte flips, mostly in the length and the header
    std::string g = good;
    for (int k = 1 + static_cast<int>(rng() % 4); k > 0; --k)
      g[rng() % (rng() % 4 ? 8 + header_bytes : g.size())] = static_cast<char>(rng());
    run(g);
  }
  for (int i = 0; i < 300; ++i) run(good.substr(0, rng() % good.size()));  // truncations
  for (int i = 0; i < 300; ++i) {  // header-length edits: off by a little, by a bit, or anything
    std::string g = good;
    std::uint64_t n = header_bytes;
    switch (rng() % 3) {
      case 0: n += static_cast<std::int64_t>(rng() % 17) - 8; break;
      case 1: n ^= 1ull << (rng() % 64); break;
      default: n = (static_cast<std::uint64_t>(rng()) << 32) | rng(); break;
    }
    std::memcpy(g.data(), &n, 8);
    run(g);
  }
  for (int i = 0; i < 300; ++i) {  // a slice of the header spliced elsewhere into it
    std::string h = header;
    std::size_t from = rng() % h.size(), len = rng() % 24, to = rng() % h.size();
    h.insert(to, h.substr(from, len));
    run(with_header(h, data));
  }
  for (int i = 0; i < 800; ++i) run(with_header(random_header(rng), data));
  for (int i = 0; i < 1500; ++i) run(with_header(random_entries(rng), std::string(rng() % 40, '\0')));
  EXPECT_EQ(cases, 4700);
  // Both outcomes occur: the mutations reach past the first check, and some still read.
  EXPECT_GT(reads, 10);
  EXPECT_LT(reads, cases / 2);
}
