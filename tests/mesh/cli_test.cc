// The CLI on a mesh: `dsmesh logits/generate --world N` print what the single-process path prints,
// `dsmesh up` starts a mesh, answers, and stops every child on SIGINT (no orphans; no thread of `up` could take
// the signal with its default action); without a visible GPU both choose the CPU and say why (`up` then starts
// its default 2 workers); and
// `dsmesh bench --scenario long-prompt-plus-chat` prints the fair and the off column side by side.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/safetensors.h"
#include "tests/mesh/mesh_fixture.h"

namespace dsmesh::mesh_test {
namespace {

std::string Dsmesh() { return Runfile("cli/dsmesh"); }

// The threads of process `pid`, its main thread left out, that do not block SIGINT and SIGTERM: one of them
// could take such a signal with its default action and end the process without its orderly stop. (The main
// thread is left out because while it waits in sigtimedwait the kernel shows those two unblocked.)
std::vector<std::string> ThreadsTakingStopSignals(pid_t pid) {
  const uint64_t bits = (1ull << (SIGINT - 1)) | (1ull << (SIGTERM - 1));
  std::vector<std::string> open;
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  for (const auto& task : std::filesystem::directory_iterator(dir)) {
    if (task.path().filename() == std::to_string(pid)) continue;
    std::ifstream f(task.path() / "status");
    std::string line, name;
    while (std::getline(f, line)) {
      if (line.rfind("Name:", 0) == 0) name = line.substr(5);
      if (line.rfind("SigBlk:", 0) == 0 && (std::stoull(line.substr(7), nullptr, 16) & bits) != bits)
        open.push_back(name + " (tid " + task.path().filename().string() + ")");
    }
  }
  return open;
}

std::vector<float> ReadLogits(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string bytes = ss.str();
  // safetensors: u64 header length, JSON header, data (a single f32 tensor here)
  if (bytes.size() < 8) ADD_FAILURE() << path << " is too short";
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  std::vector<float> v((bytes.size() - 8 - n) / 4);
  std::memcpy(v.data(), bytes.data() + 8 + n, v.size() * 4);
  return v;
}

TEST(MeshCli, LogitsAndGenerateOnAMeshMatchTheSingleProcessPath) {
  const std::string dir = TempDir("cli");
  const std::string model = TinyModelDir();
  int rc = 0;
  const std::string tokens = "5,17,9,300,41,7,7,99,12";
  Capture(Dsmesh() + " logits --model " + model + " --tokens " + tokens + " --out " + dir + "/single.safetensors", &rc);
  ASSERT_EQ(rc, 0);
  Capture(Dsmesh() + " logits --model " + model + " --world 2 --kv-memory 64M --tokens " + tokens + " --out " + dir +
              "/mesh.safetensors 2>/dev/null",
          &rc);
  ASSERT_EQ(rc, 0);
  auto a = ReadLogits(dir + "/single.safetensors"), b = ReadLogits(dir + "/mesh.safetensors");
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.size(), 9u * 512u);
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(double(a[i]) - b[i]));
    den = std::max(den, std::abs(double(a[i])));
  }
  EXPECT_LE(num / den, 1e-5);

  const std::string single = Capture(Dsmesh() + " generate --model " + model + " --tokens " + tokens +
                                         " --max-new-tokens 6 --ignore-eos 2>/dev/null", &rc);
  ASSERT_EQ(rc, 0);
  // No device flag and no GPU visible: the workers run on the CPU, and the command says so and why.
  const std::string err = dir + "/generate_mesh.err";
  const std::string mesh = Capture("CUDA_VISIBLE_DEVICES= " + Dsmesh() + " generate --model " + model +
                                       " --world 2 --kv-memory 64M --tokens " + tokens +
                                       " --max-new-tokens 6 --ignore-eos 2>" + err, &rc);
  ASSERT_EQ(rc, 0);
  EXPECT_EQ(mesh, single);
  EXPECT_NE(single.find("{\"tokens\": ["), std::string::npos) << single;
  std::ifstream err_file(err);
  std::stringstream err_text;
  err_text << err_file.rdbuf();
  EXPECT_NE(err_text.str().find("mesh: device: cpu (no CUDA GPU is visible"), std::string::npos) << err_text.str();
}

