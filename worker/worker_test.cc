// A Worker (world 1, CPU, the tiny model) against an in-process coordinator that speaks the Session
// protocol and serves the rendezvous store: it says hello, joins the mesh and reports its pool, answers
// a greedy step plan with the model's own argmax token, answers a plan for a sequence it does not hold
// with an error naming its rank (and keeps serving), and exits 0 when drained.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "common/communicator.h"
#include "common/mesh/rendezvous_store.h"
#include "common/mesh/store_service.h"
#include "common/program.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/testing/test_util.h"
#include "model/testing/tiny_model.h"
#include "worker/worker.h"

namespace dsmesh {
namespace {

using SessionStream = grpc::ServerReaderWriter<CoordinatorMessage, WorkerMessage>;

// What the coordinator side saw, in order.
struct Transcript {
  WorkerHello hello;
  WorkerReady ready;
  std::vector<StepResult> results;
  std::string failure;  // the script's first unmet expectation ("" when it ran to the end)
};

// The coordinator's side of one session: form the mesh, send `plans` one at a time (each answered by a
// result), then drain.
class ScriptedCoordinator final : public RendezvousStoreService {
 public:
  ScriptedCoordinator(RendezvousStore* store, std::vector<StepPlan> plans)
      : RendezvousStoreService(store, nullptr), plans_(std::move(plans)) {}

  grpc::Status Session(grpc::ServerContext*, SessionStream* stream) override {
    WorkerMessage m;
    if (!Next(stream, &m) || !m.has_hello()) return Fail("no hello");
    transcript.hello = m.hello();
    CoordinatorMessage form;
    form.mutable_form()->set_epoch(1);
    form.mutable_form()->set_store_prefix("epoch1/");
    stream->Write(form);
    if (!Next(stream, &m) || !m.has_ready()) return Fail("no ready after the form");
    transcript.ready = m.ready();
    for (const StepPlan& plan : plans_) {
      CoordinatorMessage msg;
      *msg.mutable_plan() = plan;
      stream->Write(msg);
      if (!Next(stream, &m) || !m.has_result()) return Fail("no result for step " + std::to_string(plan.step_id()));
      transcript.results.push_back(m.result());
    }
    CoordinatorMessage drain;
    drain.mutable_drain();
    stream->Write(drain);
    return grpc::Status::OK;
  }

  Transcript transcript;

 private:
  // The next message that is not a heartbeat (those come from the worker's own thread at any time).
  static bool Next(SessionStream* stream, WorkerMessage* m) {
    while (stream->Read(m))
      if (!m->has_heartbeat()) return true;
    return false;
  }
  grpc::Status Fail(const std::string& what) {
    transcript.failure = what;
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, what);
  }

  std::vector<StepPlan> plans_;
};

std::string ModelDir() {
  const std::string dir = testing_util::TempDir("worker_test_model");
  WriteTinyModel(dir, 31, testing_util::SmallSpec());
  return dir;
}

Flags WorkerFlags(const std::vector<std::string>& args) { return ParseWorkerFlags(args); }

TEST(Worker, FormsTheMeshAnswersAPlanAndRefusesABadOne) {
  BlockShutdownSignals();  // as dsmesh-worker's main does: Run takes them on its own thread
  const std::string dir = ModelDir();
  const std::vector<int32_t> prompt = {5, 17, 200, 3, 42, 7};

  // The answer the worker must give: the model's greedy next token after the prompt.
  LocalCommunicator local;
  std::unique_ptr<Model> reference = LoadModel(dir, ShardSpec{}, MakeCpuBackend(1), &local);
  auto state = reference->NewState();
  Tensor logits = reference->Forward({{state.get(), prompt, false}})[0].logits;
  const float* row = logits.as<float>();
  const int64_t vocab = reference->config().vocab_size;
  const int32_t expected = static_cast<int32_t>(std::max_element(row, row + vocab) - row);

  StepPlan good;
  good.set_step_id(1);
  SequencePlan* sp = good.add_seqs();
  sp->set_seq_id(7);
  sp->set_is_new(true);
  sp->set_start_pos(0);
  sp->set_prompt_len(static_cast<int32_t>(prompt.size()));
  sp->set_sample(true);
  sp->mutable_sampling()->set_temperature(0);
  sp->mutable_tokens()->Add(prompt.begin(), prompt.end());
  StepPlan bad;  // a sequence the worker never started
  bad.set_step_id(2);
  SequencePlan* unknown = bad.add_seqs();
  unknown->set_seq_id(99);
  unknown->set_start_pos(4);
  unknown->set_sample(true);
  unknown->add_tokens(1);
  StepPlan next = good;  // the worker still serves after refusing: sequence 7 goes on
  next.set_step_id(3);
  next.mutable_seqs(0)->set_is_new(false);
  next.mutable_seqs(0)->set_start_pos(static_cast<int64_t>(prompt.size()));
  next.mutable_seqs(0)->clear_tokens();
  next.mutable_seqs(0)->add_tokens(expected);

  RendezvousStore store;
  ScriptedCoordinator coordinator(&store, {good, bad, next});
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&coordinator);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(port, 0);

