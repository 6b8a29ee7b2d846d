#include "transport.h"

#include <grpcpp/health_check_service_interface.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <unordered_map>

#include "spes/config/config.h"
#include "spes/util/error.h"
#include "spes/util/failpoint.h"
#include "spes/util/fs.h"

namespace spes::sync_detail {
namespace {

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  std::size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

}  // namespace

bool same_token(const std::string& a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

bool has_token(const grpc::ServerContext& context, const std::string& token) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kTokenHeader);
  return it != metadata.end() && same_token(token, std::string_view(it->second.data(), it->second.size()));
}

TransportSettings read_credential_files(const Credentials& c, const std::function<std::string(const std::string&)>& where,
                                        const std::string& prefix) {
  auto read = [&](const std::string& key, const std::string& path) {
    try {
      return read_file(path);
    } catch (const Error& e) {
      raise(ErrorKind::Config, "{}: cannot read '{}': {}", where(prefix + key), path, e.what());
    }
  };
  TransportSettings s;
  s.insecure = c.insecure;
  if (!c.insecure) {
    s.ca_pem = read("tls.ca", c.tls_ca);
    s.cert_pem = read("tls.cert", c.tls_cert);
    s.key_pem = read("tls.key", c.tls_key);
    auto label = [&](const std::string& key, const std::string& path) { return where(prefix + key) + " ('" + path + "')"; };
    s.identity = verify_credentials(s.ca_pem, s.cert_pem, s.key_pem,
                                    {label("tls.ca", c.tls_ca), label("tls.cert", c.tls_cert), label("tls.key", c.tls_key)});
  }
  s.token = c.token.empty() ? trim(read("token_file", c.token_file)) : c.token;
  if (s.token.empty()) raise(ErrorKind::Config, "{}: the run token is empty", where(prefix + "token_file"));
  return s;
}

TransportSettings transport_settings(const Config& c) {
  TransportSettings s = read_credential_files(c.sync, [&c](const std::string& key) { return c.where(key); }, "sync.");
  s.run_id = c.sync.effective_run_id(c.run);
  s.node_id = c.run.node_id;
  if (!s.identity.empty() && (s.identity.run != s.run_id || s.identity.node != c.run.node_id))
    raise(ErrorKind::Config, "{}: '{}' is the certificate of {}; this is node {} of run '{}' (issue one with `spes ca "
          "issue --node {}`)", c.where("sync.tls.cert"), c.sync.tls_cert, s.identity.describe(), c.run.node_id, s.run_id,
          c.run.node_id);
  for (const auto& p : c.sync.peers) s.requesters.push_back(static_cast<std::uint32_t>(p.id));
  s.n_nodes = static_cast<int>(c.sync.peers.size());
  s.chunk_bytes = c.sync.chunk_bytes;
  s.max_wait_s = c.sync.round_timeout_s;
  return s;
}

