#include "gateway/api_error.h"

#include <nlohmann/json.hpp>

namespace dsmesh {

namespace {
std::string TypeForStatus(int status) {
  switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 405: return "invalid_request_error";
    case 413: return "invalid_request_error";
    case 429: return "rate_limit_error";
    case 503: return "unavailable_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}
}  // namespace

ApiError BadRequest(const std::string& message, std::optional<std::string> param, std::optional<std::string> code) {
  return ApiError(400, message, "invalid_request_error", std::move(param), std::move(code));
}

std::string ErrorBody(const ApiError& e) {
  nlohmann::json err = {{"message", e.what()}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (e.param) err["param"] = *e.param;
  if (e.code) err["code"] = *e.code;
  else err["code"] = e.status;  // like vLLM: the HTTP status when no symbolic code applies
  // Replace, not throw, on invalid UTF-8 echoed from a request (e.g. a bad field name).
  return nlohmann::json{{"error", err}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string ErrorBody(int status, const std::string& message) {
  return ErrorBody(ApiError(status, message, TypeForStatus(status)));
}

}  // namespace dsmesh
