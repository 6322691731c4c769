#include "data/text_stream.h"

#include <algorithm>
#include <cstdio>

#include "base/error.h"
#include "data/file_reader.h"
#include "data/utf8.h"

namespace stp {

std::uint64_t encode_text_file(const BpeTokenizer& tok, const std::string& path, const std::string& what,
                               const TextStreamOptions& o,
                               const std::function<void(const std::vector<std::int32_t>&)>& emit,
                               const std::function<void(std::uint64_t)>& progress) {
  STP_ASSERT(o.chunk_bytes > 0, "encode_text_file: chunk_bytes 0");
  FileReader in(path, what);
  std::string buf;                     // text from file offset `base` on
  std::uint64_t base = 0;              // file offset of buf[0]
  std::size_t target = o.chunk_bytes;  // bytes to hold before looking for a cut
  auto encode = [&](std::string_view chunk) {
    const std::size_t bad = utf8::first_invalid(chunk);
    std::string replaced;
    if (bad != std::string_view::npos) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", unsigned(static_cast<unsigned char>(chunk[bad])));
      STP_CHECK(o.replace_invalid, "'", path, "' is not valid UTF-8: byte ", hex, " at offset ", base + bad,
                " does not start a valid character", o.invalid_hint);
      replaced = utf8::replace_invalid(chunk);
    }
    const std::string_view text = bad == std::string_view::npos ? chunk : std::string_view(replaced);
    const double scale = text.empty() ? 0.0 : double(chunk.size()) / double(text.size());
    BpeTokenizer::Progress inner;
    if (progress) inner = [&](std::size_t d) { progress(base + std::uint64_t(double(d) * scale)); };
    emit(tok.encode(text, inner));
  };
  for (;;) {
    if (buf.size() < target) in.read(buf, target - buf.size());
    if (in.done()) break;
    // A cut in the second half of what is held, so that chunks stay near chunk_bytes.
    const std::size_t cut = tok.stream_cut(buf, buf.size() / 2);
    if (cut == std::string::npos) {
      target = std::max(2 * buf.size(), o.chunk_bytes);  // no cut yet: hold more
      continue;
    }
    encode(std::string_view(buf).substr(0, cut));
    base += cut;
    buf.erase(0, cut);
    target = o.chunk_bytes;
    if (progress) progress(base);
  }
  if (!buf.empty() || base == 0) encode(buf);
  base += buf.size();
  if (progress) progress(base);
  return in.size();
}

}  // namespace stp
