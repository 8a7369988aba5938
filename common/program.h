// What the main() of every dsmesh binary does around its real work.
#pragma once

#include <functional>

namespace dsmesh {

// Blocks SIGTERM, SIGINT and SIGUSR1 in this thread and every thread started after it (a dedicated
// sigwait thread takes them) and ignores SIGPIPE (a peer closing a socket is an error return, not a
// death). Call first thing in main(), before any thread starts.
void BlockShutdownSignals();

// Waits (sigwait) for SIGTERM, SIGINT or SIGUSR1, blocked by BlockShutdownSignals, and returns which came.
// SIGUSR1 is a process's own wake-up for its waiting thread when it stops for another reason.
int WaitShutdownSignal();

// Runs body and turns what it throws into the exit code: UsageError -> "NAME: message" and, when
// usage is given, "usage: USAGE" on stderr, exit 2; any other std::exception -> "NAME: error: message",
// exit 1.
int RunProgram(const char* name, const char* usage, const std::function<int()>& body);

}  // namespace dsmesh
