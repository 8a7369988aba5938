// dsmesh-worker: one tensor-parallel rank (worker/worker.h). Dials the coordinator, joins the data-plane
// communicator when told to form the mesh, loads only its shard, and executes step plans until drained.
//
//   dsmesh-worker --rank R --world N --coordinator HOST:PORT --model DIR --device cpu|cuda:I
//                 [--kv-memory BYTES[K|M|G] | --kv-memory-fraction F] [--threads T] [--data-host ADDR]
//                 [--collective-timeout-ms MS] [--mesh-token-file F] [--tls-cert F --tls-key F --tls-ca F]
//                 [--bench-simulated-acceptance]   (only `dsmesh bench --draft-acceptance` passes it: plans may
//                                                   then simulate draft acceptance; without it they are refused)
//
#include <string>
#include <vector>

#include "common/flags.h"
#include "common/mesh/mesh_credentials.h"
#include "common/program.h"
#include "worker/worker.h"

int main(int argc, char** argv) {
  // Signals go to the dedicated sigwait thread; block them before any thread starts.
  dsmesh::BlockShutdownSignals();
  const std::vector<std::string> args(argv + 1, argv + argc);
  return dsmesh::RunProgram(
      "dsmesh-worker",
      "dsmesh-worker --rank R --world N --coordinator HOST:PORT --model DIR --device cpu|cuda[:I] [--gpu-memory-utilization F] [--enforce-eager] [--kv-cache-dtype auto|bf16|fp8] "
      "[--kv-memory BYTES | --kv-memory-fraction F] [--threads T]",
      [&] {
        const dsmesh::Flags flags = dsmesh::ParseWorkerFlags(args);
        dsmesh::Worker worker(flags);
        return worker.Run();
      });
}