std::shared_ptr<grpc::ServerCredentials> server_credentials(const TransportSettings& s) {
  if (s.insecure) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = s.ca_pem;
  options.pem_key_cert_pairs.push_back({s.key_pem, s.cert_pem});
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> channel_credentials(const TransportSettings& s) {
  if (s.insecure) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = s.ca_pem;
  options.pem_private_key = s.key_pem;
  options.pem_cert_chain = s.cert_pem;
  return grpc::SslCredentials(options);
}

CertIdentity caller_identity(const grpc::ServerContext& context) {
  const auto auth = context.auth_context();
  if (!auth) return {};
  const auto pem = auth->FindPropertyValues("x509_pem_cert");
  if (pem.empty()) return {};
  // Parsed once per certificate: every call of a round asks again (spes bench tls).
  static std::mutex mutex;
  static std::unordered_map<std::string, CertIdentity> known;
  std::string text(pem.front().data(), pem.front().size());
  std::lock_guard lock(mutex);
  if (auto it = known.find(text); it != known.end()) return it->second;
  CertIdentity id;
  try {
    id = certificate_identity(text);
  } catch (const Error&) {
  }
  if (known.size() >= 1024) known.clear();  // bounded, whatever callers present
  known.emplace(std::move(text), id);
  return id;
}

std::string identity_mismatch(const TransportSettings& s, const grpc::ServerContext& context, const std::string& claimed) {
  if (s.identity.empty()) return {};
  const CertIdentity caller = caller_identity(context);
  if (caller.run == s.run_id && caller.name == claimed) return {};
  return "the caller's certificate is that of " + caller.describe() + ": it may not speak as " + claimed;
}

std::string security_name(const TransportSettings& s) {
  if (s.insecure) return "INSECURE plaintext";
  if (s.identity.empty()) return "TLS, one certificate shared by every node";
  return "TLS as " + s.identity.describe();
}

grpc::ChannelArguments channel_arguments(const TransportSettings& s, const std::string& server_holder) {
  grpc::ChannelArguments args;
  if (!s.identity.empty()) args.SetSslTargetNameOverride(holder_dns_name(server_holder));
  args.SetMaxReceiveMessageSize(static_cast<int>(s.chunk_bytes) + (1 << 20));
  args.SetMaxSendMessageSize(kMaxRequestBytes);
  // A fresh connection per peer: several nodes on one host must not share one subchannel.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // After a failed connect gRPC fails calls fast until its reconnect backoff (1 s at first, up
  // to 120 s) expires; our own retries (sync.retry_backoff_s, sync.peer_wait_s) decide instead.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  return args;
}

class SyncServer::Service final : public spes::v1::SyncService::Service {
 public:
  explicit Service(SyncServer& owner) : owner_(owner) {}

  grpc::Status Fetch(grpc::ServerContext* context, const spes::v1::FetchRequest* request,
                     grpc::ServerWriter<spes::v1::TensorChunk>* writer) override {
    const TransportSettings& s = owner_.settings_;
    // Every refusal is counted (Prometheus); those that only a hostile or misconfigured caller
    // provokes (token, run, arguments) also go to the refusal log that `coordinator status` shows.
    // A plan or round the caller is not at yet is part of normal operation and logged at debug.
    auto refuse = [&](grpc::StatusCode code, const std::string& why) {
      owner_.refused_++;
      const std::string who = fmt::format("sync: refused a call from {} (node {})", context->peer(), request->requester());
      const bool suspicious = code == grpc::StatusCode::UNAUTHENTICATED || code == grpc::StatusCode::INVALID_ARGUMENT ||
                              code == grpc::StatusCode::PERMISSION_DENIED || request->run_id() != s.run_id;
      if (suspicious)
        owner_.suspicious_.record(who, why);
      else
        spdlog::debug("{}: {}", who, why);
      return grpc::Status(code, why);
    };
    if (!has_token(*context, s.token))
      return refuse(grpc::StatusCode::UNAUTHENTICATED, "missing or wrong run token");
    if (const auto why = identity_mismatch(s, *context, node_holder_name(static_cast<int>(request->requester())));
        !why.empty())
      return refuse(grpc::StatusCode::UNAUTHENTICATED, why);
    if (request->run_id() != s.run_id)
      return refuse(grpc::StatusCode::FAILED_PRECONDITION,
                    "this node serves run '" + s.run_id + "', not '" + request->run_id() + "'");
    if (request->plan() > s.plan)
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "this node is still on plan " + std::to_string(s.plan) +
                                                             " (switching to plan " + std::to_string(request->plan()) + ")");
    if (request->plan() < s.plan)
      return refuse(grpc::StatusCode::FAILED_PRECONDITION, "this node runs plan " + std::to_string(s.plan) +
                                                               ", not plan " + std::to_string(request->plan()));
    // A node removed from the plan (or never in it) gets nothing from the plan's members.
    if (!s.requesters.empty() &&
        std::find(s.requesters.begin(), s.requesters.end(), request->requester()) == s.requesters.end())
      return refuse(grpc::StatusCode::PERMISSION_DENIED,
                    "node " + std::to_string(request->requester()) + " is not in plan " + std::to_string(s.plan));
    const auto part = request->part();
    if (part != spes::v1::EXPERTS && part != spes::v1::SHARED_RAW && part != spes::v1::SHARED_AVERAGED)
      return refuse(grpc::StatusCode::INVALID_ARGUMENT, "unknown part");
    if (part != spes::v1::EXPERTS && request->slice() >= static_cast<std::uint32_t>(s.n_nodes))
      return refuse(grpc::StatusCode::INVALID_ARGUMENT, "no such slice");
    if (part == spes::v1::SHARED_AVERAGED && request->slice() != static_cast<std::uint32_t>(s.node_id))
      return refuse(grpc::StatusCode::INVALID_ARGUMENT, "this node aggregates slice " + std::to_string(s.node_id));

    auto deadline = std::chrono::steady_clock::now() +
                    std::chrono::milliseconds(static_cast<std::int64_t>(s.max_wait_s * 1000));
    StreamPtr stream;
    auto found = owner_.store_.get(request->round(), part, request->slice(), deadline,
                                   [context] { return context->IsCancelled(); }, stream);
    switch (found) {
      case RoundStore::Lookup::Ok: break;
      case RoundStore::Lookup::Gone:
        return refuse(grpc::StatusCode::NOT_FOUND, "round " + std::to_string(request->round()) + " is no longer held");
      case RoundStore::Lookup::TooFar:
        return refuse(grpc::StatusCode::OUT_OF_RANGE, "unknown round " + std::to_string(request->round()) +
                                                          " (this node is at round " +
                                                          std::to_string(owner_.store_.latest()) + ")");
      case RoundStore::Lookup::NoSuchSlice: return refuse(grpc::StatusCode::INVALID_ARGUMENT, "no such slice");
      case RoundStore::Lookup::Timeout:
        return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "round not reached in time");
      case RoundStore::Lookup::Closed: return grpc::Status(grpc::StatusCode::UNAVAILABLE, "node is shutting down");
      case RoundStore::Lookup::Cancelled: return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    }
    stream = stream_for(stream, request->baseline_round());
    const std::size_t first = request->first_chunk();
    if (first > 0 && first >= stream->chunks.size())
      return refuse(grpc::StatusCode::INVALID_ARGUMENT, "first chunk " + std::to_string(first) + " of a stream of " +
                                                            std::to_string(stream->chunks.size()));
    std::uint64_t sent = 0, due = 0;
    for (std::size_t c = first; c < stream->chunks.size(); ++c) due += stream->chunks[c].ByteSizeLong();
    for (std::size_t c = first; c < stream->chunks.size(); ++c) {
      const auto& chunk = stream->chunks[c];
      const bool written = writer->Write(chunk);
      if (!written) break;
      sent += chunk.ByteSizeLong();
      if (const auto e = static_cast<std::size_t>(chunk.piece().encoding()); e < owner_.sent_by_encoding_.size())
        owner_.sent_by_encoding_[e] += chunk.ByteSizeLong();
      if (c == stream->chunks.size() / 2) failpoint("serve");
    }
    owner_.bytes_sent_ += sent;
    {
      std::lock_guard lock(owner_.sent_mutex_);
      owner_.sent_to_[request->requester()] += sent;
    }
    if (sent < due) return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
    owner_.store_.count_served(request->round(), {request->requester(), part, request->slice()});
    return grpc::Status::OK;
  }

 private:
  SyncServer& owner_;
};

