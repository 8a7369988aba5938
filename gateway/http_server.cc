#include "gateway/http_server.h"

#include <sys/socket.h>

#include <boost/beast/core.hpp>
#include <array>
#include <cerrno>
#include <deque>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace dsmesh {

namespace net = boost::asio;
namespace beast = boost::beast;
using tcp = net::ip::tcp;

namespace {
constexpr int kWriteTimeoutS = 120;  // a client that reads nothing for this long is dropped

// One chunk of a chunked body: hex size, CRLF, data, CRLF.
std::string FrameChunk(std::string data) {
  char size[32];
  std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
  return size + std::move(data) + "\r\n";
}
}  // namespace

// One TCP connection. Every member is touched only on the connection's strand.
class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  HttpSession(tcp::socket&& socket, const HttpServerOptions& options, const HttpHandler& handler,
              HttpServerState* state)
      : stream_(std::move(socket)), options_(options), handler_(handler), state_(state) {}

  bool draining() const { return state_->draining.load(); }

  void Run() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->DoReadHeader(); });
  }

  template <class F>
  void Post(F&& f) {
    net::post(stream_.get_executor(), std::forward<F>(f));
  }

  // Queues bytes for the current response; `ends_response` marks its last piece.
  void Enqueue(uint64_t generation, std::string data, bool ends_response, bool keep_alive) {
    if (closed_ || generation != generation_) return;
    writes_.push_back(Piece{std::move(data), ends_response, keep_alive});
    if (!writing_) DoWrite();
  }

  // Sends `chunk` whenever the response of `generation` has written nothing for stream_ping_s.
  void StartIdlePings(uint64_t generation, std::string chunk, bool chunked) {
    if (closed_ || generation != generation_ || options_.stream_ping_s <= 0) return;
    idle_chunk_ = chunked ? FrameChunk(std::move(chunk)) : std::move(chunk);
    ArmPing(generation);
  }

  void CloseFromHandler(uint64_t generation) {
    if (generation == generation_) Close();
  }

 private:
  struct Piece {
    std::string data;
    bool ends_response;
    bool keep_alive;
  };

  void DoReadHeader() {
    if (closed_) return;
    parser_.emplace();
    parser_->header_limit(options_.max_header_bytes);
    parser_->body_limit(options_.max_body_bytes);
    stream_.expires_after(std::chrono::seconds(options_.idle_timeout_s));
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
  }

  void OnHeader(beast::error_code ec) {
    if (ec) return FailRead(ec);
    auto& req = parser_->get();
    // Content-Length over the limit is refused here, before the body is read.
    if (auto len = parser_->content_length(); len && *len > options_.max_body_bytes)
      return FailRead(http::error::body_limit);
    if (beast::iequals(req[http::field::expect], "100-continue")) {
      auto cont = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
      net::async_write(stream_, net::buffer(*cont), [self = shared_from_this(), cont](beast::error_code ec, size_t) {
        if (ec) return self->Close();
        self->DoReadBody();
      });
      return;
    }
    DoReadBody();
  }

  void DoReadBody() {
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

  void FailRead(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == beast::error::timeout ||
        ec == net::error::connection_reset || ec == net::error::operation_aborted) {
      return Close();
    }
    // Malformed or oversized request: answer once, then close (the stream position is unknown).
    int status = 400;
    std::string message = "malformed HTTP request: " + ec.message();
    if (ec == http::error::body_limit) {
      status = 413;
      message = "request body exceeds the limit of " + std::to_string(options_.max_body_bytes) + " bytes";
    } else if (ec == http::error::header_limit) {
      status = 431;
      message = "request headers exceed the limit of " + std::to_string(options_.max_header_bytes) + " bytes";
    }
    http::response<http::string_body> res{static_cast<http::status>(status), 11};
    res.set(http::field::content_type, "application/json");
    res.set(http::field::connection, "close");
    res.body() = options_.error_body ? options_.error_body(status, message) : message;
    res.prepare_payload();
    std::ostringstream os;
    os << res;
    ++generation_;
    current_.reset();
    BeginResponse();
    Enqueue(generation_, os.str(), true, false);
  }

  void OnRead(beast::error_code ec) {
    if (ec) return FailRead(ec);
    ++generation_;
    auto exchange = std::make_shared<HttpExchange>(shared_from_this(), parser_->release(), generation_);
    current_ = exchange;
    BeginResponse();
    Watch(generation_);
    try {
      handler_(exchange);
    } catch (const std::exception&) {
      Close();  // the handler reports its own errors; reaching here means it could not even do that
    }
  }

  // Waits for the socket to become readable while a response is pending: EOF or an error means the
  // client is gone; readable data is a pipelined request and is left for the next read.
  void Watch(uint64_t generation) {
    stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this(), generation](beast::error_code ec) {
      if (ec || self->closed_ || generation != self->generation_ || self->current_.expired()) return;
      char c;
      ssize_t n = ::recv(self->stream_.socket().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n > 0) return;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return self->Watch(generation);
      self->ClientGone();
    });
  }

  // Wakes up when the stream will have been silent for stream_ping_s (measured from the last write),
  // sends the idle chunk if it still is, and re-arms.
  void ArmPing(uint64_t generation) {
    const auto interval = std::chrono::seconds(options_.stream_ping_s);
    const auto now = std::chrono::steady_clock::now();
    // A deadline already past (a write stuck behind a client that does not read) waits a full
    // interval instead, so the timer never spins.
    auto deadline = last_write_ + interval;
    if (deadline <= now) deadline = now + interval;
    ping_timer_.expires_at(deadline);
    ping_timer_.async_wait([self = shared_from_this(), generation, interval](beast::error_code ec) {
      if (ec || self->closed_ || generation != self->generation_) return;
      if (std::chrono::steady_clock::now() - self->last_write_ >= interval && self->writes_.empty() && !self->writing_) {
        self->Enqueue(generation, self->idle_chunk_, false, true);
        self->last_write_ = std::chrono::steady_clock::now();  // the ping itself counts
      }
      self->ArmPing(generation);
    });
  }

  // A response is owed from the moment a request is read until its last byte is written or the connection
  // closes; the server's count of these is what a drain waits for.
  void BeginResponse() {
    if (response_pending_) return;
    response_pending_ = true;
    state_->pending_responses.fetch_add(1);
  }

  void EndResponse() {
    if (!response_pending_) return;
    response_pending_ = false;
    state_->pending_responses.fetch_sub(1);
  }

  void ClientGone() {
    if (auto exchange = current_.lock()) exchange->NotifyDisconnect();
    Close();
  }

  void DoWrite() {
    writing_ = true;
    stream_.expires_after(std::chrono::seconds(kWriteTimeoutS));
    net::async_write(stream_, net::buffer(writes_.front().data),
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->OnWrite(ec); });
  }

  void OnWrite(beast::error_code ec) {
    writing_ = false;
    if (closed_) {  // closed while this write was in flight: its buffer could only be freed now
      writes_.clear();
      return;
    }
    if (ec) return ClientGone();
    last_write_ = std::chrono::steady_clock::now();
    Piece done = std::move(writes_.front());
    writes_.pop_front();
    if (done.ends_response) {
      EndResponse();
      current_.reset();
      ping_timer_.cancel();
      ++generation_;  // later pieces or watch callbacks of the finished exchange are ignored
      writes_.clear();
      if (!done.keep_alive) return LingeringClose();
      return DoReadHeader();
    }
    if (!writes_.empty()) DoWrite();
  }

  // Closing right after an early answer (413 while the client still uploads) would reset the
  // connection and the client would see a network error instead of the answer. So: stop sending, read
  // and discard what the client still sends (bounded in time), then close, as nginx's lingering close.
  void LingeringClose() {
    if (closed_) return;
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    linger_deadline_ = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    DiscardInput();
  }

  void DiscardInput() {
    if (closed_ || std::chrono::steady_clock::now() > linger_deadline_) return Close();
    stream_.expires_at(linger_deadline_);
    stream_.async_read_some(net::buffer(discard_), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->Close();
      self->DiscardInput();
    });
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    EndResponse();  // nothing more can reach the client
    ping_timer_.cancel();
    if (!writing_) writes_.clear();  // an in-flight async_write still reads writes_.front()
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
  }

  beast::tcp_stream stream_;
  const HttpServerOptions& options_;
  const HttpHandler& handler_;
  HttpServerState* state_;
  bool response_pending_ = false;  // counted in state_->pending_responses
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::deque<Piece> writes_;
  bool writing_ = false;
  bool closed_ = false;
  uint64_t generation_ = 0;  // bumps per request so stale callbacks can be told apart
  std::weak_ptr<HttpExchange> current_;
  std::chrono::steady_clock::time_point linger_deadline_;
  std::chrono::steady_clock::time_point last_write_;
  net::steady_timer ping_timer_{stream_.get_executor()};
  std::string idle_chunk_;  // framed
  std::array<char, 16384> discard_;
};

