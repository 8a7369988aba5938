// OpenAI-style error bodies: {"error": {"message", "type", "param", "code"}}, and the exception the
// handlers throw to produce one. Status codes follow docs/openai-api.md, "Errors and metrics": 400 invalid
// request, 401 bad key, 404 unknown model/path, 413 body too large, 429 queue full, 503 not ready.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>

namespace dsmesh {

struct ApiError : std::runtime_error {
  ApiError(int status, std::string message, std::string type, std::optional<std::string> param = std::nullopt,
           std::optional<std::string> code = std::nullopt)
      : std::runtime_error(message), status(status), type(std::move(type)), param(std::move(param)),
        code(std::move(code)) {}
  int status;
  std::string type;
  std::optional<std::string> param;
  std::optional<std::string> code;
};

// 400 invalid_request_error naming the parameter.
ApiError BadRequest(const std::string& message, std::optional<std::string> param = std::nullopt,
                    std::optional<std::string> code = std::nullopt);

// The Retry-After header (seconds) of every 503: a mesh that lost a worker is formed again within
// seconds once the worker is back (restarted by systemd or `dsmesh up`).
inline constexpr char kRetryAfterSeconds[] = "1";

// The JSON body for an error (also used for the `data: {"error": ...}` event of a failed stream).
std::string ErrorBody(const ApiError& e);
std::string ErrorBody(int status, const std::string& message);  // type chosen from the status

}  // namespace dsmesh
