// dsmesh-coordinator: waits for the workers, forms the mesh, runs the scheduler and serves Generate.
//
//   dsmesh-coordinator [--listen 127.0.0.1:7000] --world N --model DIR [--max-num-seqs 4]
//                      [--max-num-batched-tokens 512] [--max-model-len L] [--block-size 16]
//                      [--long-prefill-token-threshold 128] [--max-decode-slowdown R (0: off)]
//                      [--scheduling-policy fcfs|priority]
//                      [--enable-prefix-caching true|false] [--register-timeout-s 120]
//                      [--heartbeat-timeout-ms 1500] [--drain-timeout-s 30] [--max-queued 256]
//                      [--speculative-config '{"method":"mtp","num_speculative_tokens":3[,"draft_vocab_size":N]}']
//                      [--draft-policy adaptive|fixed]   (coordinator/draft_policy.h; fixed: always all drafts)
//                      [--mesh-token-file F] [--tls-cert F --tls-key F --tls-ca F]
//                      [--bench-draft-acceptance 0.85,0.70,0.55]   (bench only, see below)
// --bench-draft-acceptance is `dsmesh bench --draft-acceptance`'s (coordinator/simulated_acceptance.h):
// drafts pass by a seeded generator at those per-position rates instead of by verification. Only the
// bench passes it (`dsmesh up` has no such flag), and only with workers started with
// --bench-simulated-acceptance, which refuse such plans otherwise.
// KV blocks and state slots are those of the workers' state pools (WorkerReady: blocks of 256 tokens for
// V4); --block-size applies only to workers that report a budget without a pool.
// Every call must carry the mesh token when one is set (UNAUTHENTICATED otherwise); listening beyond
// loopback requires a token or TLS, so an open port never serves prompts to anyone who reaches it.
// Admission is decided here, so every gateway of the mesh shares one limit: a Generate arriving while
// max-num-seqs + max-queued requests are running or waiting gets RESOURCE_EXHAUSTED (the gateway's 429).
// SIGTERM/SIGINT drain: stop admitting, finish running requests (up to the drain timeout), exit 0.
//
// Under systemd (Type=notify, deploy/systemd/dsmesh-coordinator.service): READY=1 once the mesh has
// formed for the first time (every rank loaded its shard and joined; the scheduler exists), not when
// the process starts; STATUS= on every state change (waiting for ranks, forming, serving, mesh lost,
// draining); STOPPING=1 when a drain starts. WATCHDOG=1 is sent only while Engine::Health() passes:
// the engine thread makes progress, or it is blocked on the workers while the heartbeat monitor
// (which breaks such a wait when a rank stops answering) still runs. Waiting for lost workers to come
// back counts as healthy: restarting the coordinator would not bring them back sooner, and the
// workers' own units restart them.
#include <algorithm>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <limits>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

#include "common/flags.h"
#include "common/mesh/mesh_credentials.h"
#include "common/mesh/mesh_token_check.h"
#include "common/model_card.h"
#include "common/program.h"
#include "common/systemd_notify.h"
#include "coordinator/engine.h"
#include "coordinator/services.h"
#include "coordinator/speculative_config.h"
#include "model/testing/synthetic_source.h"
#include "model/v4_flash_config.h"