SyncServer::SyncServer(TransportSettings settings, RoundStore& store)
    : settings_(std::move(settings)), store_(store), service_(std::make_unique<Service>(*this)) {}

SyncServer::~SyncServer() { stop(); }

std::map<std::uint32_t, std::uint64_t> SyncServer::bytes_sent_by_requester() const {
  std::lock_guard lock(sent_mutex_);
  return sent_to_;
}

std::array<std::uint64_t, kWireEncodings> SyncServer::bytes_sent_by_encoding() const {
  std::array<std::uint64_t, kWireEncodings> out{};
  for (std::size_t e = 0; e < out.size(); ++e) out[e] = sent_by_encoding_[e].load();
  return out;
}

void SyncServer::start(const std::string& listen_address) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen_address, server_credentials(settings_), &port_);
  builder.SetMaxReceiveMessageSize(kMaxRequestBytes);
  builder.SetMaxSendMessageSize(static_cast<int>(settings_.chunk_bytes) + (1 << 20));
  // Accept the peers' keepalive pings (gRPC's default would answer pings more often than every
  // 5 minutes with GOAWAY "too_many_pings").
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, kKeepaliveTimeMs / 2);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  if (!server_ || port_ == 0)
    raise(ErrorKind::Io, "cannot listen on {} for the sync service (address in use or not local?)", listen_address);
}

void SyncServer::stop() {
  if (!server_) return;
  store_.close();  // calls waiting for a round return at once; streams being written get time to finish
  // (a stream counted as served may still sit in buffers when finish() returns)
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(10));
  server_->Wait();
  server_.reset();
}

}  // namespace spes::sync_detail
