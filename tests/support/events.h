// Test helper: poll an event with a deadline (race tests that must tell "still blocked" from "done").
#pragma once

#include <chrono>
#include <thread>

#include "core/device.h"

namespace stp::testing {

// Waits until `e` has completed or `limit` has passed; true if it completed.
inline bool completes_within(Event& e, std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (!e.query()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace stp::testing
