// The gateway's HTTP/1.1 server: Boost.Beast on Boost.Asio, asynchronous, keep-alive, one strand per
// connection, run by several threads. It knows nothing about OpenAI: it reads a request (rejecting
// oversized headers/bodies before reading them), hands an HttpExchange to the handler, and writes
// whatever the handler answers: one whole response, or a chunked stream (SSE). While a response is
// pending it watches the socket so a client that goes away is noticed at once (not at the next write),
// and tells the handler through OnDisconnect, which is how a disconnect aborts a request in the mesh.
#pragma once

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange without it

#include <boost/asio.hpp>
#include <boost/beast/http.hpp>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace dsmesh {

namespace http = boost::beast::http;
using HttpRequest = http::request<http::string_body>;
using HeaderList = std::vector<std::pair<std::string, std::string>>;

class HttpSession;

// What every connection of one HttpServer shares with it.
struct HttpServerState {
  // Requests read whose response is not yet wholly written (nor their connection closed): a drain waits
  // for these, since a response the handler has produced may still sit in a write queue.
  std::atomic<int> pending_responses{0};
  // Set by StopAccepting: responses then say "Connection: close", so clients do not send more requests on
  // connections that are about to go away.
  std::atomic<bool> draining{false};
};

// One request and its response. Methods may be called from any thread; they post to the connection's
// strand. Exactly one of Respond() or StartStream()...FinishStream() must be used.
class HttpExchange : public std::enable_shared_from_this<HttpExchange> {
 public:
  HttpExchange(std::shared_ptr<HttpSession> session, HttpRequest request, uint64_t generation);
  ~HttpExchange();

  const HttpRequest& request() const { return request_; }

  void Respond(int status, const std::string& content_type, std::string body, const HeaderList& headers = {});
  // `idle_chunk`, if set, is sent whenever the stream has been silent for stream_ping_s (an SSE comment
  // such as ": ping\n\n" keeps proxies and clients from timing out during a long prefill).
  void StartStream(int status, const std::string& content_type, const HeaderList& headers = {},
                   const std::string& idle_chunk = "");
  void SendChunk(std::string data);  // one chunk of the chunked body
  void FinishStream();

  // Called once (from the connection's strand) if the client closes the connection before the
  // response is complete. Set it before starting work that should be aborted.
  void OnDisconnect(std::function<void()> fn);
  bool disconnected() const;

 private:
  friend class HttpSession;
  void NotifyDisconnect();

  bool keep_alive() const;  // the request's keep-alive, unless the server is draining

  std::shared_ptr<HttpSession> session_;
  HttpRequest request_;
  const uint64_t generation_;
  const bool chunked_;  // HTTP/1.1: chunked streams; HTTP/1.0: body until close
  mutable std::mutex mu_;
  std::function<void()> on_disconnect_;
  bool disconnected_ = false;
  bool completed_ = false;
};

using HttpHandler = std::function<void(std::shared_ptr<HttpExchange>)>;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;
  int threads = 4;
  uint64_t max_body_bytes = 32ull << 20;  // larger bodies get 413 before the body is read
  uint32_t max_header_bytes = 64 << 10;
  int idle_timeout_s = 75;                // keep-alive connections idle longer are closed
  int stream_ping_s = 15;                 // silence after which a stream's idle_chunk is sent
  // Body for 413/400 answers produced by the server itself (before a handler runs).
  std::function<std::string(int status, const std::string& message)> error_body;
};

class HttpServer {
 public:
  HttpServer(HttpServerOptions options, HttpHandler handler);
  ~HttpServer();

  // Binds and listens (throws naming the address on failure); returns the bound port.
  uint16_t Listen();
  void Start();          // starts the worker threads
  void StopAccepting();  // drain: no new connections; later responses close their connection
  // Requests read and not yet answered to the last byte (their connection still open). Stop() drops them.
  int pending_responses() const { return state_.pending_responses.load(); }
  void Stop();           // stops the io threads (in-flight connections are dropped)
  boost::asio::io_context& io() { return io_; }

 private:
  void DoAccept();

  HttpServerOptions options_;
  HttpHandler handler_;
  HttpServerState state_;  // before io_: the sessions io_ still holds point to it
  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::vector<std::thread> threads_;
};

}  // namespace dsmesh
