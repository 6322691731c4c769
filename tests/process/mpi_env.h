// The MPI test binary (tests/process/): launched by `mpirun -np 4` (tests/CMakeLists.txt). main()
// starts the job; every process runs the same tests in the same order, so collective calls match.
// Tests must not return early between collective calls (EXPECT, not ASSERT, around them).
#pragma once

#include "process/process.h"

namespace stp::testing {

ProcessGroup& job();  // the job started by main()

}  // namespace stp::testing