namespace dsmesh {
namespace {

// --model DIR reads DIR/config.json; a synthetic source (model/testing/synthetic_source.h: weights made by
// the workers from a seed) has DeepSeek-V4-Flash's config or its base directory's.
ModelCard ReadModelCard(const std::string& source) {
  if (!IsSyntheticSource(source)) return ModelCard::FromDirectory(source);
  const SyntheticSpec spec = ParseSyntheticSource(source);
  if (spec.base == "v4-flash") return ModelCard::FromJson(kV4FlashConfigJson, source);
  return ModelCard::FromDirectory(spec.base);
}

constexpr char kDefaultListen[] = "127.0.0.1:7000";

// True for an address only this machine can reach (127.x.x.x, [::1], localhost, unix sockets).
bool IsLoopback(const std::string& listen) {
  if (listen.rfind("unix:", 0) == 0) return true;
  const auto colon = listen.rfind(':');
  const std::string host = colon == std::string::npos ? listen : listen.substr(0, colon);
  return host.rfind("127.", 0) == 0 || host == "localhost" || host == "[::1]" || host == "ipv6:[::1]";
}


int Main(const std::vector<std::string>& args) {
  Flags f(args, WithMeshCredentialFlags({"listen", "world", "model", "max-num-seqs", "max-num-batched-tokens", "max-batched-tokens",
                                         "max-model-len", "block-size", "enable-prefix-caching", "register-timeout-s",
                                         "ready-timeout-s", "heartbeat-timeout-ms", "step-timeout-s", "drain-timeout-s",
                                         "long-prefill-token-threshold", "max-decode-slowdown", "scheduling-policy", "speculative-config",
                                         "max-queued", "bench-draft-acceptance", "draft-policy"}));
  const std::string listen = f.Get("listen", kDefaultListen);
  const MeshCredentials credentials = MeshCredentialsFromFlags(f);
  if (!IsLoopback(listen) && credentials.token.empty() && !credentials.tls())
    throw UsageError("--listen " + listen + " reaches beyond this machine: give --mesh-token-file (or --tls-cert/--tls-key/"
                     "--tls-ca) so that only the mesh's own processes are served");
  const int world = static_cast<int>(f.GetInt("world", 0));
  if (world < 1) throw UsageError("--world must be >= 1");
  const ModelCard card = ReadModelCard(f.Require("model"));

  EngineConfig ec;
  ec.scheduler.max_num_seqs = static_cast<int>(f.GetInt("max-num-seqs", 4));
  // vLLM's name; --max-batched-tokens is this project's older spelling of the same budget.
  if (f.Has("max-num-batched-tokens") && f.Has("max-batched-tokens") &&
      f.Get("max-num-batched-tokens") != f.Get("max-batched-tokens"))
    throw UsageError("--max-num-batched-tokens and --max-batched-tokens (its older name) disagree: give one");
  ec.scheduler.max_batched_tokens = static_cast<int>(
      f.GetInt(f.Has("max-num-batched-tokens") ? "max-num-batched-tokens" : "max-batched-tokens", 512));
  const int64_t default_len = card.max_position_embeddings.value_or(4096);
  ec.scheduler.max_model_len = static_cast<int>(f.GetInt("max-model-len", default_len));
  ec.scheduler.prefix_caching = f.GetBool("enable-prefix-caching", true);
  const long long threshold = f.GetInt("long-prefill-token-threshold", kDefaultLongPrefillTokenThreshold);
  if (threshold < 0 || threshold > std::numeric_limits<int>::max())
    throw UsageError("--long-prefill-token-threshold must be >= 0 (0: no per-request cap, vLLM's default order)");
  ec.scheduler.long_prefill_token_threshold = static_cast<int>(threshold);
  if (f.Has("max-decode-slowdown")) {
    const double slowdown = f.GetDouble("max-decode-slowdown", 0);
    if (!(slowdown == 0 || (slowdown > 1 && slowdown <= 1000)))
      throw UsageError("--max-decode-slowdown must be 0 (off) or a ratio above 1 (a step that prefills beside "
                       "decoding sequences takes at most that many times a decode-only step)");
    if (slowdown > 0 && threshold == 0)
      throw UsageError("--max-decode-slowdown needs the fair order (--long-prefill-token-threshold > 0)");
    ec.scheduler.max_decode_slowdown = slowdown;
  }
  try {
    ec.scheduler.policy = ParseSchedulingPolicy(f.Get("scheduling-policy", "fcfs"));
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--scheduling-policy: ") + e.what());
  }
  ec.scheduler.vocab_size = card.Required(card.vocab_size, "vocab_size");
  ec.scheduler.eos_token_id = card.eos_token_id ? static_cast<int32_t>(*card.eos_token_id) : -1;
  ec.block_size = static_cast<int>(f.GetInt("block-size", 16));
  const std::string spec = f.Get("speculative-config", "");
  const SpeculativeConfig speculative =
      spec.empty() ? SpeculativeConfig{0, 0} : ParseSpeculativeConfig(spec, ec.scheduler.vocab_size);
  ec.scheduler.num_speculative_tokens = speculative.num_speculative_tokens;
  const std::string draft_policy = f.Get("draft-policy", "adaptive");
  if (draft_policy != "adaptive" && draft_policy != "fixed")
    throw UsageError("--draft-policy must be adaptive (fewer drafts where they do not pay) or fixed (always "
                     "num_speculative_tokens), got '" + draft_policy + "'");
  ec.scheduler.draft_policy.adaptive = draft_policy == "adaptive";
  if (f.Has("bench-draft-acceptance")) {
    if (ec.scheduler.num_speculative_tokens == 0)
      throw UsageError("--bench-draft-acceptance needs --speculative-config (drafts to accept)");
    try {
      ec.scheduler.simulated_acceptance = ParseDraftAcceptance(f.Get("bench-draft-acceptance"),
                                                               ec.scheduler.num_speculative_tokens,
                                                               "--bench-draft-acceptance");
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
    std::fprintf(stderr, "[coordinator] bench mode: simulated draft acceptance %s (drafts pass by a seeded "
                 "generator, not by verification; not for serving)\n", f.Get("bench-draft-acceptance").c_str());
  }
  if (ec.scheduler.max_num_seqs < 1 || ec.scheduler.max_batched_tokens < 1 || ec.scheduler.max_model_len < 2 ||
      ec.block_size < 1)
    throw UsageError("--max-num-seqs, --max-num-batched-tokens, --block-size must be >= 1 and --max-model-len >= 2");
  ec.register_timeout = std::chrono::seconds(f.GetInt("register-timeout-s", 120));
  ec.ready_timeout = std::chrono::seconds(f.GetInt("ready-timeout-s", 600));
  ec.step_timeout = std::chrono::seconds(f.GetInt("step-timeout-s", 600));
  ec.drain_timeout = std::chrono::seconds(f.GetInt("drain-timeout-s", 30));
  const long long max_queued = f.GetInt("max-queued", 256);
  if (max_queued < 0 || max_queued > std::numeric_limits<int>::max()) throw UsageError("--max-queued must be >= 0");
  ec.max_queued = static_cast<int>(max_queued);
  bool notified_ready = false;  // engine thread only
  ec.on_state = [&notified_ready](bool ready, const std::string& status) {
    if (ready && !notified_ready) {
      notified_ready = true;
      NotifyReady(status);
    } else {
      NotifyStatus(status);
    }
  };

  RendezvousStore store;
  WorkerMesh mesh(world, &store, std::chrono::milliseconds(f.GetInt("heartbeat-timeout-ms", 1500)));
  mesh.set_num_speculative_tokens(ec.scheduler.num_speculative_tokens);
  mesh.set_draft_vocab_size(speculative.draft_vocab_size);
  // Every running sequence and every prefix snapshot holds a state slot in the workers' pools.
  mesh.set_state_slots(StateSlotsFor(ec.scheduler.max_num_seqs));
  Engine engine(ec, &mesh);
  MeshTokenCheck auth(credentials.token);
  GenerateService generate(&engine, &auth);
  WorkerControlService control(&mesh, &store, &auth);

  grpc::ServerBuilder builder;
  int port = 0;
  // gRPC would share the port with another process that listens on it too (SO_REUSEPORT), and the two
  // coordinators would then take each other's calls; a port in use is an error instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(listen, MeshServerCredentials(credentials), &port);
  builder.SetMaxReceiveMessageSize(-1);
  builder.SetMaxSendMessageSize(-1);
  builder.RegisterService(&generate);
  builder.RegisterService(&control);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) throw std::runtime_error("cannot listen on " + listen);
  std::fprintf(stderr, "[coordinator] listening on %s (port %d, %s, %s); waiting for %d worker(s); max-num-seqs %d, "
               "max-num-batched-tokens %d, max-model-len %d, prefix caching %s, scheduling policy %s, "
               "long-prefill-token-threshold %d, max-decode-slowdown %g, speculative tokens %d (mtp, %s drafts, draft vocabulary %s), max queued %d\n",
               listen.c_str(), port, credentials.token.empty() ? "no mesh token" : "mesh token required",
               credentials.tls() ? "TLS with client certificates" : "plaintext", world, ec.scheduler.max_num_seqs, ec.scheduler.max_batched_tokens,
               ec.scheduler.max_model_len, ec.scheduler.prefix_caching ? "on" : "off",
               SchedulingPolicyName(ec.scheduler.policy), ec.scheduler.long_prefill_token_threshold,
               ec.scheduler.max_decode_slowdown,
               ec.scheduler.num_speculative_tokens, ec.scheduler.draft_policy.adaptive ? "adaptive" : "fixed",
               speculative.draft_vocab_size > 0 ? ("ids < " + std::to_string(speculative.draft_vocab_size)).c_str()
                                                : "whole",
               ec.max_queued);

  std::thread signals([&] {
    const int sig = WaitShutdownSignal();
    if (sig != SIGUSR1) {
      std::fprintf(stderr, "[coordinator] signal %d: draining\n", sig);
      NotifyStopping("signal " + std::to_string(sig) + " received: draining");
      engine.BeginDrain();
    }
  });
  // The watchdog pinger: at half of WatchdogSec, one WATCHDOG=1 per passing health check.
  std::atomic<bool> stop_watchdog{false};
  std::thread watchdog;
  if (auto interval = SystemdWatchdogInterval()) {
    const auto period = *interval / 2;
    watchdog = std::thread([&engine, &stop_watchdog, period] {
      std::string last_problem;
      while (!stop_watchdog) {
        const std::string problem = engine.Health(period);
        if (problem.empty()) {
          NotifyWatchdog();
        } else if (problem != last_problem) {
          std::fprintf(stderr, "[coordinator] unhealthy, not pinging the systemd watchdog: %s\n", problem.c_str());
          NotifyStatus("unhealthy: " + problem);
        }
        last_problem = problem;
        for (auto slept = std::chrono::microseconds(0); slept < period && !stop_watchdog;
             slept += std::chrono::milliseconds(50))
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    });
  }
  const int rc = engine.Run();
  stop_watchdog = true;
  if (watchdog.joinable()) watchdog.join();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  pthread_kill(signals.native_handle(), SIGUSR1);
  signals.join();
  return rc;
}

}  // namespace
}  // namespace dsmesh

int main(int argc, char** argv) {
  dsmesh::BlockShutdownSignals();
  return dsmesh::RunProgram("dsmesh-coordinator",
                            "dsmesh-coordinator [--listen 127.0.0.1:7000] --world N --model DIR [--max-num-seqs 4] "
                            "[--max-num-batched-tokens 512] [--max-model-len L] [--long-prefill-token-threshold 128] "
                            "[--scheduling-policy fcfs|priority] [--max-queued 256] [--mesh-token-file F] [--tls-cert F --tls-key F --tls-ca F]",
                            [&] { return dsmesh::Main(std::vector<std::string>(argv + 1, argv + argc)); });
}
