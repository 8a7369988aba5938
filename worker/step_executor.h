// Executes step plans on one rank: keeps every sequence's model state and the prefix-cache snapshots,
// runs the batched forward, and on rank 0 samples the next tokens. All ranks run identical plans in
// identical order (the collectives inside Forward pair up across ranks).
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>

#include "model/model.h"
#include "proto/mesh.pb.h"
#include "worker/mesh_communicator.h"
#include "worker/sampler.h"

namespace dsmesh {

class StepExecutor {
 public:
  StepExecutor(Model* model, MeshCommunicator* comm) : model_(model), comm_(comm) {}

  // Throws std::runtime_error on any inconsistency (unknown sequence, position mismatch) or model error.
  StepResult Run(const StepPlan& plan);
  // Forgets every sequence and snapshot (the mesh broke; the coordinator starts over).
  void Reset();

  size_t num_sequences() const { return seqs_.size(); }
  size_t num_snapshots() const { return snapshots_.size(); }
  size_t StateBytes() const;

 private:
  struct Sequence {
    std::unique_ptr<SequenceState> state;
    int32_t prompt_len = 0;
    SamplingParams params;
    uint64_t seed = 0;
    PenaltyState penalties;  // rank 0 only
  };

  Model* model_;
  MeshCommunicator* comm_;
  std::unordered_map<uint64_t, Sequence> seqs_;
  std::unordered_map<uint64_t, std::unique_ptr<SequenceState>> snapshots_;
};

}  // namespace dsmesh
