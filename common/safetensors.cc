#include "common/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

namespace dsmesh {
namespace {

using nlohmann::json;

// Hugging Face's reader refuses headers above 100 MB; a larger one is a corrupt length field.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
constexpr const char* kMetadataKey = "__metadata__";

[[noreturn]] void Fail(const std::string& path, const std::string& problem) {
  throw std::runtime_error("safetensors file " + path + ": " + problem);
}

[[noreturn]] void FailTensor(const std::string& path, const std::string& name, const std::string& problem) {
  throw std::runtime_error("safetensors file " + path + ": tensor '" + name + "': " + problem);
}

std::string ErrnoText() { return std::strerror(errno); }

// A read-only mapping of a whole file, unmapped when the last owner lets go.
struct Mapping {
  void* address = nullptr;
  size_t length = 0;
  ~Mapping() {
    if (address != nullptr) munmap(address, length);
  }
};

// JSON objects silently keep one value for a repeated key, which would hide a duplicated tensor name.
// This parser callback sees every key before the merge and records the first repeat.
class DuplicateKeyDetector {
 public:
  bool operator()(int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        open_objects_.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!open_objects_.empty()) open_objects_.pop_back();
        break;
      case json::parse_event_t::key: {
        if (open_objects_.empty()) break;
        const std::string& key = parsed.get_ref<const std::string&>();
        if (open_objects_.size() == 1) current_top_key_ = key;
        if (!open_objects_.back().insert(key).second && problem_.empty()) {
          if (open_objects_.size() == 1) {
            problem_ = key == kMetadataKey ? "the header has two '__metadata__' entries"
                                           : "duplicate tensor name '" + key + "' in the header";
          } else {
            problem_ = "duplicate key '" + key + "' inside header entry '" + current_top_key_ + "'";
          }
        }
        break;
      }
      default:
        break;
    }
    return true;
  }
  const std::string& problem() const { return problem_; }

 private:
  std::vector<std::set<std::string>> open_objects_;
  std::string current_top_key_;
  std::string problem_;
};

std::string OffsetsText(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + "]";
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  Tensor t;
  t.shape = shape;
  return t.ShapeString();
}

// Reads a JSON value that must be a non-negative integer.
bool AsUnsigned(const json& value, uint64_t& out) {
  if (!value.is_number_unsigned()) {
    if (value.is_number_integer() && value.get<int64_t>() >= 0) {
      out = static_cast<uint64_t>(value.get<int64_t>());
      return true;
    }
    return false;
  }
  out = value.get<uint64_t>();
  return true;
}

}  // namespace