  Worker worker(WorkerFlags({"--rank", "0", "--world", "1", "--coordinator", "127.0.0.1:" + std::to_string(port),
                             "--model", dir, "--device", "cpu", "--kv-memory", "64M", "--threads", "1",
                             "--data-host", "127.0.0.1"}));
  EXPECT_EQ(worker.Run(), 0);  // drained
  server->Shutdown();

  const Transcript& t = coordinator.transcript;
  ASSERT_EQ(t.failure, "");
  EXPECT_EQ(t.hello.rank(), 0);
  EXPECT_EQ(t.hello.world(), 1);
  EXPECT_EQ(t.hello.model_dir(), dir);
  EXPECT_EQ(t.ready.epoch(), 1);
  EXPECT_EQ(t.ready.error(), "");
  EXPECT_EQ(t.ready.vocab_size(), vocab);
  EXPECT_GT(t.ready.kv_pool_blocks(), 0);
  EXPECT_EQ(t.ready.kv_budget_bytes(), 64 << 20);
  ASSERT_EQ(t.results.size(), 3u);

  const StepResult& first = t.results[0];
  EXPECT_EQ(first.error(), "");
  EXPECT_EQ(first.step_id(), 1);
  ASSERT_EQ(first.seqs_size(), 1);
  EXPECT_EQ(first.seqs(0).seq_id(), 7u);
  EXPECT_EQ(first.seqs(0).token_id(), expected);
  EXPECT_GT(first.result_sent_unix_ns(), 0);
  EXPECT_GE(first.result_sent_unix_ns(), first.plan_received_unix_ns());

  const StepResult& refused = t.results[1];
  EXPECT_EQ(refused.step_id(), 2);
  EXPECT_EQ(refused.seqs_size(), 0);
  EXPECT_NE(refused.error().find("rank 0"), std::string::npos) << refused.error();
  EXPECT_NE(refused.error().find("unknown sequence 99"), std::string::npos) << refused.error();

  const StepResult& after = t.results[2];
  EXPECT_EQ(after.error(), "");
  ASSERT_EQ(after.seqs_size(), 1);
  state = reference->NewState();
  std::vector<int32_t> fed = prompt;
  fed.push_back(expected);
  logits = reference->Forward({{state.get(), fed, false}})[0].logits;
  row = logits.as<float>();
  EXPECT_EQ(after.seqs(0).token_id(), static_cast<int32_t>(std::max_element(row, row + vocab) - row));
}

TEST(Worker, RefusesARankOutsideTheWorld) {
  EXPECT_THROW(Worker(WorkerFlags({"--rank", "2", "--world", "2", "--coordinator", "127.0.0.1:1", "--model", "/nonexistent",
                                   "--kv-memory", "1M", "--data-host", "127.0.0.1"})),
               UsageError);
}

}  // namespace
}  // namespace dsmesh
