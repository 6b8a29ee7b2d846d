// The gRPC side of the sync module: credentials, the SyncService server and the client calls.
// Internal to the sync module (gRPC types stay out of public headers).
#pragma once

#include <grpcpp/grpcpp.h>

#include <array>
#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <memory>
#include <string>

#include "payload.h"
#include "round_store.h"
#include "spes/config/config.h"
#include "spes/sync/identity.h"
#include "spes/util/log.h"
#include "spes/v1/sync.grpc.pb.h"

namespace spes::sync_detail {

inline constexpr const char* kTokenHeader = "x-spes-token";
// Requests are tiny; anything bigger is refused by gRPC with RESOURCE_EXHAUSTED.
inline constexpr int kMaxRequestBytes = 64 << 10;
// HTTP/2 keepalive on peer channels: a link that goes silent mid-transfer (a black-holed route, a
// peer frozen) is found within kKeepaliveTimeMs + kKeepaliveTimeoutMs, not after TCP's
// retransmission timeout of many minutes; the call then fails and the fetch resumes.
inline constexpr int kKeepaliveTimeMs = 10'000;
inline constexpr int kKeepaliveTimeoutMs = 20'000;

struct TransportSettings {
  bool insecure = false;
  std::string ca_pem, cert_pem, key_pem;  // PEM text, not paths
  // This process's identity from its certificate (`spes ca`); empty for a shared certificate or
  // without TLS. With one, every call is bound to the caller's certificate and every connection
  // checks that the server is the holder it should be (docs/security.md).
  CertIdentity identity;
  std::string token;
  std::string run_id;
  int node_id = 0;
  int n_nodes = 1;
  std::uint64_t plan = 0;  // membership plan version (0 = static peers)
  std::vector<std::uint32_t> requesters;  // node ids allowed to fetch (the plan's members and observers)
  std::int64_t chunk_bytes = 4 << 20;
  double max_wait_s = 600;  // longest a Fetch waits for a round the server has not reached
};

// Constant-time comparison so the token cannot be guessed byte by byte from timings.
bool same_token(const std::string& a, std::string_view b);
// True when the call carries `token` in the kTokenHeader metadata.
bool has_token(const grpc::ServerContext& context, const std::string& token);

// Reads the TLS files and the run token (a token file's text trimmed) of `c`: Error(Config)
// naming the file and, through `where`, the key (prefix + "tls.ca", prefix + "token_file", ...).
TransportSettings read_credential_files(const Credentials& c, const std::function<std::string(const std::string&)>& where,
                                        const std::string& prefix);
// The node's settings: its credentials (keys under sync.), run id, node and peer count. A
// certificate with an identity must be this node's of this run (Error(Config) naming sync.tls.cert).
TransportSettings transport_settings(const Config& config);

// "INSECURE plaintext", "TLS, one certificate shared by every node" or "TLS as node 3 of run 'x'".
std::string security_name(const TransportSettings& s);
// The identity a call's client certificate carries (empty: no certificate or none with an identity).
CertIdentity caller_identity(const grpc::ServerContext& context);
// Why `caller` may not speak as `claimed` (a holder name, e.g. "node-3") in run `s.run_id`, or ""
// when it may. Without per-node certificates (s.identity empty) anyone holding the token may.
std::string identity_mismatch(const TransportSettings& s, const grpc::ServerContext& context, const std::string& claimed);

std::shared_ptr<grpc::ServerCredentials> server_credentials(const TransportSettings& s);
std::shared_ptr<grpc::ChannelCredentials> channel_credentials(const TransportSettings& s);
// Channel arguments: receive limit sized for one chunk. With per-node certificates the server must
// present `server_holder`'s certificate (its DNS name <holder>.spes is the TLS target name).
grpc::ChannelArguments channel_arguments(const TransportSettings& s, const std::string& server_holder);

class SyncServer {
 public:
  SyncServer(TransportSettings settings, RoundStore& store);
  ~SyncServer();
  // Binds and starts serving; throws Error(Io) naming the address when it cannot bind.
  void start(const std::string& listen_address);
  void stop();
  int port() const { return port_; }
  std::uint64_t bytes_sent() const { return bytes_sent_.load(); }
  std::uint64_t calls_refused() const { return refused_.load(); }
  // The refused calls that only a hostile or misconfigured caller provokes (token, run, arguments).
  const RefusalLog& suspicious_calls() const { return suspicious_; }
  // Payload bytes sent so far, per requesting node id.
  std::map<std::uint32_t, std::uint64_t> bytes_sent_by_requester() const;
  // Payload bytes sent so far, by spes.v1.Encoding value (index).
  std::array<std::uint64_t, kWireEncodings> bytes_sent_by_encoding() const;

 private:
  class Service;
  TransportSettings settings_;
  RoundStore& store_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::atomic<std::uint64_t> bytes_sent_{0}, refused_{0};
  RefusalLog suspicious_;
  std::array<std::atomic<std::uint64_t>, kWireEncodings> sent_by_encoding_{};
  mutable std::mutex sent_mutex_;
  std::map<std::uint32_t, std::uint64_t> sent_to_;
};

}  // namespace spes::sync_detail
