// The limits a generation request is held to before any compute, from the coordinator's last figures:
// the context length (max_model_len), what the KV pool holds for one sequence (max_seq_tokens), and the
// scheduling policy's rule for `priority` (non-zero only under --scheduling-policy priority, as vLLM).
// The coordinator checks the same limits again; checking here first lets a streaming request get its 400
// before the 200 of the stream is sent.
#pragma once

#include "gateway/request_options.h"
#include "proto/mesh.pb.h"

namespace dsmesh {

// Returns max_tokens resolved (the request's value, else the rest of what one sequence can reach; 0 when
// the coordinator reports no limits). Throws ApiError(400) naming the numbers that do not fit.
int CheckRequestLimits(const StatsResponse& stats, int prompt_len, const RequestOptions& options, bool chat);

}  // namespace dsmesh
