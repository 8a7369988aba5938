#include "cli/launcher/local_mesh.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <thread>

namespace dsmesh {

std::string LocalMesh::SelfDir() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) throw std::runtime_error("cannot read /proc/self/exe");
  std::string path(buf, n);
  return path.substr(0, path.rfind('/'));
}

namespace {

// 127.0.0.1:port.
sockaddr_in Loopback(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  return a;
}

}  // namespace

int LocalMesh::FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = Loopback(0);
  socklen_t len = sizeof(a);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw std::runtime_error(std::string("cannot find a free port: ") + std::strerror(errno));
  int port = ntohs(a.sin_port);
  close(fd);
  return port;
}

LocalMesh::LocalMesh(const LocalMeshOptions& options) : opt_(options) {
  if (opt_.coordinator_port == 0) {
    opt_.coordinator_port = FreePort();
    port_chosen_here_ = true;
  }
  for (const auto& bin : {opt_.coordinator_bin, opt_.worker_bin})
    if (access(bin.c_str(), X_OK) != 0) throw std::runtime_error(bin + ": not an executable (build it first)");
  MeshCredentials& c = opt_.credentials;
  if (c.token.empty() && !c.tls()) {
    MeshCredentials process = ProcessMeshCredentials();
    if (process.token.empty()) {
      process.token = RandomMeshToken();
      SetProcessMeshCredentials(process);
    }
    c.token = process.token;
    std::string dir = opt_.log_dir;
    if (dir.empty()) {
      const char* tmp = std::getenv("TMPDIR");
      std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/dsmesh-mesh-XXXXXX";
      if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("cannot create a directory " + pattern);
      dir = token_dir_ = pattern;
    }
    c.token_file = dir + "/mesh-token";
    WriteMeshTokenFile(c.token_file, c.token);
  }
}

LocalMesh::~LocalMesh() {
  Stop();
  if (!token_dir_.empty()) {
    unlink(opt_.credentials.token_file.c_str());
    rmdir(token_dir_.c_str());
  }
}

std::string LocalMesh::coordinator_address() const { return "127.0.0.1:" + std::to_string(opt_.coordinator_port); }

pid_t LocalMesh::Spawn(const std::string& name, const std::vector<std::string>& argv) {
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);  // the parent died before prctl
    setpgid(0, 0);  // the terminal's Ctrl-C reaches only the launcher, which stops children in order
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (!opt_.log_dir.empty()) {
      std::string log = log_path(name);
      int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        dup2(fd, 2);
        dup2(fd, 1);
        close(fd);
      }
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    std::fprintf(stderr, "exec %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  return pid;
}

std::vector<std::string> LocalMesh::WorkerArgv(int rank) const {
  std::vector<std::string> argv = {opt_.worker_bin, "--rank", std::to_string(rank), "--world", std::to_string(opt_.world),
                                   "--coordinator", coordinator_address(), "--model", opt_.model_dir, "--device",
                                   opt_.device, "--threads", std::to_string(opt_.threads_per_worker)};
  if (!opt_.kv_memory.empty()) argv.insert(argv.end(), {"--kv-memory", opt_.kv_memory});
  if (!opt_.gpu_memory_utilization.empty())
    argv.insert(argv.end(), {"--gpu-memory-utilization", opt_.gpu_memory_utilization});
  if (opt_.enforce_eager) argv.push_back("--enforce-eager");
  if (opt_.kv_cache_dtype != "auto") argv.insert(argv.end(), {"--kv-cache-dtype", opt_.kv_cache_dtype});
  if (!opt_.bench_draft_acceptance.empty()) argv.push_back("--bench-simulated-acceptance");
  return argv;
}

std::vector<std::string> LocalMesh::WithCredentials(std::vector<std::string> argv) const {
  for (auto& a : MeshCredentialArgs(opt_.credentials)) argv.push_back(std::move(a));
  return argv;
}

namespace {

// Whether something accepts TCP connections on 127.0.0.1:port.
bool Listening(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a = Loopback(port);
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  close(fd);
  return ok;
}

// Whether `pid` (a child) has exited, leaving it to be reaped by whoever waits for it.
bool Exited(pid_t pid) {
  siginfo_t info{};
  return waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid;
}

}  // namespace

