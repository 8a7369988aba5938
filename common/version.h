// dsmesh's release version: what the gateway's GET /version answers (vLLM's {"version": ...} shape).
#pragma once

namespace dsmesh {

inline constexpr char kDsmeshVersion[] = "0.1.0";

}  // namespace dsmesh
