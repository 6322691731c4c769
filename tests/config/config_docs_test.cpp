// docs/config.md carries the knob table generated from the registry between two markers.
// Out of date = failure; STP_UPDATE_DOCS=1 rewrites the table in place.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "config/config.h"
#include "tests/support/files.h"

TEST(ConfigDocs, KnobTableIsUpToDate) {
  const std::string path = std::string(STP_SOURCE_DIR) + "/docs/config.md";
  std::string doc = stp::testing::read_bytes(path);
  const std::string begin = "<!-- knobs:begin (generated from config/config.cpp) -->\n";
  const std::string end = "<!-- knobs:end -->";
  std::size_t b = doc.find(begin), e = doc.find(end);
  ASSERT_NE(b, std::string::npos) << path << " lacks the marker " << begin;
  ASSERT_NE(e, std::string::npos) << path << " lacks the marker " << end;
  ASSERT_LT(b, e);
  const std::string want = stp::config_knob_table_markdown();
  std::string have = doc.substr(b + begin.size(), e - b - begin.size());
  if (have != want && std::getenv("STP_UPDATE_DOCS")) {
    doc.replace(b + begin.size(), e - b - begin.size(), want);
    stp::testing::write_bytes(path, doc);
    have = want;
  }
  EXPECT_EQ(have, want) << path << " is out of date: run STP_UPDATE_DOCS=1 " << STP_BINARY_DIR
                        << "/tests/test_config --gtest_filter=ConfigDocs.*";
  for (const stp::Knob& k : stp::config_knobs())
    EXPECT_NE(doc.find(std::string("`") + k.key + "`"), std::string::npos) << k.key << " missing from " << path;
}