// A synthetic model (weights built by each worker from a seed, model/testing/synthetic.h) on a mesh of two worker
// processes: `generate` equals the single-process path on the same source, and `bench --world 2` runs on
// it (the coordinator takes the model's facts from the source, not from a directory).
TEST(MeshCli, SyntheticModelOnAMeshOfTwoWorkers) {
  const std::string source = "synthetic:" + TinyModelDir() + ":seed=7";
  int rc = 0;
  const std::string tokens = "5,17,9,300,41,7";
  const std::string single = Capture(Dsmesh() + " generate --model " + source + " --tokens " + tokens +
                                         " --max-new-tokens 5 --ignore-eos 2>/dev/null", &rc);
  ASSERT_EQ(rc, 0);
  const std::string mesh = Capture(Dsmesh() + " generate --model " + source + " --world 2 --kv-memory 64M --tokens " +
                                       tokens + " --max-new-tokens 5 --ignore-eos 2>/dev/null", &rc);
  ASSERT_EQ(rc, 0);
  EXPECT_EQ(mesh, single);
  const std::string out = Capture(Dsmesh() + " bench --world 2 --kv-memory 64M --model " + source +
                                      " --streams 1,2 --prompt-tokens 24 --max-tokens 4 2>/dev/null", &rc);
  std::printf("%s", out.c_str());
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("streams 2: 8 tokens"), std::string::npos) << out;
  EXPECT_NE(out.find("world 2"), std::string::npos) << out;
  Capture(Dsmesh() + " bench --world 2 --model synthetic:/no/such/dir --max-tokens 1 2>&1", &rc);
  EXPECT_NE(rc, 0);
}

// The KV budget flags of a local mesh: --gpu-memory-utilization only where one worker owns its GPU, and
// never together with --kv-memory; each mistake is a usage message that names the flag, before any child
// starts.
TEST(MeshCli, UpRejectsKvBudgetFlagsThatCannotApply) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--gpu-memory-utilization 0.5", "applies to --device cuda workers; these run on the CPU (no CUDA GPU is visible"},
      {"--device cuda --world 1 --kv-memory 1G --gpu-memory-utilization 0.5", "not both"},
      {"--device cuda --world 2 --gpu-memory-utilization 0.5", "with --world > 1 on one GPU give --kv-memory"}};
  for (const auto& [flags, message] : cases) {
    int rc = 0;
    const std::string out =
        Capture("CUDA_VISIBLE_DEVICES= " + Dsmesh() + " up --model " + TinyModelDir() + " " + flags + " 2>&1", &rc);
    EXPECT_NE(rc, 0) << flags;
    EXPECT_NE(out.find(message), std::string::npos) << flags << ": " << out;
  }
}

// vLLM's --max-num-batched-tokens and the older --max-batched-tokens name one budget: the coordinator takes
// either (its start line shows the value) and refuses the two when they disagree.
TEST(MeshCli, CoordinatorTakesVllmsBatchedTokensFlag) {
  const std::string coordinator = Runfile("coordinator/dsmesh-coordinator");
  int rc = 0;
  std::string out = Capture(coordinator + " --world 1 --model " + TinyModelDir() +
                                " --max-num-batched-tokens 32 --max-batched-tokens 64 2>&1", &rc);
  EXPECT_EQ(WEXITSTATUS(rc), 2) << out;  // a usage error
  EXPECT_NE(out.find("--max-num-batched-tokens and --max-batched-tokens (its older name) disagree"), std::string::npos) << out;
  out = Capture(coordinator + " --world 1 --model " + TinyModelDir() + " --max-num-batched-tokens 0 2>&1", &rc);
  EXPECT_EQ(WEXITSTATUS(rc), 2) << out;  // a usage error
  EXPECT_NE(out.find("--max-num-batched-tokens"), std::string::npos) << out;
}

