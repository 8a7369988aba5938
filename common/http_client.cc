#include "common/http_client.h"

#include <utility>  // before Asio: Boost 1.74 needs std::exchange declared

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <stdexcept>

#include "common/flags.h"

namespace dsmesh {

namespace beast = boost::beast;
namespace http = beast::http;
using tcp = boost::asio::ip::tcp;

HttpEndpoint ParseHttpUrl(const std::string& url, const std::string& flag) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0) throw UsageError(flag + " must start with http:// (TLS is not supported): " + url);
  std::string rest = url.substr(scheme.size());
  std::string hostport = rest.substr(0, rest.find('/'));
  HttpEndpoint e;
  e.prefix = rest.size() > hostport.size() ? rest.substr(hostport.size()) : "";
  while (!e.prefix.empty() && e.prefix.back() == '/') e.prefix.pop_back();
  if (e.prefix.size() >= 3 && e.prefix.compare(e.prefix.size() - 3, 3, "/v1") == 0) e.prefix.resize(e.prefix.size() - 3);
  auto colon = hostport.rfind(':');
  e.host = colon == std::string::npos ? hostport : hostport.substr(0, colon);
  e.port = colon == std::string::npos ? "80" : hostport.substr(colon + 1);
  if (e.host.empty()) throw UsageError(flag + " has no host: " + url);
  return e;
}

HttpResult HttpFetch(const HttpEndpoint& e, const std::string& method, const std::string& path, const std::string& body,
                     const std::string& api_key, int timeout_s) {
  try {
    boost::asio::io_context io;
    tcp::resolver resolver(io);
    beast::tcp_stream stream(io);
    stream.expires_after(std::chrono::seconds(timeout_s));
    stream.connect(resolver.resolve(e.host, e.port));
    http::request<http::string_body> req{method == "GET" ? http::verb::get : http::verb::post, e.prefix + path, 11};
    req.set(http::field::host, e.host);
    req.set(http::field::content_type, "application/json");
    if (!api_key.empty()) req.set(http::field::authorization, "Bearer " + api_key);
    req.body() = body;
    req.prepare_payload();
    http::write(stream, req);
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(1ull << 30);
    http::read(stream, buffer, parser);
    beast::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    return {static_cast<int>(parser.get().result_int()), parser.get().body()};
  } catch (const boost::system::system_error& err) {
    throw std::runtime_error("http://" + e.host + ":" + e.port + e.prefix + path + ": " + err.code().message());
  }
}

}  // namespace dsmesh
