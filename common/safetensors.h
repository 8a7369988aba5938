// Reading and writing the safetensors format (https://huggingface.co/docs/safetensors):
//   [8-byte little-endian header length N][N bytes of JSON header][data bytes]
// The header maps tensor names to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to
// the data section), plus an optional "__metadata__" object of string -> string.
// Files are memory-mapped and tensors are zero-copy views; every structural problem is reported with
// the file path and, where one is involved, the tensor name.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/tensor.h"

namespace dsmesh {

class SafetensorsFile {
 public:
  // Maps and validates the whole header; throws std::runtime_error naming `path` and the problem.
  static std::shared_ptr<SafetensorsFile> Open(const std::string& path);

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;  // sorted
  bool Has(const std::string& name) const { return entries_.count(name) > 0; }
  // A view into the mapping; the tensor's owner keeps the mapping alive. Throws naming file and tensor.
  Tensor Get(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  struct Entry {
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t begin;  // absolute byte offsets in the file
    uint64_t end;
  };

  SafetensorsFile() = default;

  std::string path_;
  std::shared_ptr<void> mapping_;  // munmaps when the last file object or tensor view goes away
  const uint8_t* base_ = nullptr;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// A model directory: the shards named by model.safetensors.index.json if present, else every *.safetensors
// file in it. Tensor names are unique across shards.
class Checkpoint {
 public:
  static Checkpoint Open(const std::string& dir);

  bool Has(const std::string& name) const { return file_of_.count(name) > 0; }
  Tensor Get(const std::string& name) const;  // throws naming the directory and tensor when missing
  std::vector<std::string> names() const;     // sorted
  const std::string& dir() const { return dir_; }
  std::string FileOf(const std::string& name) const;  // path of the shard holding `name`

 private:
  std::string dir_;
  std::map<std::string, std::shared_ptr<SafetensorsFile>> files_;  // by path
  std::map<std::string, std::string> file_of_;                     // tensor name -> path
};

class SafetensorsWriter {
 public:
  // Copies `bytes` bytes of row-major data; throws if bytes != numel * DTypeSize or the name repeats.
  void Add(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data, size_t bytes);
  void Add(const std::string& name, const Tensor& tensor) {
    Add(name, tensor.dtype, tensor.shape, tensor.data, tensor.nbytes());
  }
  void SetMetadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  // Writes to a temporary file beside `path`, then renames it into place, so readers never see half a file.
  // The header is padded with spaces to a multiple of 8 bytes, as Hugging Face's writer does.
  void Write(const std::string& path) const;

 private:
  struct Pending {
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::map<std::string, Pending> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace dsmesh
