#include "common/mesh/mesh_credentials.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>

#include <grpcpp/support/client_interceptor.h>

namespace dsmesh {
namespace {

std::string FlagOrEnv(const Flags& f, const char* flag, const char* env) {
  if (f.Has(flag)) return f.Get(flag);
  const char* v = std::getenv(env);
  return v ? v : "";
}

std::string ReadPem(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("--" + flag + " " + path + ": cannot read");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Adds the token to the initial metadata of every call on the channel.
class TokenInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(const std::string* token) : token_(token) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA))
      methods->GetSendInitialMetadata()->insert({kMeshTokenMetadataKey, *token_});
    methods->Proceed();
  }

 private:
  const std::string* token_;
};

class TokenInterceptorFactory : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(std::string token) : token_(std::move(token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(grpc::experimental::ClientRpcInfo*) override {
    return new TokenInterceptor(&token_);
  }

 private:
  const std::string token_;  // lives as long as the channel, which owns the factory
};

std::mutex g_mu;
MeshCredentials g_process;

}  // namespace

std::set<std::string> WithMeshCredentialFlags(std::set<std::string> known) {
  known.insert({"mesh-token-file", "tls-cert", "tls-key", "tls-ca"});
  return known;
}

std::string ReadMeshTokenFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw UsageError("--mesh-token-file " + path + ": cannot read");
  std::string line;
  std::getline(in, line);
  const auto b = line.find_first_not_of(" \t\r\n");
  const auto e = line.find_last_not_of(" \t\r\n");
  if (b == std::string::npos) throw UsageError("--mesh-token-file " + path + ": empty (the first line is the token)");
  struct stat st {};
  if (stat(path.c_str(), &st) == 0 && (st.st_mode & 077))
    std::fprintf(stderr, "warning: mesh token file %s is readable by other users (chmod 600 it)\n", path.c_str());
  return line.substr(b, e - b + 1);
}

MeshCredentials MeshCredentialsFromFlags(const Flags& f) {
  MeshCredentials c;
  c.token_file = FlagOrEnv(f, "mesh-token-file", kMeshTokenFileEnv);
  if (!c.token_file.empty()) c.token = ReadMeshTokenFile(c.token_file);
  c.tls_cert = FlagOrEnv(f, "tls-cert", "DSMESH_TLS_CERT");
  c.tls_key = FlagOrEnv(f, "tls-key", "DSMESH_TLS_KEY");
  c.tls_ca = FlagOrEnv(f, "tls-ca", "DSMESH_TLS_CA");
  const int given = !c.tls_cert.empty() + !c.tls_key.empty() + !c.tls_ca.empty();
  if (given != 0 && given != 3) throw UsageError("--tls-cert, --tls-key and --tls-ca go together: give all three or none");
  return c;
}

std::string RandomMeshToken() {
  unsigned char bytes[32];
  {
    std::ifstream urandom("/dev/urandom", std::ios::binary);
    if (!urandom.read(reinterpret_cast<char*>(bytes), sizeof bytes))
      throw std::runtime_error("cannot read /dev/urandom for a mesh token");
  }
  static const char* hex = "0123456789abcdef";
  std::string token;
  for (unsigned char b : bytes) {
    token.push_back(hex[b >> 4]);
    token.push_back(hex[b & 15]);
  }
  return token;
}

void WriteMeshTokenFile(const std::string& path, const std::string& token) {
  unlink(path.c_str());  // a fresh file, so the mode below holds whatever was there
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) throw std::runtime_error("cannot create the mesh token file " + path);
  const std::string line = token + "\n";
  const bool ok = write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  close(fd);
  if (!ok) throw std::runtime_error("cannot write the mesh token file " + path);
}

std::vector<std::string> MeshCredentialArgs(const MeshCredentials& c) {
  std::vector<std::string> args;
  if (!c.token_file.empty()) args.insert(args.end(), {"--mesh-token-file", c.token_file});
  if (c.tls()) args.insert(args.end(), {"--tls-cert", c.tls_cert, "--tls-key", c.tls_key, "--tls-ca", c.tls_ca});
  return args;
}

MeshCredentials ProcessMeshCredentials() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_process;
}

void SetProcessMeshCredentials(MeshCredentials c) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_process = std::move(c);
}

std::shared_ptr<grpc::Channel> MeshChannel(const std::string& address, const grpc::ChannelArguments& args,
                                           const MeshCredentials& c) {
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (c.tls()) {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = ReadPem("tls-ca", c.tls_ca);
    o.pem_private_key = ReadPem("tls-key", c.tls_key);
    o.pem_cert_chain = ReadPem("tls-cert", c.tls_cert);
    creds = grpc::SslCredentials(o);
  }
  if (c.token.empty()) return grpc::CreateCustomChannel(address, creds, args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<TokenInterceptorFactory>(c.token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, creds, args, std::move(interceptors));
}

std::shared_ptr<grpc::ServerCredentials> MeshServerCredentials(const MeshCredentials& c) {
  if (!c.tls()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions o(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  o.pem_root_certs = ReadPem("tls-ca", c.tls_ca);
  o.pem_key_cert_pairs.push_back({ReadPem("tls-key", c.tls_key), ReadPem("tls-cert", c.tls_cert)});
  return grpc::SslServerCredentials(o);
}

}  // namespace dsmesh
