// Helpers shared by the chat tests: test data files (Bazel runfiles), environment, running the
// python3 oracles.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/chat/chat_request.h"

namespace dsmesh::chat_test {

// Directory of the committed test data, relative to the test's working directory.
inline constexpr char kTestdata[] = "common/chat/testdata";

std::string ReadFile(const std::string& path);
// Sorted paths of the files in `dir` whose names end in `suffix`.
std::vector<std::string> ListFiles(const std::string& dir, const std::string& suffix);
std::string Basename(const std::string& path);
// The variable's value; fails the test (throws) with a clear message when it is unset.
std::string RequireEnv(const char* name);
// Runs a shell command; returns its stdout; throws with the command and exit status on failure.
std::string RunCommand(const std::string& command);
// Single-quotes a path or word for the shell.
std::string ShellQuote(const std::string& s);
// The Python that has Debian's python3-jinja2 (which ./dsmesh installs): /usr/bin/python3 when present,
// so a python3 earlier on PATH (pyenv, a venv) without jinja2 cannot break the oracle.
std::string DebianPython3();
// Loads and parses one conversation file (an OpenAI request body).
ChatRequest LoadConversation(const std::string& path);
// True when `s` is well-formed UTF-8.
bool IsValidUtf8(const std::string& s);

}  // namespace dsmesh::chat_test
