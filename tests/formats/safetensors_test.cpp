#include <cmath>
#include <cstring>
#include <random>

#include "base/error.h"
#include "formats/safetensors.h"
#include "tests/support/files.h"

using namespace stp;
using stp::testing::expect_error;
using stp::testing::ScratchDir;

namespace {

// A raw safetensors file: 8-byte header length, the header text, the data bytes.
std::string raw_file(const std::string& header, const std::string& data) {
  std::uint64_t n = header.size();
  return std::string(reinterpret_cast<const char*>(&n), 8) + header + data;
}

std::string f32_bytes(std::vector<float> v) { return stp::testing::as_bytes(v); }

}  // namespace

TEST(Safetensors, RoundTripKeepsNamesShapesValuesAndMetadata) {
  ScratchDir dir;
  HostTensor a{{2, 3}, {1, -2, 3.5f, 4, 5e-8f, -6e7f}};
  HostTensor scalar{{}, {42}};
  HostTensor empty{{0, 4}, {}};
  HostTensor vec{{5}, {0, 1, 2, 3, 4}};
  std::string path = dir.file("t.safetensors");
  write_safetensors(path, {{"h.0.w", &a}, {"s", &scalar}, {"e", &empty}, {"v\"q", &vec}},
                    {{"step", "7"}, {"k", "x\ny"}});
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  SafetensorsFile f = read_safetensors_file(path);
  ASSERT_EQ(f.tensors.size(), 4u);
  EXPECT_EQ(f.tensors["h.0.w"].shape, (Shape{2, 3}));
  EXPECT_EQ(f.tensors["h.0.w"].data, a.data);
  EXPECT_EQ(f.tensors["s"].shape, Shape{});
  EXPECT_EQ(f.tensors["s"].data, scalar.data);
  EXPECT_EQ(f.tensors["e"].shape, (Shape{0, 4}));
  EXPECT_TRUE(f.tensors["e"].data.empty());
  EXPECT_EQ(f.tensors["v\"q"].data, vec.data);
  EXPECT_EQ(f.metadata["step"], "7");
  EXPECT_EQ(f.metadata["k"], "x\ny");
  // The data section starts 8-byte aligned, as the reference writer does.
  std::string bytes = stp::testing::read_bytes(path);
  std::uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 4 * (6 + 1 + 0 + 5));
}

TEST(Safetensors, WriteRejectsDuplicateNamesAndSizeMismatch) {
  ScratchDir dir;
  HostTensor a{{2}, {1, 2}};
  HostTensor bad{{3}, {1, 2}};
  expect_error([&] { write_safetensors(dir.file("d.safetensors"), {{"a", &a}, {"a", &a}}); }, {"duplicate", "\"a\""});
  expect_error([&] { write_safetensors(dir.file("m.safetensors"), {{"bad", &bad}}); }, {"bad", "2 values", "[3]"});
  EXPECT_FALSE(std::filesystem::exists(dir.file("d.safetensors")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("m.safetensors.tmp")));
}

TEST(Safetensors, LoadsBF16AndF16AsF32) {
  ScratchDir dir;
  std::vector<std::uint16_t> bf16 = {0x3F80, 0xC040, 0x4049, 0x0000, 0x8000};  // 1, -3, 3.140625, 0, -0
  std::vector<std::uint16_t> f16 = {0x3C00, 0xC000, 0x3800, 0x7BFF, 0x0001, 0x7C00, 0x03FF};
  std::string header = R"({"b":{"dtype":"BF16","shape":[5],"data_offsets":[0,10]},)"
                       R"("h":{"dtype":"F16","shape":[7],"data_offsets":[10,24]}})";
  std::string path = dir.file("half.safetensors");
  stp::testing::write_bytes(path, raw_file(header, stp::testing::as_bytes(bf16) + stp::testing::as_bytes(f16)));
  auto t = read_safetensors(path);
  EXPECT_EQ(t["b"].data, (std::vector<float>{1.0f, -3.0f, 3.140625f, 0.0f, -0.0f}));
  EXPECT_TRUE(std::signbit(t["b"].data[4]));
  const auto& h = t["h"].data;
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], -2.0f);
  EXPECT_EQ(h[2], 0.5f);
  EXPECT_EQ(h[3], 65504.0f);
  EXPECT_EQ(h[4], std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_TRUE(std::isinf(h[5]) && h[5] > 0);
  EXPECT_EQ(h[6], std::ldexp(1023.0f, -24));  // largest subnormal
}

