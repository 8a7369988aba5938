// nccl_abi.h must agree with NVIDIA's nccl.h. The header is read as text (Bazel cannot include it);
// DSMESH_NCCL_HEADER overrides its location. A machine without the CUDA toolkit fails this test with
// a message naming the missing file, rather than skipping it.
#include <fstream>
#include <regex>
#include <sstream>

#include <gtest/gtest.h>

#include "worker/nccl_abi.h"

namespace dsmesh {
namespace {

std::string Header() {
  const char* env = std::getenv("DSMESH_NCCL_HEADER");
  const std::string path = env && *env ? env : "/usr/local/cuda/include/nccl.h";
  std::ifstream f(path);
  if (!f) ADD_FAILURE() << "cannot read " << path << " (install the CUDA toolkit or set DSMESH_NCCL_HEADER)";
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int Value(const std::string& text, const std::string& name) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex("\\b" + name + "\\s*=\\s*(\\d+)"))) {
    ADD_FAILURE() << name << " not found in nccl.h";
    return -1;
  }
  return std::stoi(m[1]);
}

TEST(NcclAbi, MatchesNvidiaHeader) {
  const std::string h = Header();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(h, m, std::regex("#define NCCL_UNIQUE_ID_BYTES (\\d+)")));
  EXPECT_EQ(std::stoul(m[1]), nccl::kUniqueIdBytes);
  EXPECT_EQ(Value(h, "ncclSuccess"), nccl::kSuccess);
  EXPECT_EQ(Value(h, "ncclSum"), nccl::kSum);
  EXPECT_EQ(Value(h, "ncclUint8"), nccl::kUint8);
  EXPECT_EQ(Value(h, "ncclFloat32"), nccl::kFloat32);
  // The signatures we call through dlsym.
  EXPECT_NE(h.find("ncclResult_t  ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);"),
            std::string::npos);
  EXPECT_NE(h.find("ncclResult_t  ncclGetUniqueId(ncclUniqueId* uniqueId);"), std::string::npos);
  EXPECT_TRUE(std::regex_search(h, std::regex("ncclResult_t  ncclAllReduce\\(const void\\* sendbuff, void\\* recvbuff, "
                                              "size_t count,\\s*ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t "
                                              "comm, cudaStream_t stream\\);")));
}

}  // namespace
}  // namespace dsmesh
