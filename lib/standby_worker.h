#pragma once

// A native worker program's own standby (dtrun --standby): dtrun starts one
// copy of the program per node with DTRUN_STANDBY_FD set; that copy has
// loaded libtorch and run its static initialisers (0.4 s here, most of a
// C++ worker's start) and waits; each worker dtrun then asks for is forked
// from it and goes on from this call as a freshly started worker would,
// with its own environment, output and CPUs. The protocol is the Python
// standby's (rendezvous/standby_protocol.h): JSON packets on a
// SOCK_SEQPACKET socket, the worker's stdout and stderr passed with each
// request.
//
// Safe by construction: the standby forks only while it has one thread,
// and refuses a worker whose variables read at a program's start (LD_*,
// MALLOC_*, GLIBC_TUNABLES, OMP_*, MKL_*, OPENBLAS_*, KMP_*, TORCH_*)
// differ from its own, saying why; dtrun then starts workers cold.

namespace dtrun::train {

// Call first in main(). Without DTRUN_STANDBY_FD it returns at once. With
// it, this process is the standby: it never returns here, and returns in
// each worker it forks, with *argc and *argv the worker's.
void ServeStandbyIfAsked(int* argc, char*** argv);

}  // namespace dtrun::train
