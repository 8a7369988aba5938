// CLI commands of the mesh:
//   dsmesh up [--model DIR] [--world N] [--port 8000] ...      local coordinator + N workers (+ gateway,
//                                                              with --served-model-name/--api-key[-file]; --max-queued
//                                                              goes to the coordinator, which holds admission),
//                                                              supervised: a child that fails is started again
//                                                              (cli/launcher/supervisor.h); the workers run on
//                                                              ChooseDevice's device (a CUDA GPU when one is
//                                                              visible: then one worker by default, else 2 on
//                                                              the CPU)
//   ConnectMesh: the mesh a command measures or runs on (`dsmesh bench --world N | --coordinator`, cli/bench/)
//   RunLogitsMesh / RunGenerateMesh: the `--world N` / `--coordinator HOST:PORT` variants of `dsmesh logits`
//   and `dsmesh generate` (cli/commands.cc picks them for those flags); same output as the in-process path.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli/launcher/local_mesh.h"
#include "cli/launcher/supervisor.h"
#include "cli/mesh_commands.h"
#include "cli/model_commands/model_commands.h"
#include "common/flags.h"
#include "common/mesh/mesh_client.h"
#include "common/mesh/mesh_credentials.h"
#include "common/repo_file.h"
#include "common/safetensors.h"
#include "kernels/cuda/device_choice.h"
#include "model/testing/synthetic_source.h"
#include "model/testing/tiny_model.h"

