// A request body's field: null when absent or JSON null (OpenAI clients send null for "not set").
#pragma once

#include <nlohmann/json.hpp>

namespace dsmesh {

inline const nlohmann::ordered_json* FindField(const nlohmann::ordered_json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

}  // namespace dsmesh