// ---------------------------------------------------------------------------------------------
// HttpExchange

HttpExchange::HttpExchange(std::shared_ptr<HttpSession> session, HttpRequest request, uint64_t generation)
    : session_(std::move(session)),
      request_(std::move(request)),
      generation_(generation),
      chunked_(request_.version() >= 11) {}

HttpExchange::~HttpExchange() {
  bool completed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    completed = completed_;
  }
  if (!completed) {
    // The handler dropped the request without answering (a bug): close rather than hang the client.
    auto session = session_;
    auto generation = generation_;
    session->Post([session, generation] { session->CloseFromHandler(generation); });
  }
}

void HttpExchange::Respond(int status, const std::string& content_type, std::string body, const HeaderList& headers) {
  http::response<http::string_body> res{static_cast<http::status>(status), request_.version()};
  res.set(http::field::server, "dsmesh-gateway");
  res.set(http::field::content_type, content_type);
  for (const auto& [k, v] : headers) res.set(k, v);
  res.keep_alive(keep_alive());
  res.body() = std::move(body);
  res.prepare_payload();
  std::ostringstream os;
  os << res;
  {
    std::lock_guard<std::mutex> lock(mu_);
    completed_ = true;
  }
  session_->Post([session = session_, generation = generation_, data = os.str(), keep = res.keep_alive()]() mutable {
    session->Enqueue(generation, std::move(data), true, keep);
  });
}

