# Multi-process launch (mpirun / srun) through MPI. Built whenever an MPI library is found
# (STP_MPI=AUTO; tools/setup.sh installs Open MPI), never in sanitizer builds (MPI libraries are
# not instrumented and MPI-launched tests are not part of the sanitizer suites).
# Sets STP_MPI_ENABLED, and for the tests STP_MPIEXEC (the launcher) and STP_MPIEXEC_FLAGS.
set(STP_MPI "AUTO" CACHE STRING "MPI multi-process support: AUTO (build when MPI is found), ON, OFF")
set(STP_MPI_ENABLED OFF)
if(NOT STP_MPI STREQUAL "OFF" AND NOT STP_SANITIZE)
  # The C API from C++ (the project enables only CXX); the deprecated C++ bindings are skipped.
  set(MPI_CXX_SKIP_MPICXX ON)
  find_package(MPI COMPONENTS CXX QUIET)
  if(MPI_CXX_FOUND)
    set(STP_MPI_ENABLED ON)
    set(STP_MPIEXEC "${MPIEXEC_EXECUTABLE}")
    # Open MPI in a container without a network, possibly as root (CI): shared memory only,
    # more processes than cores, root allowed. Other MPI implementations: override this.
    set(STP_MPIEXEC_FLAGS "--oversubscribe --allow-run-as-root --mca btl self,vader --mca pml ob1"
        CACHE STRING "Flags the MPI tests pass to the launcher")
    message(STATUS "stp: MPI ON (MPI ${MPI_CXX_VERSION}; launcher ${MPIEXEC_EXECUTABLE})")
  elseif(STP_MPI STREQUAL "ON")
    message(FATAL_ERROR "stp: STP_MPI=ON but no MPI library was found (install libopenmpi-dev openmpi-bin)")
  endif()
endif()
if(NOT STP_MPI_ENABLED)
  message(STATUS "stp: MPI OFF (not found, STP_MPI=OFF, or a sanitizer build); one process drives every rank")
endif()
