#include "common/systemd_notify.h"

#include <systemd/sd-daemon.h>

#include <cstdlib>

namespace dsmesh {

namespace {

void Send(const std::string& message) {
  // unset_environment = 0: children (and later calls) keep NOTIFY_SOCKET. Errors are ignored on
  // purpose: a notification that cannot be delivered must not take the server down.
  sd_notify(0, message.c_str());
}

std::string WithStatus(std::string message, const std::string& status) {
  if (!status.empty()) message += "\nSTATUS=" + status;
  return message;
}

}  // namespace

bool SystemdNotifyEnabled() { return std::getenv("NOTIFY_SOCKET") != nullptr; }

void NotifyReady(const std::string& status) { Send(WithStatus("READY=1", status)); }

void NotifyStopping(const std::string& status) { Send(WithStatus("STOPPING=1", status)); }

void NotifyStatus(const std::string& status) { Send("STATUS=" + status); }

void NotifyWatchdog() { Send("WATCHDOG=1"); }

std::optional<std::chrono::microseconds> SystemdWatchdogInterval() {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0) return std::chrono::microseconds(usec);
  return std::nullopt;
}

}  // namespace dsmesh
