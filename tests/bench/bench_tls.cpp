// spes bench tls — what per-node certificates cost: a fresh TLS connection plus one call, and one
// call on an open connection, to a node's sync service on loopback, with one certificate shared by
// every node (scripts/make_test_ca.sh, RSA 2048) and with per-node certificates (spes ca, EC P-256,
// every call bound to the caller's certificate). Both in the same process, alternating.
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "../../src/cli/commands.h"
#include "../../src/sync/round_store.h"
#include "../../src/sync/transport.h"
#include "spes/sync/identity.h"
#include "spes/util/error.h"
#include "spes/util/fs.h"
#include "spes/util/log.h"
#include "spes/v1/sync.grpc.pb.h"

namespace spes::cli {
namespace {
using sync_detail::TransportSettings;
using Clock = std::chrono::steady_clock;

struct TlsBenchOptions {
  int connections = 200;
  std::string log_level = "warn";
};

struct Kind {
  std::string name;
  TransportSettings server, client;  // the node serving (node 0) and the one calling (node 1)
};

// One Fetch for a round the server does not hold (answered at once, after the checks) on `stub`.
void call(spes::v1::SyncService::Stub& stub) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  ctx.AddMetadata(sync_detail::kTokenHeader, "bench");
  spes::v1::FetchRequest req;
  req.set_run_id("bench");
  req.set_round(5);
  req.set_part(spes::v1::EXPERTS);
  req.set_requester(1);
  auto reader = stub.Fetch(&ctx, req);
  spes::v1::TensorChunk chunk;
  while (reader->Read(&chunk)) {
  }
  const auto status = reader->Finish();
  if (status.error_code() != grpc::StatusCode::OUT_OF_RANGE)
    raise(ErrorKind::Internal, "bench call answered {} ({}), expected OUT_OF_RANGE", static_cast<int>(status.error_code()),
          status.error_message());
}

std::unique_ptr<spes::v1::SyncService::Stub> connect(const TransportSettings& s, int port) {
  auto channel = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port), sync_detail::channel_credentials(s),
                                           sync_detail::channel_arguments(s, node_holder_name(0)));
  return spes::v1::SyncService::NewStub(channel);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

TransportSettings settings(const std::string& ca, const std::string& cert, const std::string& key) {
  TransportSettings s;
  s.ca_pem = ca;
  s.cert_pem = cert;
  s.key_pem = key;
  s.identity = certificate_identity(cert);
  s.token = "bench";
  s.run_id = "bench";
  s.requesters = {0, 1};
  return s;
}

void run_tls_bench(const TlsBenchOptions& o) {
  init_logging(o.log_level);
  std::vector<Kind> kinds;
  const std::string dir = (std::filesystem::temp_directory_path() / "spes-bench-tls").string();
  std::filesystem::remove_all(dir);
  if (std::filesystem::exists("scripts/make_test_ca.sh") &&
      std::system(("bash scripts/make_test_ca.sh " + dir + "/shared >/dev/null").c_str()) == 0) {
    const auto s = settings(read_file(dir + "/shared/ca.pem"), read_file(dir + "/shared/node.pem"),
                            read_file(dir + "/shared/node.key"));
    kinds.push_back({"shared certificate (RSA 2048)", s, s});
  } else {
    std::printf("(scripts/make_test_ca.sh not found from here: only per-node certificates measured; run from the "
                "source folder)\n");
  }
  const PemPair ca = make_run_ca("bench", 1);
  const PemPair n0 = issue_certificate(ca, node_holder_name(0), {"127.0.0.1"}, 1);
  const PemPair n1 = issue_certificate(ca, node_holder_name(1), {"127.0.0.1"}, 1);
  kinds.push_back({"per-node certificates (EC P-256, bound)", settings(ca.cert_pem, n0.cert_pem, n0.key_pem),
                   settings(ca.cert_pem, n1.cert_pem, n1.key_pem)});

  std::vector<std::unique_ptr<sync_detail::RoundStore>> stores;
  std::vector<std::unique_ptr<sync_detail::SyncServer>> servers;
  for (const auto& k : kinds) {
    stores.push_back(std::make_unique<sync_detail::RoundStore>(1));
    servers.push_back(std::make_unique<sync_detail::SyncServer>(k.server, *stores.back()));
    servers.back()->start("127.0.0.1:0");
  }
  std::vector<std::vector<double>> fresh(kinds.size()), warm(kinds.size());
  std::vector<std::unique_ptr<spes::v1::SyncService::Stub>> open(kinds.size());
  for (std::size_t k = 0; k < kinds.size(); ++k) {
    open[k] = connect(kinds[k].client, servers[k]->port());
    call(*open[k]);
  }
  for (int i = 0; i < o.connections; ++i)
    for (std::size_t k = 0; k < kinds.size(); ++k) {  // alternating: both see the same machine load
      auto t0 = Clock::now();
      auto stub = connect(kinds[k].client, servers[k]->port());
      call(*stub);
      fresh[k].push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      t0 = Clock::now();
      call(*open[k]);
      warm[k].push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
  std::printf("TLS on loopback, %d connections each (median ms):\n", o.connections);
  std::printf("  %-42s %12s %14s %12s\n", "credentials", "new conn+call", "call on open", "cert bytes");
  for (std::size_t k = 0; k < kinds.size(); ++k)
    std::printf("  %-42s %12.2f %14.3f %12zu\n", kinds[k].name.c_str(), median(fresh[k]), median(warm[k]),
                kinds[k].client.cert_pem.size());
  std::printf("A node opens one connection per peer per plan (not per round): a round of N nodes costs no handshake\n"
              "after the plan's first; the per-call check (the caller's certificate against its node id) is in the\n"
              "'call on open' column.\n");
  for (auto& s : servers) s->stop();
  std::filesystem::remove_all(dir);
}

}  // namespace

void add_bench_tls(CLI::App& bench) {
  auto* cmd = bench.add_subcommand("tls", "TLS cost: shared certificate vs per-node certificates (loopback)");
  auto o = std::make_shared<TlsBenchOptions>();
  cmd->add_option("--connections", o->connections, "fresh connections per kind")->check(CLI::PositiveNumber);
  cmd->add_option("--log-level", o->log_level, "trace, debug, info, warn or error");
  cmd->callback([o] { run_tls_bench(*o); });
}

}  // namespace spes::cli
