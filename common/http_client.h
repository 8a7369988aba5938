// A plain HTTP/1.1 client for the CLI commands that talk to a gateway (`dsmesh bench --url`, `dsmesh ppl
// --url`): the --url parsing and one blocking request with a JSON body. Not for serving paths.
#pragma once

#include <string>

namespace dsmesh {

struct HttpEndpoint {
  std::string host, port, prefix;  // prefix: path before /v1 (usually empty)
};

// "http://HOST[:PORT][/prefix][/v1]" -> endpoint; throws UsageError naming `flag` (TLS is not supported).
HttpEndpoint ParseHttpUrl(const std::string& url, const std::string& flag = "--url");

struct HttpResult {
  int status = 0;
  std::string body;
};

// One request (method "GET" or "POST"; `body` sent as application/json, the API key as a bearer token when
// given), the whole answer read (at most 1 GiB). Throws std::runtime_error (connection, timeout).
HttpResult HttpFetch(const HttpEndpoint& e, const std::string& method, const std::string& path, const std::string& body,
                     const std::string& api_key = "", int timeout_s = 60);

}  // namespace dsmesh
