// Sampling for the step executor: where a step's rows are sampled (on the backend, so only tokens and
// logprobs leave the device, or on the host from full logits), the grammar masks of constrained decoding,
// and the count of rows each way. The per-row draws themselves are worker/sampler.h's (host) and
// Backend::SampleRows (device); penalties are counted per sequence (StepSequence::penalties).
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/structured/token_grammar.h"
#include "model/model.h"
#include "proto/mesh.pb.h"
#include "worker/mesh_communicator.h"
#include "worker/sequence_table.h"
#include "worker/step_sequence.h"

namespace dsmesh {

class StepSampling {
 public:
  StepSampling(Model* model, MeshCommunicator* comm) : model_(model), comm_(comm) {}

  void set_tokenizer_dir(std::string dir) { tokenizer_dir_ = std::move(dir); }
  void set_tokenizer(std::shared_ptr<const Tokenizer> tokenizer) { tokenizer_ = std::move(tokenizer); }
  // The grammars of constrained decoding; loads the tokenizer on first use.
  structured::GrammarCache& Grammars();

  void set_device_sampling(bool on) { device_sampling_ = on; }
  struct Counts {
    int64_t device_rows = 0;
    int64_t host_rows = 0;
  };
  Counts counts() const { return counts_; }

  // Chooses the step's path: when every row of it may be sampled on the device, sets each batch entry's
  // sampling (the model then returns tokens, not logits) and returns nullptr; else returns why not.
  const char* ChoosePath(const StepPlan& plan, const SequenceTable& seqs, std::vector<SequenceStep>* batch) const;
  // Copies `row` into a scratch row with every token the grammar forbids at `state` set to -inf.
  const float* MaskRow(const StepSequence& s, int32_t state, int64_t generated, const float* row, int64_t vocab);
  // Counts rows of one sequence by path; logs the first use of each path (and each host reason).
  void CountRows(bool on_device, int64_t rows, const char* host_reason);

 private:
  // Why this sequence's rows must be sampled on the host this step, or nullptr when the device can.
  static const char* HostSamplingReason(const SequencePlan& sp, const StepSequence& s);

  Model* model_;
  MeshCommunicator* comm_;
  std::string tokenizer_dir_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::unique_ptr<structured::GrammarCache> grammars_;
  bool device_sampling_ = true;
  Counts counts_;
  std::set<std::string> logged_paths_;
  std::vector<float> masked_;
  std::vector<uint64_t> mask_scratch_;
};

}  // namespace dsmesh