namespace dsmesh {
namespace {

bool IsFile(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string DataDir() {
  const char* xdg = std::getenv("XDG_DATA_HOME");
  if (xdg && *xdg) return std::string(xdg) + "/dsmesh";
  const char* home = std::getenv("HOME");
  if (!home || !*home) throw std::runtime_error("neither XDG_DATA_HOME nor HOME is set: give --model DIR");
  return std::string(home) + "/.local/share/dsmesh";
}

// True when `dir` holds a tiny model whose config is the one this build's make-tiny writes. A cache made by
// an older dsmesh (e.g. before the demo model shards at world 4) is then remade instead of served.
bool IsCurrentTinyModel(const std::string& dir) {
  if (!IsFile(dir + "/config.json") || !IsFile(dir + "/model.safetensors")) return false;
  std::ifstream in(dir + "/config.json");
  const nlohmann::json cached = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return cached == nlohmann::json(TinyModelConfig(TinyModelSpec{}));
}

}  // namespace

// The trained small model the repository ships (docs/trained-model.md), found from the working directory,
// the executable's runfiles or $DSMESH_ROOT; without it (a dsmesh outside its repository) make-tiny's
// random model, made once in the data directory.
std::string DefaultModel() {
  try {
    const std::string config = RepoFile(std::string(kTrainedModelDir) + "/config.json");
    const std::string dir = std::filesystem::absolute(std::filesystem::path(config).parent_path()).string();
    std::fprintf(stderr, "dsmesh up: serving the trained small model %s (no --model given)\n", dir.c_str());
    return dir;
  } catch (const std::runtime_error&) {
    // Not in a checkout: fall through to the random demo model.
  }
  const std::string dir = DataDir() + "/tiny-model";
  if (IsCurrentTinyModel(dir)) return dir;
  const bool stale = IsFile(dir + "/config.json");
  std::fprintf(stderr, "dsmesh up: making the tiny demo model in %s (%s)\n", dir.c_str(),
               stale ? "the cached one was made by another version of make-tiny" : "once");
  if (stale && std::system(("rm -rf '" + dir + "'").c_str()) != 0) throw std::runtime_error("cannot remove " + dir);
  const std::string tmp = dir + ".partial";
  if (std::system(("rm -rf '" + tmp + "' && mkdir -p '" + tmp + "'").c_str()) != 0)
    throw std::runtime_error("cannot create " + tmp);
  MakeTinyModel(tmp, /*seed=*/0, TinyModelSpec{});
  if (std::rename(tmp.c_str(), dir.c_str()) != 0) throw std::runtime_error("cannot move " + tmp + " to " + dir);
  return dir;
}

namespace {

// Sibling binaries of this dsmesh in bazel-bin: bazel-bin/cli/dsmesh -> bazel-bin/worker/dsmesh-worker ...
std::string Sibling(const std::string& package, const std::string& name) {
  return LocalMesh::SelfDir() + "/../" + package + "/" + name;
}

}  // namespace

const std::vector<std::string> kCoordinatorFlags = {"max-num-seqs", "max-num-batched-tokens", "max-batched-tokens", "max-model-len",
                                                    "enable-prefix-caching", "long-prefill-token-threshold", "max-decode-slowdown",
                                                    "scheduling-policy", "speculative-config", "draft-policy",
                                                    "max-queued",
                                                    "heartbeat-timeout-ms"};

LocalMeshOptions OptionsFromFlags(const Flags& f, const std::string& model, int world, const DeviceChoice& device) {
  LocalMeshOptions o;
  o.coordinator_bin = Sibling("coordinator", "dsmesh-coordinator");
  o.worker_bin = Sibling("worker", "dsmesh-worker");
  o.model_dir = model;
  o.world = world;
  o.device = device.device;
  // One worker alone on a GPU sizes its KV pool from --gpu-memory-utilization (vLLM's default, 0.9 of the
  // device) unless --kv-memory is given. Several workers sharing one device cannot each take a share of
  // what the device has free while the others are still loading, so they keep an explicit budget.
  const bool gpu = o.device.rfind("cuda", 0) == 0;
  o.kv_memory = f.Has("kv-memory") ? f.Get("kv-memory") : (gpu && world == 1 ? "" : "1G");
  if (f.Has("gpu-memory-utilization")) {
    if (!gpu)
      throw UsageError("--gpu-memory-utilization applies to --device cuda workers; these run on the CPU (" +
                       device.reason + ")");
    if (f.Has("kv-memory")) throw UsageError("give --kv-memory or --gpu-memory-utilization, not both");
    if (world > 1)
      throw UsageError("--gpu-memory-utilization sizes one worker per GPU; with --world > 1 on one GPU give --kv-memory");
    o.gpu_memory_utilization = f.Get("gpu-memory-utilization");
  }
  o.enforce_eager = f.Has("enforce-eager");
  o.kv_cache_dtype = f.Get("kv-cache-dtype", "auto");
  // Default: the machine's cores shared out among the workers.
  const long cores = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  o.threads_per_worker = static_cast<int>(f.GetInt("threads", std::max(1L, cores / world)));
  o.coordinator_port = static_cast<int>(f.GetInt("coordinator-port", 0));
  for (const auto& name : kCoordinatorFlags)
    if (f.Has(name)) o.coordinator_args.insert(o.coordinator_args.end(), {"--" + name, f.Get(name)});
  return o;
}

namespace {

// A new directory for the children's logs: $TMPDIR/dsmesh-up-XXXXXX.
std::string MakeLogDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/dsmesh-up-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("cannot create a log directory " + pattern);
  return pattern;
}

}  // namespace

int RunUp(const std::vector<std::string>& args) {
  std::set<std::string> known = {"model", "world", "port", "coordinator-port", "kv-memory", "threads", "device",
                                 "gpu-memory-utilization", "ready-timeout-s", "no-gateway", "served-model-name",
                                 "api-key", "api-key-file", "log-dir", "enforce-eager", "kv-cache-dtype"};
  known.insert(kCoordinatorFlags.begin(), kCoordinatorFlags.end());
  known = WithMeshCredentialFlags(known);
  Flags f(args, known, {"no-gateway", "enforce-eager"});
  // Ctrl-C / SIGTERM come to us (children run in their own process groups) and we stop them in order. Blocked
  // before any thread starts (the CUDA probe below starts the driver's): a thread with them unblocked could
  // take one with its default action, ending `up` at once and leaving its children to stop all together
  // (PR_SET_PDEATHSIG), the workers under the gateway's in-flight requests.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigprocmask(SIG_BLOCK, &set, nullptr);
  // One worker owns a GPU (its KV pool sized from the device); on the CPU two workers show the mesh at work.
  const DeviceChoice device = ChooseDevice(f);
  std::fprintf(stderr, "dsmesh up: %s\n", device.Line().c_str());
  const int world = static_cast<int>(f.GetInt("world", device.cuda() ? 1 : 2));
  if (world < 1) throw UsageError("--world must be >= 1");
  const std::string model = f.Has("model") ? f.Get("model") : DefaultModel();
  if (!IsFile(model + "/config.json")) throw std::runtime_error(model + "/config.json: not found (is --model a model directory?)");
  LocalMeshOptions o = OptionsFromFlags(f, model, world, device);
  o.gateway_port = static_cast<int>(f.GetInt("port", 8000));
  const std::string gateway = Sibling("gateway", "dsmesh-gateway");
  if (access(gateway.c_str(), X_OK) == 0 && !f.GetBool("no-gateway", false)) o.gateway_bin = gateway;
  // The gateway's own flags, passed through only when given (the gateway checks them: --api-key with
  // --api-key-file or an unreadable key file make it exit and `up` says so). --max-queued is the
  // coordinator's (kCoordinatorFlags): admission is held there, shared by every gateway.
  if (f.Has("api-key") && f.Has("api-key-file")) throw UsageError("give --api-key or --api-key-file, not both");
  const char* const gateway_flags[] = {"served-model-name", "api-key", "api-key-file"};
  bool any_gateway_flag = false;
  for (const char* name : gateway_flags) {
    if (!f.Has(name)) continue;
    any_gateway_flag = true;
    o.gateway_args.insert(o.gateway_args.end(), {std::string("--") + name, f.Get(name)});
  }
  if (any_gateway_flag && o.gateway_bin.empty())
    throw UsageError("--served-model-name, --api-key and --api-key-file are gateway flags; there is no "
                     "gateway here (--no-gateway, or no binary at " + gateway + ")");

  o.log_dir = f.Has("log-dir") ? f.Get("log-dir") : MakeLogDir();
  std::filesystem::create_directories(o.log_dir);
  // --mesh-token-file (or DSMESH_MESH_TOKEN_FILE) when given, else a fresh token in LOG_DIR/mesh-token.
  o.credentials = MeshCredentialsFromFlags(f);
  LocalMesh mesh(o);
  std::fprintf(stderr, "dsmesh up: model %s, %d worker(s) on %s; coordinator (gRPC Generate) on %s\n", model.c_str(),
               world, o.device.c_str(), mesh.coordinator_address().c_str());
  const std::string client_flags =
      (mesh.credentials().token_file.empty() ? "" : "--mesh-token-file " + mesh.credentials().token_file) +
      (mesh.credentials().tls() ? std::string(mesh.credentials().token_file.empty() ? "" : " and ") +
                                      "a certificate of the --tls-ca CA (--tls-cert/--tls-key/--tls-ca)"
                                : "");
  std::fprintf(stderr, "dsmesh up: logs in %s; gRPC clients of the coordinator need %s\n", o.log_dir.c_str(),
               client_flags.c_str());
  SupervisorOptions so;
  so.ready_timeout = std::chrono::seconds(f.GetInt("ready-timeout-s", 300));
  if (o.gateway_bin.empty()) {
    so.ready_message = [&mesh, gateway] {
      return "dsmesh up: ready. No gateway binary at " + gateway + " (not built), so no HTTP API; clients can use "
             "the gRPC Generate service at " + mesh.coordinator_address() + ". Ctrl-C stops everything.";
    };
  } else {
    so.ready_message = [&mesh, port = o.gateway_port] {
      return "dsmesh up: ready. OpenAI API at http://127.0.0.1:" + std::to_string(port) + "/v1 (gateway), coordinator at " +
             mesh.coordinator_address() + ". Ctrl-C stops everything.";
    };
  }
  Supervisor supervisor(&mesh, so);
  return supervisor.Run(set);
}

MeshTarget ConnectMesh(const Flags& f, const std::function<void(LocalMeshOptions&)>& adjust) {
  MeshTarget t;
  if (f.Has("coordinator") == f.Has("world")) throw UsageError("give exactly one of --coordinator HOST:PORT or --world N");
  if (f.Has("world")) {
    const int world = static_cast<int>(f.GetInt("world", 1));
    if (world < 1) throw UsageError("--world must be >= 1");
    const std::string model = f.Require("model");
    // A synthetic source (model/testing/synthetic.h) has no directory: the workers build its weights.
    if (!IsSyntheticSource(model) && !IsFile(model + "/config.json"))
      throw std::runtime_error(model + "/config.json: not found");
    const DeviceChoice device = ChooseDevice(f);
    std::fprintf(stderr, "mesh: %s\n", device.Line().c_str());
    LocalMeshOptions o = OptionsFromFlags(f, model, world, device);
    if (adjust) adjust(o);
    t.local = std::make_unique<LocalMesh>(o);
    t.local->Start();
    t.client = std::make_unique<MeshClient>(t.local->coordinator_address(), t.local->credentials());
  } else {
    t.client = std::make_unique<MeshClient>(f.Get("coordinator"), MeshCredentialsFromFlags(f));
  }
  std::function<std::string()> gone;
  if (t.local)  // a child that exits before the mesh is ready (bad model, no GPU) ends the wait with its name
    gone = [&t] {
      int status = 0;
      const std::string name = t.local->PollExited(&status);
      if (name.empty()) return std::string();
      const std::string log = t.local->log_path(name);
      return name + " exited with status " + std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) +
             (log.empty() ? std::string(" (its error is above)") : "; its log: " + log);
    };
  t.client->WaitReady(std::chrono::seconds(f.GetInt("ready-timeout-s", 300)), gone);
  return t;
}