std::shared_ptr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) Fail(path, "cannot open: " + ErrnoText());
  struct stat info;
  if (fstat(fd, &info) != 0) {
    std::string problem = "cannot stat: " + ErrnoText();
    ::close(fd);
    Fail(path, problem);
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    Fail(path, "not a regular file");
  }
  const uint64_t file_size = static_cast<uint64_t>(info.st_size);
  if (file_size < 8) {
    ::close(fd);
    Fail(path, "file is " + std::to_string(file_size) +
                   " bytes, too short for the 8-byte header length (truncated header)");
  }
  void* address = mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  std::string map_error = address == MAP_FAILED ? ErrnoText() : "";
  ::close(fd);
  if (address == MAP_FAILED) Fail(path, "cannot mmap: " + map_error);
  auto mapping = std::make_shared<Mapping>();
  mapping->address = address;
  mapping->length = file_size;

  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->mapping_ = mapping;
  file->base_ = static_cast<const uint8_t*>(address);

  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | file->base_[i];  // little-endian
  if (header_bytes > file_size - 8) {
    Fail(path, "header length " + std::to_string(header_bytes) + " runs past the end of the " +
                   std::to_string(file_size) + "-byte file (truncated header)");
  }
  if (header_bytes > kMaxHeaderBytes) {
    Fail(path, "header length " + std::to_string(header_bytes) + " exceeds the 100 MB limit");
  }
  const uint64_t data_start = 8 + header_bytes;
  const uint64_t data_bytes = file_size - data_start;

  const char* header_text = reinterpret_cast<const char*>(file->base_ + 8);
  DuplicateKeyDetector duplicates;
  json header;
  try {
    header = json::parse(header_text, header_text + header_bytes, std::ref(duplicates));
  } catch (const json::exception& e) {
    Fail(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) Fail(path, std::string("header is JSON but not an object (it is ") + header.type_name() + ")");
  if (!duplicates.problem().empty()) Fail(path, duplicates.problem());

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& entry = it.value();
    if (name == kMetadataKey) {
      if (!entry.is_object()) Fail(path, "'__metadata__' is not an object of strings");
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (!m.value().is_string()) Fail(path, "'__metadata__' value for key '" + m.key() + "' is not a string");
        file->metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!entry.is_object()) FailTensor(path, name, "header entry is not an object");
    if (!entry.contains("dtype") || !entry["dtype"].is_string()) FailTensor(path, name, "missing string field 'dtype'");
    if (!entry.contains("shape") || !entry["shape"].is_array()) FailTensor(path, name, "missing array field 'shape'");
    if (!entry.contains("data_offsets") || !entry["data_offsets"].is_array() || entry["data_offsets"].size() != 2) {
      FailTensor(path, name, "missing field 'data_offsets' of two integers");
    }
    Entry parsed;
    try {
      parsed.dtype = DTypeFromName(entry["dtype"].get<std::string>());
    } catch (const std::runtime_error& e) {
      FailTensor(path, name, e.what());
    }
    // numel * element size must not overflow before we compare it with the byte span.
    uint64_t expected_bytes = DTypeSize(parsed.dtype);
    bool overflow = false;
    for (const json& dim : entry["shape"]) {
      uint64_t extent;
      if (!AsUnsigned(dim, extent) || extent > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        FailTensor(path, name, "shape " + entry["shape"].dump() + " has an entry that is not a non-negative integer");
      }
      parsed.shape.push_back(static_cast<int64_t>(extent));
      if (extent != 0 && expected_bytes > std::numeric_limits<uint64_t>::max() / extent) overflow = true;
      expected_bytes *= extent;
    }
    uint64_t begin, end;
    if (!AsUnsigned(entry["data_offsets"][0], begin) || !AsUnsigned(entry["data_offsets"][1], end)) {
      FailTensor(path, name, "data_offsets " + entry["data_offsets"].dump() + " are not non-negative integers");
    }
    if (begin > end) FailTensor(path, name, "data_offsets " + OffsetsText(begin, end) + " are reversed (begin > end)");
    if (end > data_bytes) {
      FailTensor(path, name, "data_offsets " + OffsetsText(begin, end) + " out of range: the data section is " +
                                 std::to_string(data_bytes) + " bytes");
    }
    if (overflow || expected_bytes != end - begin) {
      FailTensor(path, name, "shape " + ShapeText(parsed.shape) + " of " + DTypeName(parsed.dtype) + " needs " +
                                 (overflow ? std::string("more than 2^64") : std::to_string(expected_bytes)) +
                                 " bytes but data_offsets " + OffsetsText(begin, end) + " span " +
                                 std::to_string(end - begin) + " bytes");
    }
    parsed.begin = data_start + begin;
    parsed.end = data_start + end;
    file->entries_.emplace(name, std::move(parsed));
  }

  // No two tensors may share bytes (empty tensors occupy none).
  std::vector<std::pair<const std::string*, const Entry*>> by_offset;
  for (const auto& [name, entry] : file->entries_) {
    if (entry.end > entry.begin) by_offset.emplace_back(&name, &entry);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const auto& a, const auto& b) { return a.second->begin < b.second->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const Entry& previous = *by_offset[i - 1].second;
    const Entry& current = *by_offset[i].second;
    if (current.begin < previous.end) {
      Fail(path, "tensors '" + *by_offset[i - 1].first + "' (data_offsets " +
                     OffsetsText(previous.begin - data_start, previous.end - data_start) + ") and '" +
                     *by_offset[i].first + "' (data_offsets " +
                     OffsetsText(current.begin - data_start, current.end - data_start) + ") overlap");
    }
  }
  return file;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> result;
  result.reserve(entries_.size());
  for (const auto& [name, entry] : entries_) result.push_back(name);
  return result;
}