TEST(Safetensors, F16ConversionMatchesExhaustiveDefinition) {
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    std::uint32_t e = (bits >> 10) & 0x1F, m = bits & 0x3FF;
    if (e == 0x1F) continue;  // inf/nan checked above
    double mag = e == 0 ? std::ldexp(double(m), -24) : std::ldexp(1.0 + m / 1024.0, int(e) - 15);
    double want = (bits & 0x8000) ? -mag : mag;
    ASSERT_EQ(f16_to_f32(static_cast<std::uint16_t>(bits)), static_cast<float>(want)) << bits;
  }
}

struct CorruptCase {
  const char* what;
  std::string file;
  std::vector<std::string> needles;
};

TEST(Safetensors, EachCorruptionIsAClearError) {
  ScratchDir dir;
  std::string d8 = f32_bytes({1, 2});
  std::uint64_t huge = 1000;
  std::vector<CorruptCase> cases = {
      {"short file", "abc", {"shorter than the 8-byte"}},
      {"header longer than file",
       std::string(reinterpret_cast<const char*>(&huge), 8) + "{}",
       {"header length 1000", "exceeds the file size"}},
      {"bad json", raw_file(R"({"a":{"dtype":"F32",)", d8), {"bad safetensors header", "JSON"}},
      {"not an object", raw_file("[1,2]", ""), {"not an object"}},
      {"unknown dtype",
       raw_file(R"({"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", d8),
       {"\"a\"", "unsupported dtype \"I64\""}},
      {"missing field", raw_file(R"({"a":{"dtype":"F32","shape":[2]}})", d8), {"\"a\"", "data_offsets"}},
      {"negative dim", raw_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", d8), {"shape dimension"}},
      {"fractional dim",
       raw_file(R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,8]}})", d8),
       {"shape dimension"}},
      {"size mismatch",
       raw_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", d8),
       {"\"a\"", "span 8 bytes", "needs 12"}},
      {"reversed", raw_file(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", d8), {"reversed"}},
      {"out of range",
       raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", d8),
       {"\"a\"", "exceed the data section"}},
      {"truncated data",
       raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", d8.substr(0, 5)),
       {"truncated"}},
      {"overlap",
       raw_file(
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
           d8),
       {"\"a\"", "\"b\"", "overlap"}},
      {"overlap behind an empty tensor",
       raw_file(
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"z":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
           R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
           d8),
       {"\"a\"", "\"b\"", "overlap"}},
      {"metadata not string", raw_file(R"({"__metadata__":{"k":1}})", ""), {"__metadata__", "\"k\""}},
      {"huge shape",
       raw_file(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}})", d8),
       {"too large"}},
      {"byte size overflows",
       raw_file(R"({"a":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,8]}})", d8),
       {"\"a\"", "byte size overflows"}},
      {"exponent offset",
       raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8e0]}})", d8),
       {"\"a\"", "data_offsets end", "non-negative integer", "8.0"}},
      {"fractional offset",
       raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0.5,8]}})", d8),
       {"data_offsets begin", "non-negative integer", "0.5"}},
      {"exponent dim",
       raw_file(R"({"a":{"dtype":"F32","shape":[1e3],"data_offsets":[0,8]}})", d8),
       {"shape dimension", "1000.0"}},
      {"negative offset",
       raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", d8),
       {"data_offsets begin", "non-negative integer, not -8"}},
      {"offset above 2^64",
       raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551616]}})", d8),
       {"data_offsets end", "above 2^64"}},
      {"offset far past the end",
       raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[18446744073709551600,18446744073709551608]}})", d8),
       {"exceed the data section"}},
      {"string offset",
       raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":["0",8]}})", d8),
       {"data_offsets begin", "not a string"}},
      {"three offsets",
       raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}})", d8),
       {"data_offsets must be [begin, end]"}},
      {"shape not a list",
       raw_file(R"({"a":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", d8),
       {"shape is not a list but a string"}},
      {"dtype not a string",
       raw_file(R"({"a":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", d8),
       {"dtype is not a string but a number"}},
      {"entry not an object", raw_file(R"({"a":[0,8]})", d8), {"\"a\"", "not an object but a array"}},
      {"metadata not an object", raw_file(R"({"__metadata__":[]})", ""), {"__metadata__ is not an object"}},
      {"duplicate name",
       raw_file(
           R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
           d8),
       {"duplicate tensor name \"a\""}},
      {"duplicate field",
       raw_file(R"({"a":{"dtype":"F32","shape":[2],"shape":[2],"data_offsets":[0,8]}})", d8),
       {"duplicate key \"shape\""}},
      {"deep nesting",
       raw_file("{\"__metadata__\":" + std::string(100000, '[') + std::string(100000, ']') + "}", ""),
       {"nested deeper"}},
      {"not UTF-8",
       raw_file("{\"\xff\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", ""),
       {"not valid JSON"}},
      {"trailing text", raw_file(R"({} {})", ""), {"not valid JSON"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    std::string path = dir.file("c.safetensors");
    stp::testing::write_bytes(path, c.file);
    try {
      read_safetensors(path);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      for (const auto& n : c.needles) EXPECT_NE(msg.find(n), std::string::npos) << "missing '" << n << "' in: " << msg;
    }
  }
  expect_error([&] { read_safetensors(dir.file("missing.safetensors")); }, {"missing.safetensors", "cannot open"});
}

