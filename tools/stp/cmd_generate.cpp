// `stp generate CHECKPOINT --prompt TEXT [--tokens N --temperature T --top-k K --seed S]
//  [--tokenizer PATH]`: samples a continuation of TEXT from a checkpoint (train/generate.h) and
// prints the prompt followed by it on stdout.
//
// Byte-level models (data.format text, every byte a token): the prompt's bytes are the tokens and
// the new tokens are written as bytes. Models trained on token files need the BPE tokenizer they
// were trained with (data/bpe_tokenizer.h) to turn text into ids and back: the one the checkpoint
// carries (data.tokenizer, data/tokenizer_files.h), or --tokenizer, which takes precedence; with
// neither they are an error naming what is missing.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "base/error.h"
#include "data/bpe_tokenizer.h"
#include "data/tokenizer_files.h"
#include "tools/cli/cli.h"
#include "tools/stp/command.h"
#include "train/generate.h"

namespace {

struct GenerateArgs {
  std::string checkpoint, prompt, tokenizer;
  stp::SampleOptions sample;
};

int run(const GenerateArgs& a) {
  stp::Generator gen(a.checkpoint);
  const stp::Config& cfg = gen.config();
  const bool bytes = cfg.data.format == "text";
  if (bytes) {
    STP_CHECK(a.tokenizer.empty(), "checkpoint '", a.checkpoint,
              "' is a byte-level model (data.format text): it needs no --tokenizer");
  }
  // The checkpoint's own tokenizer unless --tokenizer names another.
  const bool carried = !bytes && a.tokenizer.empty() && stp::holds_tokenizer(a.checkpoint);
  const std::string source = carried ? a.checkpoint : a.tokenizer;
  const std::string name = carried ? stp::str("the tokenizer of checkpoint '", a.checkpoint, "'")
                                   : stp::str("--tokenizer '", a.tokenizer, "'");
  STP_CHECK(bytes || !source.empty(), "checkpoint '", a.checkpoint, "' was trained on ", cfg.data.format,
            " token ids (vocabulary ", cfg.model.vocab_size,
            "), not on bytes, and carries no tokenizer (its run set no data.tokenizer): text needs its tokenizer "
            "(--tokenizer PATH)");
  std::optional<stp::BpeTokenizer> tok;
  if (!bytes) {
    tok = stp::BpeTokenizer::load(source);
    STP_CHECK(tok->vocab_size() <= cfg.model.vocab_size, name, " has ", tok->vocab_size(),
              " ids but the model's vocabulary is ", cfg.model.vocab_size, ": not the tokenizer it was trained with");
  }
  std::vector<std::int32_t> prompt;
  if (tok) {
    prompt = tok->encode(a.prompt);
  } else {
    for (unsigned char c : a.prompt) prompt.push_back(c);
  }
  // The prompt is echoed with the first new token, so an error before it (bad options, logits that
  // are not finite) leaves stdout empty. Each token's bytes are written as it is drawn (a token may
  // end inside a UTF-8 character; the concatenation is the decoded text).
  bool echoed = false;
  gen.sample(prompt, a.sample, [&](std::int32_t t) {
    if (!echoed) std::fwrite(a.prompt.data(), 1, a.prompt.size(), stdout);
    echoed = true;
    if (tok) {
      const std::string piece = tok->decode({t});
      std::fwrite(piece.data(), 1, piece.size(), stdout);
    } else {
      std::fputc(static_cast<unsigned char>(t), stdout);
    }
    std::fflush(stdout);
  });
  std::fputc('\n', stdout);
  return 0;
}

stp::tools::Run define(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  app.add_option("CHECKPOINT", args->checkpoint, "a checkpoint folder (output.dir/checkpoint-STEP)")->required();
  app.add_option("--prompt", args->prompt, "the text to continue")->required();
  app.add_option("--tokens", args->sample.tokens, "new tokens to sample")->capture_default_str();
  app.add_option("--temperature", args->sample.temperature, "softmax temperature; 0 = always the likeliest token")
      ->capture_default_str();
  app.add_option("--top-k", args->sample.top_k, "sample among the K likeliest tokens; 0 = all")->capture_default_str();
  app.add_option("--seed", args->sample.seed, "seed of the sampler (same seed, same text)")
      ->capture_default_str()
      ->check(stp::tools::kUnsigned64);
  app.add_option(
      "--tokenizer", args->tokenizer,
      "the BPE tokenizer of a model trained on token ids: a tokenizer.json or a folder, as for stp tokenize; "
      "default: the one the checkpoint carries (data.tokenizer)");
  app.footer(
      "Prints the prompt and its continuation on stdout. No KV cache: every new token is one forward over "
      "the last model.seq_len tokens.");
  return [args] { return run(*args); };
}

}  // namespace

static const stp::tools::Command kCmd{"generate", "sample text from a checkpoint", &define};