const std::set<std::string> kMeshFlags = WithMeshCredentialFlags({"model", "tokens", "threads", "device", "world",
                                                                   "coordinator", "kv-memory", "coordinator-port",
                                                                   "gpu-memory-utilization", "ready-timeout-s",
                                                                   "enforce-eager"});

int RunLogitsMesh(const std::vector<std::string>& args) {
  auto known = kMeshFlags;
  known.insert("out");
  Flags f(args, known, {"enforce-eager"});
  const std::vector<int32_t> tokens = ParseIntList("tokens", f.Require("tokens"), "integer token id");
  const std::string out_path = f.Require("out");
  MeshTarget t = ConnectMesh(f);
  GenerateRequest req;
  req.set_request_id("cli-logits");
  for (int32_t tok : tokens) req.add_prompt_token_ids(tok);
  req.mutable_sampling()->set_temperature(0);
  req.mutable_sampling()->set_max_tokens(1);
  req.mutable_sampling()->set_ignore_eos(true);
  req.set_return_logits(true);
  GenerateResult r = t.client->Generate(req);
  if (!r.error.empty()) throw std::runtime_error("the mesh failed the request: " + r.error);
  if (r.logits.size() != tokens.size())
    throw std::runtime_error("the mesh returned " + std::to_string(r.logits.size()) + " logits rows for " +
                             std::to_string(tokens.size()) + " tokens");
  const int64_t vocab = r.logits[0].values_size();
  std::vector<float> data;
  data.reserve(tokens.size() * vocab);
  for (const auto& row : r.logits) data.insert(data.end(), row.values().begin(), row.values().end());
  SafetensorsWriter w;
  w.Add("logits", DType::kF32, {static_cast<int64_t>(tokens.size()), vocab}, data.data(), data.size() * sizeof(float));
  w.Write(out_path);
  return 0;
}