void HttpExchange::StartStream(int status, const std::string& content_type, const HeaderList& headers,
                               const std::string& idle_chunk) {
  http::response<http::empty_body> res{static_cast<http::status>(status), request_.version()};
  res.set(http::field::server, "dsmesh-gateway");
  res.set(http::field::content_type, content_type);
  res.set(http::field::cache_control, "no-cache");
  for (const auto& [k, v] : headers) res.set(k, v);
  // HTTP/1.0 has no chunked encoding: the body then simply runs until the connection closes.
  res.keep_alive(chunked_ && keep_alive());
  if (chunked_) res.chunked(true);
  std::ostringstream os;
  os << res.base();
  session_->Post(
      [session = session_, generation = generation_, data = os.str(), idle_chunk, chunked = chunked_]() mutable {
        session->Enqueue(generation, std::move(data), false, true);
        if (!idle_chunk.empty()) session->StartIdlePings(generation, idle_chunk, chunked);
      });
}

void HttpExchange::SendChunk(std::string data) {
  if (data.empty()) return;  // an empty chunk would end the body
  std::string framed = chunked_ ? FrameChunk(std::move(data)) : std::move(data);
  session_->Post([session = session_, generation = generation_, framed = std::move(framed)]() mutable {
    session->Enqueue(generation, std::move(framed), false, true);
  });
}

void HttpExchange::FinishStream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    completed_ = true;
  }
  session_->Post([session = session_, generation = generation_, keep = chunked_ && keep_alive(),
                  last = std::string(chunked_ ? "0\r\n\r\n" : "")] {
    session->Enqueue(generation, last, true, keep);
  });
}

bool HttpExchange::keep_alive() const { return request_.keep_alive() && !session_->draining(); }

void HttpExchange::OnDisconnect(std::function<void()> fn) {
  bool already = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (disconnected_) already = true;
    else on_disconnect_ = std::move(fn);
  }
  if (already && fn) fn();
}

bool HttpExchange::disconnected() const {
  std::lock_guard<std::mutex> lock(mu_);
  return disconnected_;
}

void HttpExchange::NotifyDisconnect() {
  std::function<void()> fn;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A client that closes after the whole answer was queued did not abandon anything.
    if (disconnected_ || completed_) return;
    disconnected_ = true;
    completed_ = true;  // nothing more can be sent
    fn = std::move(on_disconnect_);
  }
  if (fn) fn();
}

// ---------------------------------------------------------------------------------------------
// HttpServer

HttpServer::HttpServer(HttpServerOptions options, HttpHandler handler)
    : options_(std::move(options)), handler_(std::move(handler)), acceptor_(net::make_strand(io_)) {}

HttpServer::~HttpServer() { Stop(); }

uint16_t HttpServer::Listen() {
  beast::error_code ec;
  auto address = net::ip::make_address(options_.host, ec);
  if (ec) throw std::runtime_error("--listen: bad address '" + options_.host + "': " + ec.message());
  tcp::endpoint endpoint{address, options_.port};
  const std::string where = options_.host + ":" + std::to_string(options_.port);
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
  if (ec) throw std::runtime_error("cannot listen on " + where + ": " + ec.message());
  return acceptor_.local_endpoint().port();
}

void HttpServer::Start() {
  DoAccept();
  for (int i = 0; i < options_.threads; ++i) threads_.emplace_back([this] { io_.run(); });
}

void HttpServer::DoAccept() {
  acceptor_.async_accept(net::make_strand(io_), [this](beast::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || !acceptor_.is_open()) return;
    if (!ec) {
      socket.set_option(tcp::no_delay(true), ec);
      std::make_shared<HttpSession>(std::move(socket), options_, handler_, &state_)->Run();
    }
    DoAccept();
  });
}

void HttpServer::StopAccepting() {
  state_.draining = true;
  net::post(acceptor_.get_executor(), [this] {
    beast::error_code ignored;
    acceptor_.close(ignored);
  });
}

void HttpServer::Stop() {
  io_.stop();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
  threads_.clear();
}

}  // namespace dsmesh
