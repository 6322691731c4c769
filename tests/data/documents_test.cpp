// JSONL records as documents (data/documents.h): the parts and mask bytes of text,
// prompt/completion and chat records on GPT-2's vocabulary, errors naming the file and the line,
// and reading lines across blocks.
#include "data/documents.h"
#include "tests/data/tokenizer_fixture.h"
#include "tests/support/files.h"

using namespace stp;
using stp::testing::expect_error;
using stp::testing::ScratchDir;
using stp::testing::write_bytes;

namespace {

const BpeTokenizer& gpt2() { return stp::testing::gpt2_tokenizer(); }

const BpeTokenizer& chatml() {
  static const BpeTokenizer t = stp::testing::gpt2_with_chatml();
  return t;
}

struct Encoded {
  std::vector<std::int32_t> ids;
  std::vector<std::uint8_t> mask;
};

Encoded encode_lines(const BpeTokenizer& tok, const JsonlSchema& schema, const std::vector<std::string>& lines) {
  std::vector<std::uint64_t> numbers;
  for (std::size_t i = 0; i < lines.size(); ++i) numbers.push_back(i + 1);
  std::vector<Document> docs;
  jsonl_documents(lines, numbers, "data.jsonl", schema, docs);
  Encoded e;
  encode_documents(tok, docs, e.ids, e.mask);
  return e;
}

std::vector<std::int32_t> cat(std::initializer_list<std::vector<std::int32_t>> parts) {
  std::vector<std::int32_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

}  // namespace

// Prompt tokens mask 0; the completion's tokens and the EOT after it mask 1. Blank lines are skipped.
TEST(Documents, PromptCompletionMasksThePrompt) {
  JsonlSchema s;
  s.kind = JsonlKind::PromptCompletion;
  s.prompt_field = "prompt";
  s.completion_field = "completion";
  s.eot = 50256;
  const Encoded e = encode_lines(gpt2(), s,
                                 {R"({"prompt": "Hello", "completion": " world"})", "", "  ",
                                  R"({"completion": " there", "prompt": "Hi", "id": 7})"});
  EXPECT_EQ(e.ids, (std::vector<std::int32_t>{15496, 995, 50256, 17250, 612, 50256}));
  EXPECT_EQ(e.mask, (std::vector<std::uint8_t>{0, 1, 1, 0, 1, 1}));
  // Each field is encoded on its own: the ids are those of the prompt, then the completion.
  const Encoded long_ = encode_lines(gpt2(), s, {R"({"prompt": "Q: 2+2?", "completion": " A: 4, it's four."})"});
  EXPECT_EQ(long_.ids, cat({gpt2().encode("Q: 2+2?"), gpt2().encode(" A: 4, it's four."), {50256}}));
  std::vector<std::uint8_t> want(gpt2().encode("Q: 2+2?").size(), 0);
  want.resize(long_.ids.size(), 1);
  EXPECT_EQ(long_.mask, want);
}

TEST(Documents, TextRecordsAreTheirField) {
  JsonlSchema s;
  s.text_field = "body";
  const Encoded e = encode_lines(gpt2(), s, {R"({"body": "Hello world"})", R"({"body": "Hi", "x": 1})"});
  EXPECT_EQ(e.ids, (std::vector<std::int32_t>{15496, 995, 17250}));  // stp tokenize adds the EOT between
}

// ChatML: <|im_start|>role\n content <|im_end|> \n per message, the assistant's content and its
// <|im_end|> mask 1, then the EOT (mask 0).
TEST(Documents, ChatMessagesWithChatMl) {
  JsonlSchema s;
  s.kind = JsonlKind::Messages;
  s.eot = 50256;
  s.im_start = 50257;
  s.im_end = 50258;
  const BpeTokenizer& t = chatml();
  const Encoded e =
      encode_lines(t, s,
                   {R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},)"
                    R"( {"role": "assistant", "content": "Hello"}]})"});
  const std::vector<std::int32_t> sys = t.encode("system\n"), brief = t.encode("Be brief."), user = t.encode("user\n"),
                                  hi = t.encode("Hi"), asst = t.encode("assistant\n"), hello = t.encode("Hello"),
                                  nl = t.encode("\n");
  EXPECT_EQ(e.ids, cat({{50257},
                        sys,
                        brief,
                        {50258},
                        nl,
                        {50257},
                        user,
                        hi,
                        {50258},
                        nl,
                        {50257},
                        asst,
                        hello,
                        {50258},
                        nl,
                        {50256}}));
  std::vector<std::uint8_t> want(e.ids.size(), 0);
  const std::size_t at = e.ids.size() - 1 - nl.size() - 1 - hello.size();  // the assistant's content
  for (std::size_t i = at; i < at + hello.size() + 1; ++i) want[i] = 1;
  EXPECT_EQ(e.mask, want);
  ASSERT_EQ(hello, (std::vector<std::int32_t>{15496}));
  EXPECT_EQ(std::vector<std::uint8_t>(e.mask.end() - 4, e.mask.end()), (std::vector<std::uint8_t>{1, 1, 0, 0}));
}

// Without ChatML's tokens: "role: " content, the assistant's content and an EOT after it mask 1,
// other messages end with "\n"; a chat not ending with the assistant gets an EOT (mask 0).
TEST(Documents, ChatMessagesWithThePlainTemplate) {
  JsonlSchema s;
  s.kind = JsonlKind::Messages;
  s.messages_field = "chat";
  s.eot = 50256;
  const BpeTokenizer& t = gpt2();
  const Encoded e =
      encode_lines(t, s,
                   {R"({"chat": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]})",
                    R"({"chat": [{"role": "user", "content": "Hi"}]})"});
  const std::vector<std::int32_t> user = t.encode("user: "), asst = t.encode("assistant: ");
  EXPECT_EQ(e.ids, cat({user, {17250}, t.encode("\n"), asst, {15496, 50256}, user, {17250}, t.encode("\n"), {50256}}));
  std::vector<std::uint8_t> want(e.ids.size(), 0);
  const std::size_t hello = user.size() + 2 + asst.size();
  want[hello] = want[hello + 1] = 1;
  EXPECT_EQ(e.mask, want);
}

TEST(Documents, BadRecordsNameTheFileAndLine) {
  JsonlSchema pc;
  pc.kind = JsonlKind::PromptCompletion;
  pc.prompt_field = "prompt";
  pc.completion_field = "completion";
  pc.eot = 50256;
  // Two good lines, the bad one, then a worse one: the first bad line is named.
  auto bad = [&](const JsonlSchema& s, const std::string& line, std::initializer_list<std::string> needles) {
    const std::string ok = s.kind == JsonlKind::PromptCompletion ? R"({"prompt": "a", "completion": "b"})"
                           : s.kind == JsonlKind::Messages       ? R"({"messages": [{"role": "user", "content": "a"}]})"
                                                                 : R"({"text": "a"})";
    expect_error([&] { encode_lines(gpt2(), s, {ok, ok, line, "{broken"}); }, needles);
  };
  bad(pc, R"({"prompt": "a", "completion": )", {"'data.jsonl' line 3", "invalid JSON", "column"});
  bad(pc, R"({"prompt": "a", "answer": "b"})", {"'data.jsonl' line 3", "no field \"completion\"", "\"answer\""});
  bad(pc, R"({"prompt": "a", "completion": 5})", {"line 3", "\"completion\" is a number, not a string"});
  bad(pc, R"(["a", "b"])", {"line 3", "is an array, not a JSON object"});
  JsonlSchema chat;
  chat.kind = JsonlKind::Messages;
  chat.eot = 50256;
  bad(chat, R"({"messages": "hi"})", {"line 3", "\"messages\" is a string, not an array"});
  bad(chat, R"({"messages": [{"role": "user", "content": "a"}, {"role": "user"}]})",
      {"line 3", "\"messages\" message 1: no field \"content\""});
  bad(chat, R"({"messages": [{"role": 1, "content": "a"}]})", {"line 3", "message 0: field \"role\" is a number"});
  bad(chat, R"({"text": "a"})", {"line 3", "no field \"messages\""});
  JsonlSchema text;
  bad(text, R"({"text": null})", {"line 3", "\"text\" is null"});
}

TEST(Documents, LinesAreReadAcrossBlocks) {
  ScratchDir dir;
  const std::string long_line(5u << 20, 'x');  // longer than a block
  write_bytes(dir.file("l.jsonl"), "a\n\n" + long_line + "\r\nlast");
  LineReader r(dir.file("l.jsonl"), "INPUT");
  std::string line;
  ASSERT_TRUE(r.next(line));
  EXPECT_EQ(line, "a");
  ASSERT_TRUE(r.next(line));
  EXPECT_EQ(line, "");
  ASSERT_TRUE(r.next(line));
  EXPECT_EQ(line, long_line + "\r");
  ASSERT_TRUE(r.next(line));
  EXPECT_EQ(line, "last");
  EXPECT_EQ(r.line_no(), 4u);
  EXPECT_EQ(r.offset(), r.size());
  EXPECT_FALSE(r.next(line));
}