int RunGenerateMesh(const std::vector<std::string>& args) {
  auto known = kMeshFlags;
  known.insert({"max-new-tokens", "ignore-eos"});
  Flags f(args, known, {"ignore-eos", "enforce-eager"});
  const std::vector<int32_t> prompt = ParseIntList("tokens", f.Require("tokens"), "integer token id");
  const long long max_new = f.GetInt("max-new-tokens", 16);
  if (max_new < 0) throw UsageError("--max-new-tokens must be >= 0");
  std::vector<int32_t> generated;
  if (max_new > 0) {
    MeshTarget t = ConnectMesh(f);
    GenerateRequest req;
    req.set_request_id("cli-generate");
    for (int32_t tok : prompt) req.add_prompt_token_ids(tok);
    req.mutable_sampling()->set_temperature(0);
    req.mutable_sampling()->set_max_tokens(static_cast<int32_t>(max_new));
    req.mutable_sampling()->set_ignore_eos(f.GetBool("ignore-eos", false));
    GenerateResult r = t.client->Generate(req);
    if (!r.error.empty()) throw std::runtime_error("the mesh failed the request: " + r.error);
    generated = r.tokens;
    if (generated.size() > 1) {
      const double decode_s = r.token_times.back() - r.token_times.front();
      std::fprintf(stderr, "mesh: first token after %.1f ms; decode %zu tokens: %.1f ms (%.1f tokens/s)\n",
                   r.token_times.front() * 1e3, generated.size() - 1, decode_s * 1e3,
                   (generated.size() - 1) / std::max(decode_s, 1e-9));
    }
  }
  std::string json = "{\"tokens\": [";
  for (size_t i = 0; i < generated.size(); ++i) json += (i ? ", " : "") + std::to_string(generated[i]);
  std::cout << json << "]}" << std::endl;
  return 0;
}

}  // namespace dsmesh
