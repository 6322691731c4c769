// Outputs never overwrite inputs (docs/design.md, Files). Every command that writes a file checks
// each output against what it reads with these, before it writes anything; a refused output is an
// stp::Error naming the output's option, the input it would overwrite and what to change.
//
// Paths are compared as the files they name, not as strings: two paths are the same file when
// std::filesystem::equivalent says so (another spelling, a symlink, a hard link), and "inside" is
// decided on canonical paths (symlinks resolved; a path that does not exist yet by its existing
// part). Writing itself is base/file_io.h's write_file_atomic().
#pragma once

#include <string>
#include <vector>

namespace stp::tools {

// A file or folder a command reads, and how the user named it.
struct Input {
  std::string path;  // empty: not given, ignored
  std::string name;  // the argument or key: "INPUT", "TOKENIZER", "data.path", "RUN_DIR's trace.json"
  // stp train: the checkpoint a run resumes from may sit in its own output.dir (that is how a
  // resumed run continues); output.dir may still not be that checkpoint or lie inside it.
  bool may_be_inside_output = false;
};

// An output file (`name`: "OUTPUT", "--svg", ...) is refused when
//   * it is one of `inputs`, or lies inside an input folder (at any depth);
//   * it is an existing folder, or its folder does not exist;
//   * it is an existing file that stp reads as an input, whatever command wrote it: a
//     tokenizer's (tokenizer.json, vocab.json, merges.txt, encoder.json, vocab.bpe), a run's
//     (metrics.jsonl, config.yaml, trace.json), any file in a checkpoint folder (one that holds
//     state.json), or a .safetensors file.
// A new file, an earlier output of another name and a device (/dev/null) pass.
void check_output_file(const std::string& output, const std::string& name, const std::vector<Input>& inputs);

// An output folder (`name`: "output.dir") is refused when it is an existing file, is an input,
// lies inside an input folder, or holds an input at any depth (unless the input
// may_be_inside_output).
void check_output_dir(const std::string& dir, const std::string& name, const std::vector<Input>& inputs);

}  // namespace stp::tools
