#include "train/fault_hook.h"

#include <cstdlib>
#include <string>

#include "base/error.h"
#include "core/gpu_logic.h"

namespace stp {

namespace {

std::int64_t env_int(const char* name, std::int64_t fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 10);
  STP_CHECK(end && *end == '\0' && x >= 0, name, "='", v, "' is not a non-negative integer (a test hook; unset it)");
  return x;
}

}  // namespace

FaultHook FaultHook::from_env() {
  FaultHook h;
  h.rank = static_cast<int>(env_int("STP_FAULT_RANK", -1));
  h.step = env_int("STP_FAULT_STEP", 1);
  const char* kind = std::getenv("STP_FAULT_KIND");
  std::string k = kind ? kind : "";
  STP_CHECK(k.empty() || k == "error" || k == "device" || k == "sticky" || k == "nan_grad", "STP_FAULT_KIND='", k,
            "' is not error, device, sticky or nan_grad (a test hook; unset it)");
  h.device = k == "device" || k == "sticky";
  h.sticky = k == "sticky";
  h.nan_grad = k == "nan_grad";
  return h;
}

void FaultHook::maybe_fail(int global, std::int64_t current_step) const {
  if (nan_grad || global != rank || current_step != step) return;
  std::string what =
      str("STP_FAULT_RANK: injected failure of rank ", global, " in step ", current_step, " (test hook)");
  if (sticky) gpu::device_health().poison(what);
  if (device) throw DeviceError(what);
  throw Error(what);
}

}  // namespace stp