// A header length within the file but above the 100 MiB limit is refused before it is allocated
// (the file is sparse: nothing is written past its first bytes).
TEST(Safetensors, AbsurdHeaderLengthIsRefusedBeforeAllocation) {
  ScratchDir dir;
  std::string path = dir.file("big.safetensors");
  std::uint64_t n = 200ull << 20;
  stp::testing::write_bytes(path, std::string(reinterpret_cast<const char*>(&n), 8) + "{}");
  std::filesystem::resize_file(path, 8 + n + 16);
  expect_error([&] { read_safetensors(path); }, {path, "header length 209715200", "exceeds the limit"});
}

TEST(Safetensors, HeaderParserReportsEveryTensorRange) {
  std::string h = R"({"__metadata__":{"k":"v"},"b":{"dtype":"BF16","shape":[2],"data_offsets":[8,12]},)"
                  R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  SafetensorsHeader p = parse_safetensors_header(h, 12, "mem");
  ASSERT_EQ(p.tensors.size(), 2u);
  EXPECT_EQ(p.tensors[0].name, "a");
  EXPECT_EQ(p.tensors[0].dtype, "F32");
  EXPECT_EQ(p.tensors[1].name, "b");
  EXPECT_EQ(p.tensors[1].begin, 8u);
  EXPECT_EQ(p.tensors[1].end, 12u);
  EXPECT_EQ(p.metadata.at("k"), "v");
  expect_error([&] { parse_safetensors_header(h, 11, "mem"); }, {"mem", "\"b\"", "exceed the data section (11 bytes)"});
}

// The writer's header bytes are a contract (other tools read them): compact JSON, metadata
// first, tensors in the given order, fields dtype, shape, data_offsets, padded to 8 bytes.
TEST(Safetensors, WrittenHeaderHasTheReferenceLayout) {
  ScratchDir dir;
  HostTensor z{{2, 1}, {1, 2}};
  HostTensor a{{1}, {3}};
  std::string path = dir.file("h.safetensors");
  write_safetensors(path, {{"z", &z}, {"a\"\n", &a}}, {{"step", "3"}});
  std::string bytes = stp::testing::read_bytes(path);
  std::uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  std::string want = R"({"__metadata__":{"step":"3"},"z":{"dtype":"F32","shape":[2,1],"data_offsets":[0,8]},)"
                     R"("a\"\n":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})";
  ASSERT_GE(n, want.size());
  EXPECT_EQ(bytes.substr(8, want.size()), want);
  EXPECT_EQ(bytes.substr(8 + want.size(), n - want.size()), std::string(n - want.size(), ' '));
}

// Every truncation of a valid file is an error; random byte flips are an error or a valid read,
// never a crash or another exception type.
TEST(Safetensors, FuzzTruncatedAndGarbledFiles) {
  ScratchDir dir;
  HostTensor a{{3, 4}, std::vector<float>(12, 1.5f)};
  HostTensor b{{5}, std::vector<float>(5, -2.0f)};
  std::string good_path = dir.file("good.safetensors");
  write_safetensors(good_path, {{"a", &a}, {"b", &b}}, {{"m", "v"}});
  std::string good = stp::testing::read_bytes(good_path);
  std::string path = dir.file("fuzz.safetensors");
  for (std::size_t len = 0; len < good.size(); ++len) {
    stp::testing::write_bytes(path, good.substr(0, len));
    EXPECT_THROW(read_safetensors(path), Error) << "truncated to " << len;
  }
  std::mt19937 rng(7);
  int errors = 0, reads = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    std::string g = good;
    int flips = 1 + int(rng() % 4);
    for (int k = 0; k < flips; ++k) {
      std::size_t pos = rng() % std::min<std::size_t>(g.size(), 8 + 160);  // mostly the length and header
      g[pos] = static_cast<char>(rng() & 0xFF);
    }
    stp::testing::write_bytes(path, g);
    try {
      read_safetensors(path);
      ++reads;
    } catch (const Error&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 1000);  // most garbled headers are detected
  EXPECT_EQ(errors + reads, 2000);
}
