// Error model of every stp library layer (core, memory, offload, schedule, models):
//
//   * stp::Error            — a user-facing problem: bad config value, missing file, infeasible
//                             budget, device out of memory. The message names the value, the
//                             limit and what to change. Thrown, caught only by main() (or tests).
//   * stp::OutOfMemoryError — an Error raised by device/host allocators; carries the numbers.
//   * stp::InternalError    — a broken invariant (a bug in stp, never the user's fault), raised by
//                             STP_ASSERT, which stays on in release builds.
//   * stp::DeviceError      — an Error raised by the device runtime or a device library (CUDA,
//                             cuBLAS, NCCL) that is neither the configuration nor a known stp bug:
//                             a driver, hardware or environment problem (lost GPU, ECC error, a
//                             kernel image missing for this GPU, an NCCL network failure). The
//                             message names the call, the library's status and where it failed.
//                             Exit status 4. (CUDA out-of-memory is an OutOfMemoryError; an invalid
//                             argument to a library is an InternalError: core/cuda/cuda_check.h.)
//
// Only tools/*main* functions catch and exit. Work done on stream threads that throws is
// captured and rethrown on the host at the next synchronize/wait of that stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace stp {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

class OutOfMemoryError : public Error {
 public:
  OutOfMemoryError(const std::string& what, std::size_t requested) : Error(what), requested_(requested) {}
  std::size_t requested() const { return requested_; }

 private:
  std::size_t requested_;
};

class DeviceError : public Error {
 public:
  using Error::Error;
};

class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& what) : std::logic_error(what) {}
};

// str(a, b, c) streams every argument into one string: the message builder for errors.
template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// How format_bytes writes a byte count. Human: one size in the largest binary unit (KiB, MiB,
// GiB, TiB) that keeps it at least 1, to three significant digits ("971 KiB", "5.76 GiB",
// "51.1 GiB", "256 MiB"); under 1 KiB every byte ("512 B"). Exact: every byte ("6180077824 B"),
// what `stp plan --bytes` prints. The config parser reads both forms back (config/config.h).
enum class ByteStyle : std::uint8_t { Human, Exact };

// How a Human size is rounded: to the nearest last digit, or up for a minimum ("raise the budget
// to at least X"), so that a budget set to the printed value is never below the number.
enum class Rounding : std::uint8_t { Nearest, Up };

// A name read from a file (a tensor, shard or token name, a JSON key) as a message writes it:
// between `quote`s, with the quote and backslash escaped, control characters as \n, \t, \r or
// \u00XX (C0, DEL and the C1 range U+0080..U+009F) and bytes that are not UTF-8 as \xNN. The
// message stays one line of plain text whatever the file holds (no escape sequence reaches the
// terminal); UTF-8 text is kept as is.
//   quoted_text("a\nb") == "\"a\\nb\""     quoted_text("x.bin", '\'') == "'x.bin'"
// (Not named quoted(): for a std::string argument, argument-dependent lookup would pick
// std::quoted, which escapes no control character.)
std::string quoted_text(std::string_view text, char quote = '"');

// The same escapes without the quotes, for a name that a message writes bare.
std::string escaped_text(std::string_view text);

// The one byte formatter for messages and reports, e.g. "256 MiB".
std::string format_bytes(std::size_t bytes, ByteStyle style = ByteStyle::Human, Rounding rounding = Rounding::Nearest);

[[noreturn]] void throw_internal(const char* file, int line, const char* cond, const std::string& msg);

}  // namespace stp

// Invariant check, on in every build type. Message arguments are streamed like stp::str.
#define STP_ASSERT(cond, ...)                                                               \
  do {                                                                                      \
    if (!(cond)) ::stp::throw_internal(__FILE__, __LINE__, #cond, ::stp::str(__VA_ARGS__)); \
  } while (0)

// A path that must never run (a broken invariant); visibly [[noreturn]] to the compiler, so it can
// end a non-void function.
#define STP_UNREACHABLE(...) ::stp::throw_internal(__FILE__, __LINE__, "unreachable", ::stp::str(__VA_ARGS__))

// User-error check: throws stp::Error with the streamed message.
#define STP_CHECK(cond, ...)                                  \
  do {                                                        \
    if (!(cond)) throw ::stp::Error(::stp::str(__VA_ARGS__)); \
  } while (0)
