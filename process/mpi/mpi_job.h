// The MPI implementation of ProcessGroup (process/process.h). This header does not include mpi.h, so
// process/process.cpp can call it from a file compiled without MPI's flags.
#pragma once

#include <memory>

#include "process/process.h"

namespace stp {

// MPI_Init_thread with MPI_THREAD_MULTIPLE; throws stp::Error when the library provides less.
std::unique_ptr<ProcessGroup> start_mpi_job();

}  // namespace stp
