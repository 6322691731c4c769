// Launch detection and the entry to multi-process mode; the MPI implementation is process/mpi/.
#include "process/process.h"

#include <cstdlib>
#include <string>

#if defined(STP_HAVE_MPI)
#include "process/mpi/mpi_job.h"
#endif

namespace stp {

namespace {

// Size of the job as the launcher announced it, or 0 when no launcher variable is set.
int launcher_world_size() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE"}) {
    const char* v = std::getenv(var);
    if (v && *v) return std::atoi(v);
  }
  // PMIx (srun --mpi=pmix, Open MPI 5) announces the rank, not always the size.
  if (const char* v = std::getenv("PMIX_RANK"); v && *v) return 1;
  return 0;
}

}  // namespace

bool launched_by_mpi() { return launcher_world_size() > 0; }

int processes_on_this_host() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"}) {
    const char* v = std::getenv(var);
    if (v && std::atoi(v) > 0) return std::atoi(v);
  }
  return 1;
}

bool mpi_built() {
#if defined(STP_HAVE_MPI)
  return true;
#else
  return false;
#endif
}

std::unique_ptr<ProcessGroup> start_processes() {
  if (!launched_by_mpi()) return nullptr;
#if defined(STP_HAVE_MPI)
  return start_mpi_job();
#else
  STP_CHECK(launcher_world_size() <= 1, "this process was started by an MPI launcher with ", launcher_world_size(),
            " processes, but this stp was built without MPI (no MPI library was found at configure time); install "
            "libopenmpi-dev and openmpi-bin (tools/setup.sh does) and rebuild, or run one process without mpirun");
  return nullptr;
#endif
}

}  // namespace stp