Tensor SafetensorsFile::Get(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    FailTensor(path_, name, "no such tensor (the file has " + std::to_string(entries_.size()) + " tensors)");
  }
  Tensor tensor;
  tensor.dtype = it->second.dtype;
  tensor.shape = it->second.shape;
  // The mapping is read-only: views must never be written through.
  tensor.data = const_cast<uint8_t*>(base_ + it->second.begin);
  tensor.owner = mapping_;
  return tensor;
}

// ---------------------------------------------------------------------------------------------------------------

Checkpoint Checkpoint::Open(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (!fs::is_directory(dir, error)) {
    throw std::runtime_error("checkpoint " + dir + ": not a directory (or does not exist)");
  }
  Checkpoint checkpoint;
  checkpoint.dir_ = dir;

  std::vector<std::string> shard_paths;
  std::map<std::string, std::string> index_map;  // tensor name -> shard path, from the index
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index_path)) {
    std::ifstream in(index_path);
    if (!in) throw std::runtime_error("checkpoint index " + index_path.string() + ": cannot read");
    json index;
    try {
      index = json::parse(in);
    } catch (const json::exception& e) {
      throw std::runtime_error("checkpoint index " + index_path.string() + ": not valid JSON: " + e.what());
    }
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      throw std::runtime_error("checkpoint index " + index_path.string() + ": missing object 'weight_map'");
    }
    std::set<std::string> unique;
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      if (!it.value().is_string()) {
        throw std::runtime_error("checkpoint index " + index_path.string() + ": weight_map entry for tensor '" +
                                 it.key() + "' is not a file name");
      }
      std::string shard = (fs::path(dir) / it.value().get<std::string>()).string();
      index_map[it.key()] = shard;
      if (unique.insert(shard).second) shard_paths.push_back(shard);
    }
    if (shard_paths.empty()) {
      throw std::runtime_error("checkpoint index " + index_path.string() + ": weight_map is empty");
    }
  } else {
    for (const auto& item : fs::directory_iterator(dir, error)) {
      if (item.path().extension() == ".safetensors" && item.is_regular_file(error)) {
        shard_paths.push_back(item.path().string());
      }
    }
    if (error) throw std::runtime_error("checkpoint " + dir + ": cannot list directory: " + error.message());
    if (shard_paths.empty()) {
      throw std::runtime_error("checkpoint " + dir + ": no model.safetensors.index.json and no *.safetensors files");
    }
  }
  std::sort(shard_paths.begin(), shard_paths.end());

  for (const std::string& shard_path : shard_paths) {
    auto file = SafetensorsFile::Open(shard_path);
    for (const std::string& name : file->names()) {
      auto [it, inserted] = checkpoint.file_of_.emplace(name, shard_path);
      if (!inserted) {
        throw std::runtime_error("checkpoint " + dir + ": tensor '" + name + "' appears in both " + it->second +
                                 " and " + shard_path);
      }
    }
    checkpoint.files_[shard_path] = std::move(file);
  }
  for (const auto& [name, shard] : index_map) {
    auto it = checkpoint.file_of_.find(name);
    if (it == checkpoint.file_of_.end()) {
      throw std::runtime_error("checkpoint index " + index_path.string() + ": tensor '" + name + "' is listed in " +
                               shard + " but that file does not contain it");
    }
    if (it->second != shard) {
      throw std::runtime_error("checkpoint index " + index_path.string() + ": tensor '" + name + "' is listed in " +
                               shard + " but is in " + it->second);
    }
  }
  return checkpoint;
}

Tensor Checkpoint::Get(const std::string& name) const {
  auto it = file_of_.find(name);
  if (it == file_of_.end()) throw std::runtime_error("checkpoint " + dir_ + ": no tensor named '" + name + "'");
  return files_.at(it->second)->Get(name);
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> result;
  result.reserve(file_of_.size());
  for (const auto& [name, path] : file_of_) result.push_back(name);
  return result;
}

