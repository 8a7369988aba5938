// Readiness and watchdog notifications to systemd (Type=notify units, see deploy/).
//
// Every dsmesh server calls NotifyReady() once it actually serves (listening socket bound and its
// dependencies answering), and NotifyWatchdog() each time a real health check passes, never from a
// bare timer: a wedged process must stop pinging so systemd restarts it. Outside systemd
// (NOTIFY_SOCKET unset) every call is a cheap no-op.
#pragma once

#include <chrono>
#include <optional>
#include <string>

namespace dsmesh {

// True when the process runs under a unit that listens for notifications.
bool SystemdNotifyEnabled();

void NotifyReady(const std::string& status = "");
void NotifyStopping(const std::string& status = "");
void NotifyStatus(const std::string& status);
void NotifyWatchdog();

// The watchdog interval systemd asked for (WatchdogSec=), if any. Ping at half of it or more often.
std::optional<std::chrono::microseconds> SystemdWatchdogInterval();

}  // namespace dsmesh
