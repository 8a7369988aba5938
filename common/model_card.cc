#include "common/model_card.h"

#include <fstream>
#include <sstream>
#include <stdexcept>

namespace dsmesh {
namespace {

using nlohmann::json;

[[noreturn]] void Fail(const std::string& source, const std::string& what) {
  throw std::runtime_error(source + ": " + what);
}

std::optional<int64_t> Integer(const json& j, const char* key, int64_t min, const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer() || it->get<int64_t>() < min)
    Fail(source, std::string("field \"") + key + "\" must be an integer >= " + std::to_string(min));
  return it->get<int64_t>();
}

std::string String(const json& j, const char* key, const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return "";
  if (!it->is_string()) Fail(source, std::string("field \"") + key + "\" must be a string");
  return it->get<std::string>();
}

// bos/eos may be an id or a list of ids (transformers allows both); the first of a list is the one used.
std::optional<int64_t> TokenId(const json& j, const char* key, const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_array() && !it->empty() && (*it)[0].is_number_integer()) return (*it)[0].get<int64_t>();
  Fail(source, std::string("field \"") + key + "\" must be an integer or a list of integers");
}

}  // namespace

int64_t ModelCard::Required(const std::optional<int64_t>& field, const char* name) const {
  if (!field) Fail(source, std::string("missing field \"") + name + "\"");
  return *field;
}

ModelCard ModelCard::FromJson(const std::string& text, const std::string& source) {
  ModelCard card;
  card.source = source;
  try {
    card.document = json::parse(text);
  } catch (const std::exception& e) {
    Fail(source, std::string("not valid JSON: ") + e.what());
  }
  const json& j = card.document;
  if (!j.is_object()) Fail(source, "config must be a JSON object");
  card.model_type = String(j, "model_type", source);
  if (auto it = j.find("architectures"); it != j.end() && !it->is_null()) {
    if (!it->is_array() || (!it->empty() && !(*it)[0].is_string()))
      Fail(source, "field \"architectures\" must be a list of strings");
    if (!it->empty()) card.architecture = (*it)[0].get<std::string>();
  }
  card.vocab_size = Integer(j, "vocab_size", 1, source);
  card.max_position_embeddings = Integer(j, "max_position_embeddings", 1, source);
  card.bos_token_id = TokenId(j, "bos_token_id", source);
  card.eos_token_id = TokenId(j, "eos_token_id", source);
  card.num_mtp_layers = static_cast<int>(Integer(j, "num_nextn_predict_layers", 0, source).value_or(0));
  try {
    card.vision = VisionConfig::FromJson(j);
  } catch (const std::exception& e) {
    Fail(source, e.what());
  }
  return card;
}

ModelCard ModelCard::FromDirectory(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream in(path);
  if (!in) Fail(path, "cannot open (is " + dir + " a model directory?)");
  std::stringstream text;
  text << in.rdbuf();
  return FromJson(text.str(), path);
}

}  // namespace dsmesh