std::string Checkpoint::FileOf(const std::string& name) const {
  auto it = file_of_.find(name);
  if (it == file_of_.end()) throw std::runtime_error("checkpoint " + dir_ + ": no tensor named '" + name + "'");
  return it->second;
}

// ---------------------------------------------------------------------------------------------------------------

void SafetensorsWriter::Add(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data,
                            size_t bytes) {
  if (name.empty() || name == kMetadataKey) {
    throw std::runtime_error("SafetensorsWriter: invalid tensor name '" + name + "'");
  }
  if (tensors_.count(name)) throw std::runtime_error("SafetensorsWriter: tensor '" + name + "' added twice");
  Tensor shape_only;
  shape_only.dtype = dtype;
  shape_only.shape = shape;
  for (int64_t dim : shape) {
    if (dim < 0) throw std::runtime_error("SafetensorsWriter: tensor '" + name + "' has negative dimension");
  }
  if (shape_only.nbytes() != bytes) {
    throw std::runtime_error("SafetensorsWriter: tensor '" + name + "' shape " + shape_only.ShapeString() + " of " +
                             DTypeName(dtype) + " needs " + std::to_string(shape_only.nbytes()) + " bytes, got " +
                             std::to_string(bytes));
  }
  if (bytes > 0 && data == nullptr) throw std::runtime_error("SafetensorsWriter: tensor '" + name + "' has no data");
  Pending pending{dtype, std::move(shape), {}};
  const uint8_t* source = static_cast<const uint8_t*>(data);
  if (bytes > 0) pending.bytes.assign(source, source + bytes);
  tensors_.emplace(name, std::move(pending));
}

void SafetensorsWriter::Write(const std::string& path) const {
  // Larger elements first (then by name), so with an 8-aligned data section every tensor is aligned
  // to its element size, as in Hugging Face's writer.
  std::vector<const std::pair<const std::string, Pending>*> order;
  for (const auto& item : tensors_) order.push_back(&item);
  std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return DTypeSize(a->second.dtype) > DTypeSize(b->second.dtype);
  });

  json header = json::object();
  if (!metadata_.empty()) header[kMetadataKey] = metadata_;
  uint64_t offset = 0;
  for (const auto* item : order) {
    uint64_t size = item->second.bytes.size();
    header[item->first] = {{"dtype", DTypeName(item->second.dtype)},
                           {"shape", item->second.shape},
                           {"data_offsets", {offset, offset + size}}};
    offset += size;
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(static_cast<uint64_t>(header_text.size()) >> (8 * i));

  const std::string temp_path = path + ".tmp." + std::to_string(getpid());
  FILE* out = std::fopen(temp_path.c_str(), "wb");
  if (out == nullptr) throw std::runtime_error("safetensors file " + path + ": cannot create " + temp_path + ": " + ErrnoText());
  bool ok = std::fwrite(length, 1, 8, out) == 8 &&
            std::fwrite(header_text.data(), 1, header_text.size(), out) == header_text.size();
  for (const auto* item : order) {
    const auto& bytes = item->second.bytes;
    if (ok && !bytes.empty()) ok = std::fwrite(bytes.data(), 1, bytes.size(), out) == bytes.size();
  }
  std::string write_error = ok ? "" : ErrnoText();
  if (std::fclose(out) != 0 && ok) {
    ok = false;
    write_error = ErrnoText();
  }
  if (!ok) {
    std::remove(temp_path.c_str());
    throw std::runtime_error("safetensors file " + path + ": write failed: " + write_error);
  }
  if (std::rename(temp_path.c_str(), path.c_str()) != 0) {
    std::string rename_error = ErrnoText();
    std::remove(temp_path.c_str());
    throw std::runtime_error("safetensors file " + path + ": cannot rename " + temp_path + " into place: " + rename_error);
  }
}

}  // namespace dsmesh
