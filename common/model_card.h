// ModelCard: the facts about a model that every process reads from its config.json - the gateway (context
// length, chat format, vision tower), the coordinator (vocabulary, end of sequence, context length) and the
// worker's forward (model/config.h ModelConfig, which reads the rest of the file through `document`).
// Fields the file leaves out stay empty; each reader decides which it requires (Required) and what its
// default is. A field that is present with the wrong type is refused, naming the file and the field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/vision/vision_config.h"

namespace dsmesh {

struct ModelCard {
  std::string source;        // the file it came from (or a name for an in-memory config), for error messages
  std::string model_type;    // "deepseek_v4", "deepseek_v3", ...; "" when absent
  std::string architecture;  // architectures[0] ("DeepseekV4ForCausalLM"); "" when absent
  std::optional<int64_t> vocab_size;
  std::optional<int64_t> max_position_embeddings;  // the longest context the model was made for
  std::optional<int64_t> bos_token_id;             // the first id when the file gives a list
  std::optional<int64_t> eos_token_id;             // the first id when the file gives a list
  int num_mtp_layers = 0;  // num_nextn_predict_layers: MTP blocks (speculative drafting)
  VisionConfig vision;     // the vision_* keys; vision.n_layers 0 (absent) = text only
  nlohmann::json document;  // the whole file, for readers that need more (the forward's hyper-parameters)

  bool has_vision_tower() const { return vision.enabled(); }

  // `field`'s value; throws std::runtime_error "<source>: missing field \"<name>\"" when it is empty.
  int64_t Required(const std::optional<int64_t>& field, const char* name) const;

  // Parses config.json text; `source` names it in errors. Throws std::runtime_error "<source>: ..." for text
  // that is not a JSON object and for a known field of the wrong type or out of range.
  static ModelCard FromJson(const std::string& json_text, const std::string& source);
  // Reads dir/config.json; a missing or unreadable file is an error naming it.
  static ModelCard FromDirectory(const std::string& dir);
};

}  // namespace dsmesh
