#include "tools/cli/blas_env.h"

#include <unistd.h>

#include <cstdlib>

namespace stp::tools {

std::optional<std::string> blas_thread_timeout_to_set(const std::function<const char*(const char*)>& get) {
  if (get("OPENBLAS_THREAD_TIMEOUT") || get("GOTO_THREAD_TIMEOUT")) return std::nullopt;
  return std::to_string(kBlasThreadTimeout);
}

void reexec_with_blas_tuning(char** argv) {
  const auto value = blas_thread_timeout_to_set([](const char* name) { return std::getenv(name); });
  if (!value) return;
  // Set before the exec, so the new image sees it and does not re-execute again.
  if (setenv("OPENBLAS_THREAD_TIMEOUT", value->c_str(), 1) != 0) return;
  execv("/proc/self/exe", argv);
  // Only reached when the exec failed (no /proc): run on, with OpenBLAS's default spin.
}

}  // namespace stp::tools
