#include "worker/gloo_communicator.h"

#include <cstring>
#include <stdexcept>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

namespace dsmesh {
namespace {
// c = a + b elementwise, n floats (Gloo's reduce-function signature).
void SumFloats(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<float*>(c);
  auto* x = static_cast<const float*>(a);
  auto* y = static_cast<const float*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = x[i] + y[i];
}
}  // namespace

GlooCommunicator::GlooCommunicator(int rank, int world, gloo::rendezvous::Store& store, const std::string& host,
                                   std::chrono::milliseconds timeout)
    : rank_(rank), world_(world) {
  gloo::transport::tcp::attr attr;
  attr.hostname = host;
  auto device = gloo::transport::tcp::CreateDevice(attr);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, world);
  context->setTimeout(timeout);
  try {
    context->connectFullMesh(store, device);
  } catch (const std::exception& e) {
    throw std::runtime_error("gloo: rank " + std::to_string(rank) + " of " + std::to_string(world) +
                             " could not connect to its peers: " + e.what());
  }
  context_ = context;
}

GlooCommunicator::~GlooCommunicator() = default;

void GlooCommunicator::AllReduceSum(float* data, size_t n) {
  if (world_ == 1 || n == 0) return;
  gloo::AllreduceOptions opts(context_);
  opts.setOutput(data, n);
  opts.setReduceFunction(&SumFloats);
  opts.setTag(tag_++);
  gloo::allreduce(opts);
}

void GlooCommunicator::AllGather(const float* in, size_t n, float* out) {
  if (world_ == 1) {
    if (out != in) std::memcpy(out, in, n * sizeof(float));
    return;
  }
  gloo::AllgatherOptions opts(context_);
  opts.setInput(const_cast<float*>(in), n);
  opts.setOutput(out, n * world_);
  opts.setTag(tag_++);
  gloo::allgather(opts);
}

void GlooCommunicator::Broadcast(void* data, size_t bytes, int root) {
  if (world_ == 1 || bytes == 0) return;
  gloo::BroadcastOptions opts(context_);
  opts.setOutput(static_cast<uint8_t*>(data), bytes);
  opts.setRoot(root);
  opts.setTag(tag_++);
  gloo::broadcast(opts);
}

}  // namespace dsmesh