void LocalMesh::StartCoordinator() {
  for (int attempt = 1;; ++attempt) {
    std::vector<std::string> c = {opt_.coordinator_bin, "--listen", coordinator_address(), "--world",
                                  std::to_string(opt_.world), "--model", opt_.model_dir};
    c.insert(c.end(), opt_.coordinator_args.begin(), opt_.coordinator_args.end());
    if (!opt_.bench_draft_acceptance.empty())
      c.insert(c.end(), {"--bench-draft-acceptance", opt_.bench_draft_acceptance});
    c = WithCredentials(std::move(c));
    const pid_t pid = Spawn("coordinator", c);
    bool exited = false;
    for (int i = 0; i < 1500 && !(exited = Exited(pid)) && !Listening(opt_.coordinator_port); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (!exited || !port_chosen_here_ || attempt == 3) {
      children_.push_back({"coordinator", pid, c});  // (one that exited is found by WaitAny / PollExited)
      return;
    }
    waitpid(pid, nullptr, 0);
    const int taken = opt_.coordinator_port;
    opt_.coordinator_port = FreePort();
    std::fprintf(stderr, "dsmesh: the coordinator could not listen on port %d (taken since it was chosen); "
                         "starting it on port %d\n", taken, opt_.coordinator_port);
  }
}

void LocalMesh::Start() {
  StartCoordinator();
  for (int r = 0; r < opt_.world; ++r) {
    auto w = WithCredentials(WorkerArgv(r));
    children_.push_back({"worker" + std::to_string(r), Spawn("worker" + std::to_string(r), w), w});
  }
  if (!opt_.gateway_bin.empty()) {
    std::vector<std::string> g = {opt_.gateway_bin, "--listen", "127.0.0.1:" + std::to_string(opt_.gateway_port),
                                  "--coordinator", coordinator_address(), "--model", opt_.model_dir};
    g.insert(g.end(), opt_.gateway_args.begin(), opt_.gateway_args.end());
    g = WithCredentials(std::move(g));
    children_.push_back({"gateway", Spawn("gateway", g), g});
  }
}

std::string LocalMesh::WaitAny(int* status) {
  while (true) {
    bool any = false;
    for (auto& ch : children_) any |= ch.pid > 0;
    if (!any) {
      *status = -1;
      return "";
    }
    pid_t pid = waitpid(-1, status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      *status = -1;
      return "";
    }
    for (auto& ch : children_)
      if (ch.pid == pid) {
        ch.pid = -1;
        return ch.name;
      }
  }
}

std::string LocalMesh::PollExited(int* status) {
  for (auto& ch : children_) {
    if (ch.pid <= 0) continue;
    if (waitpid(ch.pid, status, WNOHANG) == ch.pid) {
      ch.pid = -1;
      return ch.name;
    }
  }
  return "";
}

void LocalMesh::Stop(int grace_s) {
  // In stages, so a drain is clean: the gateway stops taking requests, then the coordinator drains and
  // tells the workers to exit, then any worker still running is terminated. SIGKILL after `grace_s`.
  auto stage = [&](const std::function<bool(const Child&)>& pick) {
    std::vector<Child*> group;
    for (auto& ch : children_)
      if (ch.pid > 0 && pick(ch)) group.push_back(&ch);
    for (Child* ch : group) kill(ch->pid, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(grace_s);
    for (Child* ch : group) {
      while (ch->pid > 0) {
        int st = 0;
        pid_t r = waitpid(ch->pid, &st, WNOHANG);
        if (r == ch->pid || r < 0) {
          ch->pid = -1;
          break;
        }
        if (std::chrono::steady_clock::now() > deadline) {
          std::fprintf(stderr, "dsmesh: %s did not stop within %d s; killing it\n", ch->name.c_str(), grace_s);
          kill(ch->pid, SIGKILL);
          waitpid(ch->pid, &st, 0);
          ch->pid = -1;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
  };
  stage([](const Child& c) { return c.name == "gateway"; });
  stage([](const Child& c) { return c.name == "coordinator"; });
  // Workers told to drain exit by themselves; give them a moment before SIGTERM.
  const auto settle = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  for (auto& ch : children_) {
    while (ch.pid > 0 && std::chrono::steady_clock::now() < settle) {
      int st = 0;
      if (waitpid(ch.pid, &st, WNOHANG) == ch.pid) ch.pid = -1;
      else std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  stage([](const Child&) { return true; });
}

void LocalMesh::KillWorker(int rank, int sig) {
  Child& ch = children_.at(1 + rank);
  if (ch.pid <= 0) return;
  kill(ch.pid, sig);
  if (sig == SIGKILL || sig == SIGTERM) {
    int st = 0;
    waitpid(ch.pid, &st, 0);
    ch.pid = -1;
  }
}

void LocalMesh::StartWorker(int rank) { StartChild(children_.at(1 + rank).name); }

Child& LocalMesh::Find(const std::string& name) {
  for (auto& ch : children_)
    if (ch.name == name) return ch;
  throw std::runtime_error("no child named " + name);
}

void LocalMesh::StartChild(const std::string& name) {
  Child& ch = Find(name);
  if (ch.pid > 0) throw std::runtime_error(ch.name + " is still running");
  ch.pid = Spawn(ch.name, ch.argv);
}

pid_t LocalMesh::pid(const std::string& name) const {
  for (const auto& ch : children_)
    if (ch.name == name) return ch.pid;
  return -1;
}

std::vector<std::string> LocalMesh::ChildNames() const {
  std::vector<std::string> names = {"coordinator"};
  for (int r = 0; r < opt_.world; ++r) names.push_back("worker" + std::to_string(r));
  if (!opt_.gateway_bin.empty()) names.push_back("gateway");
  return names;
}

std::string LocalMesh::log_path(const std::string& name) const {
  return opt_.log_dir.empty() ? "" : opt_.log_dir + "/" + name + ".log";
}

int LocalMesh::WaitExit(const std::string& name, int timeout_s) {
  for (auto& ch : children_) {
    if (ch.name != name || ch.pid <= 0) continue;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    while (std::chrono::steady_clock::now() < deadline) {
      int st = 0;
      if (waitpid(ch.pid, &st, WNOHANG) == ch.pid) {
        ch.pid = -1;
        return st;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  return -1;
}

pid_t LocalMesh::worker_pid(int rank) const { return children_.at(1 + rank).pid; }

}  // namespace dsmesh