// A coordinator never shares its port: a second one on the same address fails to listen (gRPC's default
// SO_REUSEPORT would let both listen and split the calls between two meshes).
TEST(MeshCli, ASecondCoordinatorOnTheSamePortFails) {
  const std::string coordinator = Runfile("coordinator/dsmesh-coordinator");
  const std::string dir = TempDir("port");
  const std::string listen = "127.0.0.1:" + std::to_string(LocalMesh::FreePort());
  pid_t first = fork();
  if (first == 0) {
    if (!freopen((dir + "/first.log").c_str(), "w", stderr)) _exit(126);
    execl(coordinator.c_str(), coordinator.c_str(), "--listen", listen.c_str(), "--world", "1", "--model",
          TinyModelDir().c_str(), (char*)nullptr);
    _exit(127);
  }
  std::string log;
  for (int i = 0; i < 400 && log.find("listening on") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
    std::ifstream in(dir + "/first.log");
    log.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  ASSERT_NE(log.find("listening on"), std::string::npos) << log;
  int rc = 0;
  const std::string out = Capture(coordinator + " --listen " + listen + " --world 1 --model " + TinyModelDir() + " 2>&1", &rc);
  kill(first, SIGKILL);
  waitpid(first, nullptr, 0);
  EXPECT_NE(WEXITSTATUS(rc), 0) << out;
  EXPECT_NE(out.find("cannot listen on " + listen), std::string::npos) << out;
}

TEST(MeshCli, BenchLongPromptPlusChatPrintsFairAndOffSideBySide) {
  const std::string json_path = TempDir("scenario") + "/scenario.json";
  int rc = 0;
  const std::string out = Capture(Dsmesh() + " bench --scenario long-prompt-plus-chat --world 1 --model " +
                                      TinyModelDir() + " --kv-memory 64M --long-prompt-tokens 4000 --chat-every-s 0.1"
                                      " --chat-max-tokens 2 --max-batched-tokens 32 --long-prefill-token-threshold 8"
                                      " --max-decode-slowdown 2 --json " + json_path + " 2>/dev/null",
                                  &rc);
  std::printf("%s", out.c_str());
  ASSERT_EQ(rc, 0) << out;
  // The columns in order: fair, fair with the slowdown cap, off.
  const size_t fair = out.find("fair (threshold 8)"), capped = out.find("slowdown 2 (threshold 8)"),
               off = out.find("off (threshold 0)");
  ASSERT_NE(fair, std::string::npos) << out;
  ASSERT_NE(capped, std::string::npos) << out;
  ASSERT_NE(off, std::string::npos) << out;
  EXPECT_LT(fair, capped);
  EXPECT_LT(capped, off);
  for (const char* row : {"chat TTFT p50 / p99, steps", "chat TTFT p50 / p99, s", "long prefill alone, tok/s",
                          "long prefill with chats, tok/s", "stream alone, ms/token p50 / p90",
                          "stream beside the prefill, ms/token p50 / p90", "stream slowdown p50 / p90 (beside / alone)",
                          "long prompt TTFT beside the stream, s"})
    EXPECT_NE(out.find(row), std::string::npos) << row << "\n" << out;

  std::ifstream json_file(json_path);
  ASSERT_TRUE(json_file) << json_path;
  const nlohmann::json j = nlohmann::json::parse(json_file);
  EXPECT_EQ(j.at("long_prompt_tokens"), 4000);
  ASSERT_EQ(j.at("columns").size(), 3u) << j.dump(2);
  const std::vector<double> slowdowns = {0, 2, 0};
  const std::vector<int> thresholds = {8, 8, 0};
  for (size_t i = 0; i < 3; ++i) {
    const nlohmann::json& c = j.at("columns")[i];
    SCOPED_TRACE(c.at("label").get<std::string>());
    EXPECT_EQ(c.at("max_decode_slowdown").get<double>(), slowdowns[i]);
    EXPECT_EQ(c.at("long_prefill_token_threshold").get<int>(), thresholds[i]);
    EXPECT_GT(c.at("long_prefill_alone_tok_s").get<double>(), 0);
    EXPECT_GT(c.at("chats").get<int>(), 0);
    const nlohmann::json& s = c.at("decode_stream");
    EXPECT_EQ(s.at("tokens_alone").get<int>(), 32);
    EXPECT_GT(s.at("tokens_beside").get<int>(), 0);
    EXPECT_FALSE(s.at("ended_early").get<bool>());
    EXPECT_GT(s.at("alone_s_per_token_p50").get<double>(), 0);
    EXPECT_LE(s.at("alone_s_per_token_p50").get<double>(), s.at("alone_s_per_token_p90").get<double>());
    EXPECT_LE(s.at("beside_s_per_token_p50").get<double>(), s.at("beside_s_per_token_p90").get<double>());
    EXPECT_NEAR(s.at("slowdown_p50").get<double>(),
                s.at("beside_s_per_token_p50").get<double>() / s.at("alone_s_per_token_p50").get<double>(), 1e-9);
    EXPECT_GT(s.at("slowdown_p50").get<double>(), 0);
    EXPECT_GT(s.at("slowdown_p90").get<double>(), 0);
    EXPECT_GT(s.at("long_prompt_ttft_s").get<double>(), 0);
    if (slowdowns[i] == 0) {
      EXPECT_EQ(s.at("prefill_caps").get<int>(), 0);
    }
  }
  // A cap of 1 or less would be the fair column again (the coordinator reads 0 as off).
  Capture(Dsmesh() + " bench --scenario long-prompt-plus-chat --world 1 --max-decode-slowdown 1 --model " +
              TinyModelDir() + " 2>&1",
          &rc);
  EXPECT_NE(rc, 0);
  Capture(Dsmesh() + " bench --scenario no-such-scenario --world 1 --model " + TinyModelDir() + " 2>&1", &rc);
  EXPECT_NE(rc, 0);
}

TEST(MeshCli, UpServesAndStopsEveryChildOnSigint) {
  const std::string dir = TempDir("up");
  const std::string log = dir + "/up.log", log_dir = dir + "/logs";
  const int port = LocalMesh::FreePort();
  pid_t pid = fork();
  if (pid == 0) {
    if (!freopen(log.c_str(), "w", stderr)) _exit(126);
    // No GPU visible, no --device and no --world: the CPU and its default of 2 workers.
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    const std::string bin = Dsmesh(), model = TinyModelDir(), p = std::to_string(port);
    execl(bin.c_str(), bin.c_str(), "up", "--model", model.c_str(), "--coordinator-port", p.c_str(),
          "--kv-memory", "64M", "--no-gateway", "--log-dir", log_dir.c_str(), (char*)nullptr);
    _exit(127);
  }
  // `up` made a private token for its mesh in its log directory; a client without it is refused.
  const std::string token_file = log_dir + "/mesh-token";
  for (int i = 0; i < 600 && access(token_file.c_str(), R_OK) != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  struct stat token_stat {};
  ASSERT_EQ(stat(token_file.c_str(), &token_stat), 0) << token_file;
  EXPECT_EQ(token_stat.st_mode & 0777, 0600);
  MeshCredentials credentials;
  credentials.token = ReadMeshTokenFile(token_file);
  MeshClient client("127.0.0.1:" + std::to_string(port), credentials);
  client.WaitReady(std::chrono::seconds(60));
  MeshClient stranger("127.0.0.1:" + std::to_string(port), MeshCredentials{});
  std::string refusal;
  EXPECT_FALSE(stranger.TryStats(std::chrono::seconds(5), &refusal));
  EXPECT_NE(refusal.find("no mesh token"), std::string::npos) << refusal;
  Reference reference;
  const auto prompt = Tokens(12, 77);
  EXPECT_EQ(client.Generate(Greedy(prompt, 4)).tokens, reference.Greedy(prompt, 4));
  // SIGINT once `up` itself has seen the mesh ready (it polls the coordinator every 100 ms).
  auto log_text = [&] {
    std::ifstream f(log);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  const auto t0 = std::chrono::steady_clock::now();
  while (log_text().find("dsmesh up: ready") == std::string::npos &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(ThreadsTakingStopSignals(pid), std::vector<std::string>{}) << "threads of `up`";
  kill(pid, SIGINT);
  int st = 0;
  waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0);
  std::ifstream f(log);
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_NE(ss.str().find("dsmesh up: ready"), std::string::npos) << ss.str();
  EXPECT_NE(ss.str().find("dsmesh up: device: cpu (no CUDA GPU is visible"), std::string::npos) << ss.str();
  EXPECT_NE(ss.str().find("--device cuda to require a GPU)"), std::string::npos) << ss.str();
  EXPECT_NE(ss.str().find(", 2 worker(s) on cpu;"), std::string::npos) << ss.str();
  EXPECT_NE(ss.str().find("[coordinator] drained; exiting"), std::string::npos) << ss.str();
  // Every child is gone: the coordinator port is free again and no process has up as parent.
  int rc = 0;
  const std::string children = Capture("pgrep -P " + std::to_string(pid), &rc);
  EXPECT_EQ(children, "");
  EXPECT_THROW(client.Stats(), std::runtime_error);
}

}  // namespace
}  // namespace dsmesh::mesh_test
