// dsmesh-gateway: the OpenAI-compatible HTTP front of a mesh.
//
//   dsmesh-gateway --listen 127.0.0.1:8000 --coordinator HOST:PORT --model DIR
//                  [--served-model-name NAME] [--api-key KEY | --api-key-file F] [--max-queued N]
//                  [--threads N] [--max-body-bytes N] [--chat-format v4|v3] [--drain-timeout-s S]
//                  [--sse-ping-s S]  (": ping" comment on a stream silent this long; 0 = never)
//                  [--idle-timeout-s S]  (per request for headers + body, and keep-alive idle; default 75)
//                  [--handler-threads N]  (parse, render, tokenize off the HTTP threads; 0 = on them)
//                  [--allowed-local-media-path DIR]  (file:// image URLs under DIR; none without it)
//                  [--max-image-bytes N] [--max-image-pixels N] [--max-image-side N] [--max-images-per-request N]
//
// Image parts (image_url with a data: URL) are decoded and checked against the --max-image-* limits; a
// model with a vision tower (config.json vision_n_layers > 0) gets them preprocessed and expanded into the
// prompt (gateway/image_prompt_builder.h), any other ends in a 400 "model X does not accept images".
//
// --max-queued N: admission (429 queue_full) is held by the coordinator, shared by every gateway of the
// mesh; N, when given, is sent with each request and can only lower the coordinator's own --max-queued.
//
// Startup: load the tokenizer from DIR, listen, then poll the coordinator; /health answers 503 until
// the mesh is ready, and systemd gets READY=1 only then. SIGTERM/SIGINT: /health turns 503
// (draining), new connections are refused, responses close their connection, and every request already
// read gets up to --drain-timeout-s to be answered to its last byte.
#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <optional>
#include <set>
#include <thread>

#include "common/chat/chat_format.h"
#include "common/flags.h"
#include "common/model_card.h"
#include "common/program.h"
#include "common/systemd_notify.h"
#include "common/tokenizer/tokenizer.h"
#include "gateway/admission.h"
#include "gateway/api_error.h"
#include "gateway/http_server.h"
#include "common/mesh/mesh_client.h"
#include "common/mesh/mesh_credentials.h"
#include "gateway/mesh_monitor.h"
#include "gateway/openai_server.h"
#include "gateway/serving_metrics.h"

