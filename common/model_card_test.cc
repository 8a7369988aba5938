// The model card on the repository's real configs (the shipped model, the golden fixtures transformers
// wrote) and on bad input: every error names the file and, where one is at fault, the field.
#include "common/model_card.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace dsmesh {
namespace {

std::string Root() {
  const char* root = std::getenv("DSMESH_ROOT");
  if (!root) ADD_FAILURE() << "DSMESH_ROOT is not set: run through ./dsmesh test (or export DSMESH_ROOT=<repo root>)";
  return root ? root : ".";
}

std::string Error(const std::string& json) {
  try {
    ModelCard::FromJson(json, "x/config.json");
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "no error";
}

TEST(ModelCard, ReadsTheShippedModel) {
  const ModelCard card = ModelCard::FromDirectory(Root() + "/models/dsv4-small");
  EXPECT_EQ(card.source, Root() + "/models/dsv4-small/config.json");
  EXPECT_EQ(card.model_type, "deepseek_v4");
  EXPECT_EQ(card.architecture, "DeepseekV4ForCausalLM");
  EXPECT_EQ(card.vocab_size, 129280);
  EXPECT_EQ(card.max_position_embeddings, 1048576);
  EXPECT_EQ(card.bos_token_id, 0);
  EXPECT_EQ(card.eos_token_id, 1);
  EXPECT_EQ(card.num_mtp_layers, 1);
  EXPECT_FALSE(card.has_vision_tower());
  EXPECT_EQ(card.document.at("hidden_size"), card.document.at("hidden_size"));  // the whole file is kept
  EXPECT_TRUE(card.document.contains("num_hidden_layers"));
}

TEST(ModelCard, ReadsTheGoldenFixtures) {
  for (const char* name : {"tiny_v4", "mtp_v4", "vision_v4"}) {
    SCOPED_TRACE(name);
    const ModelCard card = ModelCard::FromDirectory(Root() + "/tests/golden/" + name);
    EXPECT_EQ(card.model_type, "deepseek_v4");
    EXPECT_EQ(card.vocab_size, 512);
    EXPECT_EQ(card.max_position_embeddings, 8192);
    EXPECT_EQ(card.eos_token_id, 1);
    EXPECT_EQ(card.num_mtp_layers, std::string(name) == "mtp_v4" ? 1 : 0);
    EXPECT_EQ(card.has_vision_tower(), std::string(name) == "vision_v4");
  }
  const ModelCard vision = ModelCard::FromDirectory(Root() + "/tests/golden/vision_v4");
  EXPECT_EQ(vision.vision.n_layers, 2);
  EXPECT_EQ(vision.vision.patch_size, 4);
  EXPECT_EQ(vision.vision.dim, 64);
}

TEST(ModelCard, AbsentFieldsStayEmptyUntilRequired) {
  const ModelCard card = ModelCard::FromJson(R"({"model_type": "deepseek_v4", "eos_token_id": [7, 8]})", "x/config.json");
  EXPECT_FALSE(card.vocab_size);
  EXPECT_FALSE(card.max_position_embeddings);
  EXPECT_FALSE(card.bos_token_id);
  EXPECT_EQ(card.eos_token_id, 7);  // the first of a list
  EXPECT_EQ(card.num_mtp_layers, 0);
  EXPECT_EQ(card.architecture, "");
  try {
    card.Required(card.vocab_size, "vocab_size");
    ADD_FAILURE() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "x/config.json: missing field \"vocab_size\"");
  }
  EXPECT_EQ(card.Required(card.eos_token_id, "eos_token_id"), 7);
}

TEST(ModelCard, RefusesBadInputNamingTheFileAndTheField) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") + "/card";
  std::filesystem::create_directories(dir);
  try {
    ModelCard::FromDirectory(dir);
    ADD_FAILURE() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), dir + "/config.json: cannot open (is " + dir + " a model directory?)");
  }
  std::ofstream(dir + "/config.json") << "{\"vocab_size\": 5,";
  try {
    ModelCard::FromDirectory(dir);
    ADD_FAILURE() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(dir + "/config.json: not valid JSON: ", 0), 0u) << e.what();
  }

  EXPECT_EQ(Error("[1, 2]"), "x/config.json: config must be a JSON object");
  EXPECT_EQ(Error(R"({"vocab_size": "129280"})"), "x/config.json: field \"vocab_size\" must be an integer >= 1");
  EXPECT_EQ(Error(R"({"vocab_size": 0})"), "x/config.json: field \"vocab_size\" must be an integer >= 1");
  EXPECT_EQ(Error(R"({"max_position_embeddings": 4096.5})"),
            "x/config.json: field \"max_position_embeddings\" must be an integer >= 1");
  EXPECT_EQ(Error(R"({"model_type": 4})"), "x/config.json: field \"model_type\" must be a string");
  EXPECT_EQ(Error(R"({"architectures": "DeepseekV4ForCausalLM"})"),
            "x/config.json: field \"architectures\" must be a list of strings");
  EXPECT_EQ(Error(R"({"eos_token_id": "1"})"),
            "x/config.json: field \"eos_token_id\" must be an integer or a list of integers");
  EXPECT_EQ(Error(R"({"num_nextn_predict_layers": -1})"),
            "x/config.json: field \"num_nextn_predict_layers\" must be an integer >= 0");
  EXPECT_EQ(Error(R"({"vision_n_layers": 2, "vision_patch_size": "14"})"),
            "x/config.json: field \"vision_patch_size\" must be an integer >= 1");
}

}  // namespace
}  // namespace dsmesh
