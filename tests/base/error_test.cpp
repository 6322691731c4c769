#include <gtest/gtest.h>

#include <filesystem>
#include <system_error>

#include "base/error.h"
#include "base/fs_error.h"

TEST(Error, CheckThrowsUserErrorWithStreamedMessage) {
  try {
    STP_CHECK(1 + 1 == 3, "value ", 42, " is bad");
    FAIL() << "no throw";
  } catch (const stp::Error& e) {
    EXPECT_STREQ(e.what(), "value 42 is bad");
  }
}

TEST(Error, AssertThrowsInternalErrorNamingTheCondition) {
  try {
    STP_ASSERT(2 < 1, "x=", 3);
    FAIL() << "no throw";
  } catch (const stp::InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("2 < 1 failed: x=3"), std::string::npos) << e.what();
  }
}

// One size per number: three significant digits in the largest unit that keeps the value at
// least 1, never the byte count beside it; Exact is the byte count alone.
TEST(Error, FormatBytes) {
  using stp::ByteStyle;
  using stp::Rounding;
  EXPECT_EQ(stp::format_bytes(0), "0 B");
  EXPECT_EQ(stp::format_bytes(512), "512 B");
  EXPECT_EQ(stp::format_bytes(1023), "1023 B");
  EXPECT_EQ(stp::format_bytes(1024), "1.00 KiB");
  EXPECT_EQ(stp::format_bytes(256u << 20), "256 MiB");
  EXPECT_EQ(stp::format_bytes(6180077824), "5.76 GiB");
  EXPECT_EQ(stp::format_bytes(54814898688), "51.1 GiB");
  EXPECT_EQ(stp::format_bytes(993792), "971 KiB");  // 970.5 KiB: halves round up
  EXPECT_EQ(stp::format_bytes(std::size_t{4} << 40), "4.00 TiB");
  // A rounding that reaches the next decade or 1024 takes the coarser form.
  EXPECT_EQ(stp::format_bytes(10234), "9.99 KiB");    // 9.994 KiB
  EXPECT_EQ(stp::format_bytes(10235), "10.0 KiB");    // 9.9951 KiB
  EXPECT_EQ(stp::format_bytes(102350), "100 KiB");    // 99.95 KiB
  EXPECT_EQ(stp::format_bytes(1048575), "1.00 MiB");  // 1023.999 KiB
  EXPECT_EQ(stp::format_bytes((std::size_t{1} << 30) - 1), "1.00 GiB");
  // Up: never below the bytes (a minimum budget); equal to Nearest on an exact value.
  EXPECT_EQ(stp::format_bytes(11000, ByteStyle::Human, Rounding::Up), "10.8 KiB");  // 10.742 KiB
  EXPECT_EQ(stp::format_bytes(11000), "10.7 KiB");
  EXPECT_EQ(stp::format_bytes(9646592, ByteStyle::Human, Rounding::Up), "9.20 MiB");
  EXPECT_EQ(stp::format_bytes(256u << 20, ByteStyle::Human, Rounding::Up), "256 MiB");
  EXPECT_EQ(stp::format_bytes((256u << 20) + 1, ByteStyle::Human, Rounding::Up), "257 MiB");
  EXPECT_EQ(stp::format_bytes(1048575, ByteStyle::Human, Rounding::Up), "1.00 MiB");
  EXPECT_EQ(stp::format_bytes(54814898688, ByteStyle::Exact), "54814898688 B");
  EXPECT_EQ(stp::format_bytes(54814898688, ByteStyle::Exact, Rounding::Up), "54814898688 B");
  EXPECT_EQ(stp::format_bytes(512, ByteStyle::Exact), "512 B");
}

// Names read from files (tensor, shard, token names) go into messages through quoted_text(): one line
// of plain text whatever the file holds.
TEST(Error, QuotedEscapesWhatATerminalWouldInterpret) {
  EXPECT_EQ(stp::quoted_text("model-00001.safetensors"), "\"model-00001.safetensors\"");
  EXPECT_EQ(stp::quoted_text("a\nb\tc\rd"), "\"a\\nb\\tc\\rd\"");
  EXPECT_EQ(stp::quoted_text("\x1b[31mred"), "\"\\u001b[31mred\"");
  EXPECT_EQ(stp::quoted_text("say \"hi\" \\o/"), "\"say \\\"hi\\\" \\\\o/\"");
  EXPECT_EQ(stp::quoted_text(std::string("nul\0x", 5)), "\"nul\\u0000x\"");
  EXPECT_EQ(stp::quoted_text("del\x7f"), "\"del\\u007f\"");
  EXPECT_EQ(stp::quoted_text("caf\xc3\xa9 \xe2\x82\xac"), "\"caf\xc3\xa9 \xe2\x82\xac\"") << "UTF-8 text is kept";
  EXPECT_EQ(stp::quoted_text("csi\xc2\x9b"), "\"csi\\u009b\"") << "C1 controls are escaped";
  EXPECT_EQ(stp::quoted_text("bad\xff\xc3"), "\"bad\\xff\\xc3\"") << "bytes that are not UTF-8";
  // Called as the library does, unqualified inside namespace stp on a std::string.
  using namespace stp;
  const std::string shard = "a\x1b'b";
  EXPECT_EQ(quoted_text(shard, '\''), "'a\\u001b\\'b'");
  EXPECT_EQ(escaped_text(shard), "a\\u001b'b");
}

// A filesystem error in stp's words: the system's reason and the paths, not the library's text.
TEST(Error, FilesystemReasonKeepsTheReasonAndThePaths) {
  const std::filesystem::filesystem_error e("cannot create directories", "a/b", "c",
                                            std::make_error_code(std::errc::not_a_directory));
  EXPECT_EQ(stp::filesystem_reason(e), "Not a directory ('a/b', 'c')");
  EXPECT_EQ(stp::filesystem_reason(e, "a/b"), "Not a directory ('c')") << "a path the message names already";
  EXPECT_EQ(std::string(e.what()).find("filesystem error"), 0u) << "what the library would have said";
}