namespace dsmesh {
namespace {

const char kUsage[] =
    "dsmesh-gateway --listen HOST:PORT --coordinator HOST:PORT --model DIR [--served-model-name NAME]\n"
    "               [--api-key KEY[,KEY...] | --api-key-file F] [--max-queued N] [--threads N]\n"
    "               [--max-body-bytes N] [--chat-format v4|v3] [--drain-timeout-s S] [--sse-ping-s S]\n"
    "               [--idle-timeout-s S] [--handler-threads N] [--allowed-local-media-path DIR]\n"
    "               [--max-image-bytes N] [--max-image-pixels N] [--max-image-side N] [--max-images-per-request N]";

std::pair<std::string, uint16_t> SplitHostPort(const std::string& s) {
  auto colon = s.rfind(':');
  if (colon == std::string::npos) throw UsageError("--listen: expected HOST:PORT, got '" + s + "'");
  std::string host = s.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  char* end = nullptr;
  long port = std::strtol(s.c_str() + colon + 1, &end, 10);
  if (*end || port < 0 || port > 65535 || colon + 1 == s.size())
    throw UsageError("--listen: bad port in '" + s + "'");
  return {host, static_cast<uint16_t>(port)};
}

std::set<std::string> ReadApiKeys(const Flags& flags) {
  std::set<std::string> keys;
  auto add_list = [&](const std::string& list, const std::string& where) {
    size_t start = 0;
    while (start <= list.size()) {
      size_t end = list.find_first_of(",\n", start);
      if (end == std::string::npos) end = list.size();
      std::string key = list.substr(start, end - start);
      while (!key.empty() && (key.back() == '\r' || key.back() == ' ')) key.pop_back();
      while (!key.empty() && key.front() == ' ') key.erase(0, 1);
      if (!key.empty() && key[0] != '#') keys.insert(key);
      start = end + 1;
    }
    if (keys.empty()) throw UsageError(where + ": no API key in it");
  };
  if (flags.Has("api-key") && flags.Has("api-key-file")) throw UsageError("give --api-key or --api-key-file, not both");
  if (flags.Has("api-key")) add_list(flags.Get("api-key"), "--api-key");
  if (const char* env = std::getenv("DSMESH_API_KEY"); env && !flags.Has("api-key") && !flags.Has("api-key-file"))
    add_list(env, "DSMESH_API_KEY");
  if (flags.Has("api-key-file")) {
    std::string path = flags.Get("api-key-file");
    std::ifstream in(path);
    if (!in) throw std::runtime_error("--api-key-file " + path + ": cannot read");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    add_list(text, "--api-key-file " + path);
  }
  return keys;
}

struct ModelInfo {
  ChatFormat chat_format = ChatFormat::kDeepSeekV4;
  int max_position_embeddings = 1 << 20;
  VisionConfig vision;  // the vision_* keys (the preprocessing of image parts); n_layers 0: text only
};

ModelInfo ReadModelInfo(const std::string& dir, const std::string& chat_format_flag) {
  const ModelCard card = ModelCard::FromDirectory(dir);
  ModelInfo info;
  if (card.max_position_embeddings)
    info.max_position_embeddings =
        static_cast<int>(std::min<int64_t>(*card.max_position_embeddings, std::numeric_limits<int>::max()));
  info.vision = card.vision;
  if (!chat_format_flag.empty()) {
    info.chat_format = ParseChatFormatName(chat_format_flag);
  } else {
    auto format = ChatFormatForModelType(card.model_type);
    if (!format)
      throw std::runtime_error(card.source + ": model_type '" + card.model_type +
                               "' has no chat format here; pass --chat-format v4|v3");
    info.chat_format = *format;
  }
  return info;
}

int Run(int argc, char** argv) {
  Flags flags(std::vector<std::string>(argv + 1, argv + argc),
              WithMeshCredentialFlags({"listen", "coordinator", "model", "served-model-name", "api-key", "api-key-file",
                                       "max-queued", "threads", "max-body-bytes", "chat-format", "drain-timeout-s",
                                       "sse-ping-s", "idle-timeout-s", "handler-threads", "log-level", "help",
                                       "allowed-local-media-path", "max-image-bytes", "max-image-pixels",
                                       "max-image-side", "max-images-per-request"}),
              {"help"});
  if (flags.Has("help")) {
    std::printf("%s\n", kUsage);
    return 0;
  }
  if (flags.Has("log-level")) spdlog::set_level(spdlog::level::from_str(flags.Get("log-level")));
  auto [host, port] = SplitHostPort(flags.Get("listen", "127.0.0.1:8000"));
  const std::string coordinator = flags.Require("coordinator");
  const std::string model_dir = flags.Require("model");
  std::optional<int> max_queued;
  if (flags.Has("max-queued")) {
    const long long n = flags.GetInt("max-queued", 0);
    if (n < 0 || n > std::numeric_limits<int>::max()) throw UsageError("--max-queued must be >= 0");
    max_queued = static_cast<int>(n);
  }
  const int threads = static_cast<int>(flags.GetInt("threads", 4));
  if (threads < 1) throw UsageError("--threads must be >= 1");

  ModelInfo model = ReadModelInfo(model_dir, flags.Get("chat-format"));
  std::shared_ptr<const Tokenizer> tokenizer = Tokenizer::Load(model_dir);
  OpenAiServerOptions api_options;
  api_options.model_dir = std::filesystem::absolute(model_dir).lexically_normal().string();
  std::string default_name = std::filesystem::path(api_options.model_dir).filename().string();
  api_options.served_model_name = flags.Get("served-model-name", default_name);
  api_options.api_keys = ReadApiKeys(flags);
  api_options.chat_format = model.chat_format;
  ImageInputOptions& images = api_options.images;
  images.url.allowed_local_media_path = flags.Get("allowed-local-media-path", "");
  if (!images.url.allowed_local_media_path.empty() && !std::filesystem::is_directory(images.url.allowed_local_media_path))
    throw UsageError("--allowed-local-media-path: not a directory: " + images.url.allowed_local_media_path);
  const long long max_image_bytes = flags.GetInt("max-image-bytes", 20ll << 20);
  const long long max_image_pixels = flags.GetInt("max-image-pixels", 16ll << 20);
  const long long max_image_side = flags.GetInt("max-image-side", 16384);
  const long long max_images = flags.GetInt("max-images-per-request", 8);
  if (max_image_bytes < 1 || max_image_pixels < 1 || max_image_side < 1 || max_image_side > (1 << 30) || max_images < 0 ||
      max_images > (1 << 20))
    throw UsageError("--max-image-bytes, --max-image-pixels and --max-image-side must be >= 1, "
                     "--max-images-per-request >= 0");
  images.url.limits.max_bytes = static_cast<uint64_t>(max_image_bytes);
  images.url.limits.max_pixels = static_cast<uint64_t>(max_image_pixels);
  images.url.limits.max_side = static_cast<int>(max_image_side);
  images.max_images = static_cast<int>(max_images);
  api_options.images_refused_reason = "it has no vision tower (config.json has no vision_n_layers)";
  if (model.vision.enabled()) api_options.vision = model.vision;

  MeshClient mesh(coordinator, MeshCredentialsFromFlags(flags));
  ServingMetrics metrics(api_options.served_model_name, model.max_position_embeddings);
  Admission admission(max_queued);

  HttpServerOptions http_options;
  http_options.host = host;
  http_options.port = port;
  http_options.threads = threads;
  http_options.max_body_bytes = static_cast<uint64_t>(flags.GetInt("max-body-bytes", 32ll << 20));
  http_options.stream_ping_s = static_cast<int>(flags.GetInt("sse-ping-s", 15));
  // A connection gets this long for each request's headers and body (slow-loris clients are cut off)
  // and may sit idle this long between keep-alive requests.
  http_options.idle_timeout_s = static_cast<int>(flags.GetInt("idle-timeout-s", 75));
  if (http_options.idle_timeout_s < 1) throw UsageError("--idle-timeout-s must be >= 1");
  http_options.error_body = [](int status, const std::string& message) { return ErrorBody(status, message); };

  // The --threads HTTP threads only move bytes. Requests with a body (JSON parsing, chat rendering,
  // tokenizing a prompt that may be megabytes) and /metrics (a coordinator round trip) are handled on
  // a separate pool, so a long prompt never holds up the event loop that writes other clients' streams.
  const int handler_threads = static_cast<int>(flags.GetInt("handler-threads", 4));
  if (handler_threads < 0) throw UsageError("--handler-threads must be >= 0");
  std::unique_ptr<boost::asio::thread_pool> handler_pool;
  if (handler_threads > 0) handler_pool = std::make_unique<boost::asio::thread_pool>(handler_threads);
  OpenAiServer* api_ptr = nullptr;
  HttpServer server(http_options, [&api_ptr, &handler_pool](std::shared_ptr<HttpExchange> exchange) {
    const auto& req = exchange->request();
    const bool heavy = req.method() != http::verb::get || req.target().starts_with("/metrics");
    if (handler_pool && heavy) {
      boost::asio::post(*handler_pool, [&api_ptr, exchange] { api_ptr->Handle(exchange); });
      return;
    }
    api_ptr->Handle(exchange);
  });

  // The watchdog's loop probe: a task posted to the HTTP event loop must run within 2 s.
  auto loop_probe = [&server] {
    auto done = std::make_shared<std::promise<void>>();
    auto future = done->get_future();
    boost::asio::post(server.io(), [done] { done->set_value(); });
    return future.wait_for(std::chrono::seconds(2)) == std::future_status::ready;
  };
  // Polled 4 times a second, so /health turns 503 within 250 ms of a lost worker (a restart takes longer).
  MeshMonitor monitor(&mesh, std::chrono::milliseconds(250), loop_probe);
  OpenAiServer api(api_options, tokenizer, &mesh, &monitor, &metrics, &admission);
  api_ptr = &api;

  // Blocked in every thread since main() (BlockShutdownSignals); taken here by sigwait.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);

  uint16_t bound = server.Listen();
  server.Start();
  const std::string where = host + ":" + std::to_string(bound);
  spdlog::info("dsmesh-gateway listening on {} (model {} from {}, coordinator {}, max queued {}, {} HTTP threads, "
               "{} handler threads)",
               where, api_options.served_model_name, api_options.model_dir, coordinator,
               max_queued ? std::to_string(*max_queued) + " (forwarded; the coordinator holds admission)"
                          : std::string("the coordinator's"),
               threads, handler_threads);
  std::printf("listening on %s\n", where.c_str());
  std::fflush(stdout);
  monitor.OnFirstReady([where] {
    spdlog::info("serving: mesh ready, gateway on {}", where);
    NotifyReady("serving on " + where);
  });
  monitor.Start();

  int sig = 0;
  sigwait(&signals, &sig);
  const double drain_s = flags.GetDouble("drain-timeout-s", 30);
  spdlog::info("signal {}: draining (up to {} s for {} in-flight requests)", sig, drain_s, admission.in_flight());
  NotifyStopping("draining");
  monitor.SetDraining();
  server.StopAccepting();
  // Drained when the mesh is done with this gateway's requests and every request read has been answered to
  // its last byte: a generation's ticket is released when its gRPC calls end, which can be before its
  // response has left the write queue (a slow reader, a loaded machine), and a request still being parsed
  // holds no ticket yet. Stopping the event loop earlier would cut those connections without an answer.
  auto drained = [&] { return admission.in_flight() == 0 && server.pending_responses() == 0; };
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(drain_s);
  while (!drained() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (!drained())
    spdlog::warn("drain timeout: dropping {} requests in the mesh, {} responses not yet sent", admission.in_flight(),
                 server.pending_responses());
  monitor.Stop();
  server.Stop();
  if (handler_pool) handler_pool->join();
  spdlog::info("stopped");
  return 0;
}

}  // namespace
}  // namespace dsmesh

int main(int argc, char** argv) {
  // Before any thread starts (gRPC's, the handler pool's, the HTTP threads): a thread started with SIGTERM
  // unblocked could be the one the kernel hands the signal to, and its default action would end the process
  // at once, dropping every in-flight request, instead of the drain that sigwait in Run starts.
  dsmesh::BlockShutdownSignals();
  return dsmesh::RunProgram("dsmesh-gateway", dsmesh::kUsage, [&] { return dsmesh::Run(argc, argv); });
}
