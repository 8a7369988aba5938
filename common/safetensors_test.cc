// The safetensors reader/writer: round trips of every dtype, hand-crafted broken files (each must fail
// with a message naming the file and the tensor), sharded checkpoints, and files written by exllamav3/torch.
#include "common/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>

#include "common/half.h"
#include "common/repo_file.h"

namespace dsmesh {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test under the test's temp dir.
std::string TestDir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = fs::path(::testing::TempDir()) / ("st_" + std::to_string(getpid())) /
                 (std::string(info->test_suite_name()) + "_" + info->name());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

// A safetensors file built by hand: length prefix (or an explicit one), header text, data bytes.
std::string RawFile(const std::string& header, size_t data_bytes, int64_t length_override = -1) {
  uint64_t length = length_override >= 0 ? static_cast<uint64_t>(length_override) : header.size();
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  return bytes + header + std::string(data_bytes, '\x01');
}

std::string ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Runs `action`, which must throw; returns the message.
std::string ErrorOf(const std::function<void()>& action) {
  try {
    action();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

std::string OpenError(const std::string& path) {
  return ErrorOf([&] { SafetensorsFile::Open(path); });
}

TEST(DType, NamesRoundTripAndUnknownIsRefused) {
  for (DType d : {DType::kBool, DType::kU8, DType::kI8, DType::kI16, DType::kI32, DType::kI64, DType::kF8E4M3,
                  DType::kF16, DType::kBF16, DType::kF32, DType::kF64}) {
    EXPECT_EQ(DTypeFromName(DTypeName(d)), d);
  }
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
  EXPECT_EQ(DTypeSize(DType::kF8E4M3), 1u);
  EXPECT_STREQ(DTypeName(DType::kF8E4M3), "F8_E4M3");
  EXPECT_NE(ErrorOf([] { DTypeFromName("F8_E5M2"); }).find("F8_E5M2"), std::string::npos);
}

TEST(Tensor, ShapeAndConversion) {
  Tensor t = AllocateTensor(DType::kBF16, {2, 3});
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.nbytes(), 12u);
  EXPECT_EQ(t.ShapeString(), "[2, 3]");
  t.as<uint16_t>()[4] = FloatToBf16(-1.5f);
  EXPECT_EQ(ToFloatVector(t), (std::vector<float>{0, 0, 0, 0, -1.5f, 0}));
  EXPECT_THROW(t.as<float>(), std::runtime_error);
  Tensor scalar = AllocateTensor(DType::kI64, {});
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.ShapeString(), "[]");
}

TEST(Safetensors, EveryDTypeRoundTrips) {
  std::string path = TestDir() + "/all.safetensors";
  SafetensorsWriter writer;
  uint8_t bools[3] = {1, 0, 1};
  uint8_t u8[3] = {0, 7, 255};
  int8_t i8[3] = {-128, 0, 127};
  int16_t i16[3] = {-32768, 5, 32767};
  int32_t i32[3] = {-7, 0, 2147483647};
  int64_t i64[3] = {-9, 1, 1ll << 40};
  uint8_t f8[3] = {0x38, 0x7e, 0xc0};  // 1, 448, -2
  uint16_t f16[3] = {FloatToFp16(1.5f), FloatToFp16(-0.25f), FloatToFp16(65504.f)};
  uint16_t bf16[3] = {FloatToBf16(3.0f), FloatToBf16(-1e30f), FloatToBf16(0.5f)};
  float f32[6] = {1, 2, 3, 4, 5, 6.25f};
  double f64[3] = {1e-3, -2.5, 1e100};
  writer.Add("bool", DType::kBool, {3}, bools, sizeof(bools));
  writer.Add("u8", DType::kU8, {3}, u8, sizeof(u8));
  writer.Add("i8", DType::kI8, {3}, i8, sizeof(i8));
  writer.Add("i16", DType::kI16, {3}, i16, sizeof(i16));
  writer.Add("i32", DType::kI32, {3}, i32, sizeof(i32));
  writer.Add("i64", DType::kI64, {3}, i64, sizeof(i64));
  writer.Add("f8", DType::kF8E4M3, {3}, f8, sizeof(f8));
  writer.Add("f16", DType::kF16, {3}, f16, sizeof(f16));
  writer.Add("bf16", DType::kBF16, {1, 3}, bf16, sizeof(bf16));
  writer.Add("f32", DType::kF32, {2, 1, 3}, f32, sizeof(f32));
  writer.Add("f64", DType::kF64, {3}, f64, sizeof(f64));
  writer.Add("scalar", DType::kF32, {}, f32, 4);
  writer.Add("empty", DType::kF32, {0, 4}, nullptr, 0);
  writer.SetMetadata("format", "pt");
  EXPECT_THROW(writer.Add("f32", DType::kF32, {1}, f32, 4), std::runtime_error);  // duplicate
  EXPECT_THROW(writer.Add("bad", DType::kF32, {2}, f32, 4), std::runtime_error);  // size mismatch
  writer.Write(path);

  // Header padded to 8 bytes like HF's writer, and every tensor aligned to its element size.
  std::string raw = ReadFileBytes(path);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(raw[i]);
  EXPECT_EQ(header_len % 8, 0u);

  auto file = SafetensorsFile::Open(path);
  EXPECT_EQ(file->path(), path);
  EXPECT_EQ(file->names().size(), 13u);
  EXPECT_EQ(file->metadata().at("format"), "pt");
  for (const std::string& name : file->names()) {
    Tensor t = file->Get(name);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % DTypeSize(t.dtype), 0u) << name;
  }
  EXPECT_EQ(ToFloatVector(file->Get("bool")), (std::vector<float>{1, 0, 1}));
  EXPECT_EQ(ToFloatVector(file->Get("u8")), (std::vector<float>{0, 7, 255}));
  EXPECT_EQ(ToFloatVector(file->Get("i8")), (std::vector<float>{-128, 0, 127}));
  EXPECT_EQ(ToFloatVector(file->Get("i16")), (std::vector<float>{-32768, 5, 32767}));
  EXPECT_EQ(ToFloatVector(file->Get("i32")), (std::vector<float>{-7, 0, 2147483647.f}));
  EXPECT_EQ(file->Get("i64").as<int64_t>()[2], 1ll << 40);
  EXPECT_EQ(ToFloatVector(file->Get("f8")), (std::vector<float>{1, 448, -2}));
  EXPECT_EQ(ToFloatVector(file->Get("f16")), (std::vector<float>{1.5f, -0.25f, 65504.f}));
  Tensor b = file->Get("bf16");
  EXPECT_EQ(b.dtype, DType::kBF16);
  EXPECT_EQ(b.shape, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(b.as<uint16_t>()[1], FloatToBf16(-1e30f));
  EXPECT_EQ(ToFloatVector(file->Get("f32")), (std::vector<float>{1, 2, 3, 4, 5, 6.25f}));
  EXPECT_EQ(file->Get("f32").shape, (std::vector<int64_t>{2, 1, 3}));
  EXPECT_EQ(file->Get("f64").as<double>()[2], 1e100);
  EXPECT_EQ(file->Get("scalar").numel(), 1);
  EXPECT_TRUE(file->Get("scalar").shape.empty());
  EXPECT_EQ(file->Get("empty").numel(), 0);
  EXPECT_TRUE(file->Has("f64"));
  EXPECT_FALSE(file->Has("f65"));
}

TEST(Safetensors, ViewsKeepTheMappingAlive) {
  std::string path = TestDir() + "/one.safetensors";
  float values[4] = {1, 2, 3, 4};
  SafetensorsWriter writer;
  writer.Add("x", DType::kF32, {4}, values, sizeof(values));
  writer.Write(path);
  Tensor view = SafetensorsFile::Open(path)->Get("x");  // the file object is gone after this line
  EXPECT_EQ(ToFloatVector(view), (std::vector<float>{1, 2, 3, 4}));
}

// Each malformed file must be refused with a message naming the file, the tensor and the problem.
TEST(Safetensors, BrokenFilesFailWithClearMessages) {
  std::string dir = TestDir();
  auto expect_error = [&](const std::string& label, const std::string& bytes, std::vector<std::string> needles) {
    std::string path = dir + "/" + label + ".safetensors";
    WriteBytes(path, bytes);
    std::string message = OpenError(path);
    needles.push_back(path);
    for (const std::string& needle : needles) {
      EXPECT_NE(message.find(needle), std::string::npos) << label << ": '" << needle << "' not in: " << message;
    }
  };
  const std::string ok_a = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";

  expect_error("empty", "", {"0 bytes", "truncated header"});
  expect_error("short", std::string("\x10\x00\x00", 3), {"3 bytes", "truncated header"});
  expect_error("length_past_end", RawFile("{}", 0, 1000), {"header length 1000", "truncated header"});
  expect_error("huge_length", RawFile("{}", 0, int64_t{1} << 62), {"runs past the end"});
  expect_error("not_json", RawFile("{\"a\": [1,", 0), {"not valid JSON"});
  expect_error("not_object", RawFile("[1, 2]", 0), {"not an object", "array"});
  expect_error("entry_not_object", RawFile(R"({"w":[1,2]})", 0), {"'w'", "not an object"});
  expect_error("out_of_range", RawFile("{" + ok_a + "}", 4), {"'a'", "[0, 8]", "out of range", "4 bytes"});
  expect_error("reversed", RawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8),
               {"'a'", "[8, 0]", "reversed"});
  expect_error("overlap",
               RawFile("{" + ok_a + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
               {"'a'", "'b'", "overlap"});
  expect_error("unknown_dtype", RawFile(R"({"q":{"dtype":"F7","shape":[2],"data_offsets":[0,8]}})", 8),
               {"'q'", "unknown", "'F7'"});
  expect_error("shape_mismatch", RawFile(R"({"s":{"dtype":"BF16","shape":[3,2],"data_offsets":[0,8]}})", 8),
               {"'s'", "[3, 2]", "BF16", "needs 12 bytes", "span 8 bytes"});
  expect_error("shape_overflow",
               RawFile(R"({"s":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
               {"'s'", "more than 2^64"});
  expect_error("negative_dim", RawFile(R"({"n":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
               {"'n'", "non-negative"});
  expect_error("float_offsets", RawFile(R"({"f":{"dtype":"F32","shape":[2],"data_offsets":[0,8.5]}})", 8),
               {"'f'", "data_offsets"});
  expect_error("missing_offsets", RawFile(R"({"m":{"dtype":"F32","shape":[2]}})", 8), {"'m'", "data_offsets"});
  expect_error("missing_dtype", RawFile(R"({"m":{"shape":[2],"data_offsets":[0,8]}})", 8), {"'m'", "dtype"});
  expect_error("duplicate_name",
               RawFile("{" + ok_a + R"(,"a":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})", 12),
               {"duplicate tensor name 'a'"});
  expect_error("duplicate_field", RawFile(R"({"d":{"dtype":"F32","dtype":"F16","shape":[2],"data_offsets":[0,8]}})", 8),
               {"duplicate key 'dtype'", "'d'"});
  expect_error("metadata_not_strings", RawFile(R"({"__metadata__":{"n":3}})", 0), {"__metadata__", "'n'", "not a string"});
  expect_error("metadata_not_object", RawFile(R"({"__metadata__":"x"})", 0), {"__metadata__", "not an object"});
  expect_error("two_metadata", RawFile(R"({"__metadata__":{},"__metadata__":{}})", 0), {"two '__metadata__'"});

  // A missing tensor is reported by Get, naming the file and the tensor.
  std::string good = dir + "/good.safetensors";
  WriteBytes(good, RawFile(R"({"__metadata__":{"format":"pt"},)" + ok_a + "}", 8));
  auto file = SafetensorsFile::Open(good);
  EXPECT_EQ(file->names(), std::vector<std::string>{"a"});  // __metadata__ is not a tensor
  EXPECT_EQ(file->metadata().at("format"), "pt");
  std::string message = ErrorOf([&] { file->Get("nope"); });
  EXPECT_NE(message.find(good), std::string::npos) << message;
  EXPECT_NE(message.find("'nope'"), std::string::npos) << message;

  // Not there at all, or a directory.
  EXPECT_NE(OpenError(dir + "/absent.safetensors").find("cannot open"), std::string::npos);
  EXPECT_NE(OpenError(dir).find("not a regular file"), std::string::npos);
}

void WriteShard(const std::string& path, const std::vector<std::string>& names) {
  SafetensorsWriter writer;
  for (size_t i = 0; i < names.size(); ++i) {
    float value = static_cast<float>(i + 1);
    writer.Add(names[i], DType::kF32, {1}, &value, sizeof(value));
  }
  writer.Write(path);
}

TEST(Checkpoint, ShardedThroughIndex) {
  std::string dir = TestDir();
  WriteShard(dir + "/model-00001-of-00002.safetensors", {"embed", "layers.0.w"});
  WriteShard(dir + "/model-00002-of-00002.safetensors", {"layers.1.w", "head"});
  WriteShard(dir + "/golden.safetensors", {"logits", "embed"});  // not in the index: ignored
  WriteBytes(dir + "/model.safetensors.index.json",
             R"({"metadata":{"total_size":16},"weight_map":{"embed":"model-00001-of-00002.safetensors",
                 "layers.0.w":"model-00001-of-00002.safetensors","layers.1.w":"model-00002-of-00002.safetensors",
                 "head":"model-00002-of-00002.safetensors"}})");
  Checkpoint checkpoint = Checkpoint::Open(dir);
  EXPECT_EQ(checkpoint.dir(), dir);
  EXPECT_EQ(checkpoint.names(), (std::vector<std::string>{"embed", "head", "layers.0.w", "layers.1.w"}));
  EXPECT_EQ(checkpoint.FileOf("head"), dir + "/model-00002-of-00002.safetensors");
  EXPECT_EQ(ToFloatVector(checkpoint.Get("head")), std::vector<float>{2});
  EXPECT_EQ(ToFloatVector(checkpoint.Get("layers.0.w")), std::vector<float>{2});
  EXPECT_FALSE(checkpoint.Has("logits"));
  std::string message = ErrorOf([&] { checkpoint.Get("missing"); });
  EXPECT_NE(message.find(dir), std::string::npos);
  EXPECT_NE(message.find("'missing'"), std::string::npos);
}

TEST(Checkpoint, IndexThatLiesIsRefused) {
  std::string dir = TestDir();
  WriteShard(dir + "/a.safetensors", {"x"});
  WriteShard(dir + "/b.safetensors", {"y"});
  WriteBytes(dir + "/model.safetensors.index.json", R"({"weight_map":{"x":"b.safetensors","y":"b.safetensors"}})");
  std::string message = ErrorOf([&] { Checkpoint::Open(dir); });
  EXPECT_NE(message.find("'x'"), std::string::npos) << message;
  EXPECT_NE(message.find("does not contain it"), std::string::npos) << message;

  WriteBytes(dir + "/model.safetensors.index.json", R"({"weight_map":{"x":"missing.safetensors"}})");
  message = ErrorOf([&] { Checkpoint::Open(dir); });
  EXPECT_NE(message.find(dir + "/missing.safetensors"), std::string::npos) << message;

  WriteBytes(dir + "/model.safetensors.index.json", R"({"weight_map":)");
  message = ErrorOf([&] { Checkpoint::Open(dir); });
  EXPECT_NE(message.find("model.safetensors.index.json"), std::string::npos) << message;
  EXPECT_NE(message.find("not valid JSON"), std::string::npos) << message;
}

TEST(Checkpoint, DirectoryWithoutIndex) {
  std::string dir = TestDir();
  WriteShard(dir + "/one.safetensors", {"a", "b"});
  WriteShard(dir + "/two.safetensors", {"c"});
  WriteBytes(dir + "/config.json", "{}");
  Checkpoint checkpoint = Checkpoint::Open(dir);
  EXPECT_EQ(checkpoint.names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(checkpoint.FileOf("c"), dir + "/two.safetensors");

  // The same tensor name in two shards: the error names both files.
  WriteShard(dir + "/three.safetensors", {"b"});
  std::string message = ErrorOf([&] { Checkpoint::Open(dir); });
  EXPECT_NE(message.find("'b'"), std::string::npos) << message;
  EXPECT_NE(message.find(dir + "/one.safetensors"), std::string::npos) << message;
  EXPECT_NE(message.find(dir + "/three.safetensors"), std::string::npos) << message;

  std::string empty = dir + "/empty";
  fs::create_directories(empty);
  EXPECT_NE(ErrorOf([&] { Checkpoint::Open(empty); }).find("no model.safetensors.index.json"), std::string::npos);
  EXPECT_NE(ErrorOf([&] { Checkpoint::Open(dir + "/nope"); }).find("not a directory"), std::string::npos);
}

// Files written by exllamav3 through torch/safetensors (not by this project) must read back correctly.
TEST(Safetensors, ReadsFilesWrittenByExllamav3) {
  const std::string base = "kernels/exl3/testdata/";
  auto codebooks = SafetensorsFile::Open(RepoFile(base + "exl3_codebooks.safetensors"));
  EXPECT_EQ(codebooks->names(), (std::vector<std::string>{"codebook.3inst", "codebook.mcg", "codebook.mul1"}));
  Tensor mcg = codebooks->Get("codebook.mcg");
  EXPECT_EQ(mcg.dtype, DType::kF16);
  EXPECT_EQ(mcg.shape, std::vector<int64_t>{65536});
  std::vector<float> values = ToFloatVector(mcg);
  double sum_squares = 0;
  for (float v : values) {
    ASSERT_TRUE(std::isfinite(v));
    sum_squares += double(v) * v;
  }
  EXPECT_GT(sum_squares, 0.0);  // a real codebook, not zeros

  auto linear = SafetensorsFile::Open(RepoFile(base + "exl3_linear.safetensors"));
  std::map<DType, int> counts;
  for (const std::string& name : linear->names()) counts[linear->Get(name).dtype]++;
  EXPECT_EQ(linear->names().size(), 50u);
  EXPECT_EQ(counts[DType::kF16], 30);
  EXPECT_EQ(counts[DType::kF32], 16);
  EXPECT_EQ(counts[DType::kI16], 4);
  Tensor y1 = linear->Get("K2.1024x512.mcg.y1");
  EXPECT_EQ(y1.dtype, DType::kF32);
  EXPECT_EQ(y1.shape, (std::vector<int64_t>{1, 512}));
  Tensor trellis = linear->Get("K6.1024x512.mcg.trellis");
  EXPECT_EQ(trellis.dtype, DType::kI16);
  EXPECT_EQ(trellis.shape, (std::vector<int64_t>{64, 32, 96}));

  auto reconstruct = SafetensorsFile::Open(RepoFile(base + "exl3_reconstruct.safetensors"));
  EXPECT_EQ(reconstruct->names().size(), 64u);
  Tensor what = reconstruct->Get("K1.256x384.mcg.what");
  EXPECT_EQ(what.dtype, DType::kF16);
  EXPECT_EQ(what.shape, (std::vector<int64_t>{256, 384}));
  Tensor last = reconstruct->Get("K8.256x384.trellis");
  EXPECT_EQ(last.dtype, DType::kI16);
  EXPECT_EQ(last.shape, (std::vector<int64_t>{16, 24, 128}));
}

// The golden fixture (tests/golden/tiny_v4) was written by safetensors 0.8.0 from torch: BF16, F32 and I64
// tensors, and an index that keeps golden.safetensors (beside the weights) out of the checkpoint.
TEST(Checkpoint, ReadsTheGoldenFixtureWrittenByTorch) {
  const char* root = std::getenv("DSMESH_ROOT");
  ASSERT_NE(root, nullptr) << "DSMESH_ROOT must point at the repository root (tests/golden/tiny_v4)";
  std::string dir = std::string(root) + "/tests/golden/tiny_v4";
  Checkpoint checkpoint = Checkpoint::Open(dir);
  EXPECT_EQ(checkpoint.names().size(), 149u);
  EXPECT_FALSE(checkpoint.Has("logits"));  // golden.safetensors is not a shard
  EXPECT_EQ(checkpoint.FileOf("lm_head.weight"), dir + "/model.safetensors");

  Tensor embed = checkpoint.Get("model.embed_tokens.weight");
  EXPECT_EQ(embed.dtype, DType::kBF16);
  EXPECT_EQ(embed.shape, (std::vector<int64_t>{512, 128}));
  Tensor fn = checkpoint.Get("model.layers.0.attn_hc.fn");
  EXPECT_EQ(fn.dtype, DType::kF32);
  EXPECT_EQ(fn.shape, (std::vector<int64_t>{24, 512}));
  Tensor experts = checkpoint.Get("model.layers.2.mlp.experts.gate_up_proj");
  EXPECT_EQ(experts.shape, (std::vector<int64_t>{16, 64, 128}));

  // tid2eid rows name distinct experts in [0, 16).
  Tensor tid2eid = checkpoint.Get("model.layers.0.mlp.gate.tid2eid");
  ASSERT_EQ(tid2eid.dtype, DType::kI64);
  ASSERT_EQ(tid2eid.shape, (std::vector<int64_t>{512, 4}));
  const int64_t* table = tid2eid.as<int64_t>();
  for (int64_t row = 0; row < 512; ++row) {
    std::set<int64_t> experts_in_row(table + row * 4, table + row * 4 + 4);
    ASSERT_EQ(experts_in_row.size(), 4u) << "row " << row;
    ASSERT_GE(*experts_in_row.begin(), 0);
    ASSERT_LT(*experts_in_row.rbegin(), 16);
  }

  auto golden = SafetensorsFile::Open(dir + "/golden.safetensors");
  Tensor logits = golden->Get("logits");
  EXPECT_EQ(logits.dtype, DType::kF32);
  EXPECT_EQ(logits.shape, (std::vector<int64_t>{70, 512}));
  EXPECT_EQ(golden->Get("input_ids").shape, std::vector<int64_t>{70});
  EXPECT_EQ(golden->Get("greedy_tokens").dtype, DType::kI64);
  EXPECT_EQ(golden->metadata().count("versions"), 1u);
  // The prompt logits and the first 70 rows of the whole-sequence forward agree (causality).
  std::vector<float> prompt_logits = ToFloatVector(logits);
  std::vector<float> all_logits = ToFloatVector(golden->Get("logits_all"));
  for (size_t i = 0; i < prompt_logits.size(); ++i) ASSERT_NEAR(prompt_logits[i], all_logits[i], 1e-4);
}

}  // namespace
}  // namespace dsmesh
