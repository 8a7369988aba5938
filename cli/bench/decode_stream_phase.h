// One phase of `dsmesh bench --scenario long-prompt-plus-chat`: a stream that is already decoding, and a
// long prompt that arrives beside it (issue 41's target: while a prefill chunk runs beside decoding streams,
// their time per token stays within 2x a decode-only step). The client times the stream's tokens as its
// streamed Generate responses arrive: one response per engine step, so a gap is a step as the client sees
// it, divided by the response's tokens (one, or more with speculative decoding's accepted drafts).
#pragma once

#include <chrono>
#include <vector>

#include "common/mesh/mesh_client.h"

namespace dsmesh {

struct DecodeStreamPhase {
  std::vector<double> alone_gaps_s;   // the stream's first times per token (alone_gaps of them), all before
                                      // the long prompt was sent
  std::vector<double> beside_gaps_s;  // those whose both responses came after the long prompt was sent and
                                      // at or before its first token
  double long_ttft_s = 0;             // the long prompt's time to first token, beside the stream
  bool stream_ended_early = false;    // the stream hit its max_tokens before the long prompt's first token
};

// Starts `stream` (a greedy request with a max_tokens long enough to outlast the phase) on `stream_client`,
// waits for `alone_gaps` gaps after its first response, then sends `long_prompt` (max_tokens 1) on
// `long_client` and, at its first token, cancels the stream and waits until the coordinator runs and holds
// no request. Throws std::runtime_error when either request fails or `timeout` passes while the stream
// produces its first alone_gaps + 1 responses.
DecodeStreamPhase RunDecodeStreamPhase(MeshClient& stream_client, MeshClient& long_client,
                                       const GenerateRequest& stream, const GenerateRequest& long_prompt,
                                       int alone_gaps, std::chrono::seconds timeout);

}  // namespace dsmesh
