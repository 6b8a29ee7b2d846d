// A node pulling from a hostile or broken peer: a fake SyncService written against the proto sits
// where node 1 should be. It forwards each call to the real node 1 and tampers with what comes
// back (or answers nothing, or too much). The victim (node 0) must skip node 1 with the reason,
// keep every weight as it was, and go on. Also: garbage bytes and hundreds of idle connections on
// a node's port do not stop a round.
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <thread>

#include "../../src/sync/compression.h"
#include "../../src/sync/transport.h"
#include "spes/sync/codec.h"
#include "spes/sync/engine.h"
#include "spes/v1/sync.grpc.pb.h"
#include "sync_fixture.h"

namespace spes {
namespace {
using test::FakeModel;

// Rewrites the float values of an fp32 piece and fixes its checksum, so that only the values
// are wrong.
void edit_floats(spes::v1::TensorChunk& c, const std::function<float(float)>& f) {
  if (!c.has_piece() || c.piece().encoding() != spes::v1::FP32) return;
  std::string data = c.piece().data();
  for (std::size_t i = 0; i + 4 <= data.size(); i += 4) {
    float v;
    std::memcpy(&v, data.data() + i, 4);
    v = f(v);
    std::memcpy(data.data() + i, &v, 4);
  }
  c.mutable_piece()->set_crc32(crc32_of(data.data(), data.size()));
  c.mutable_piece()->set_data(std::move(data));
}

// What the fake peer does to a stream: edit each chunk (return false to drop it), or replace the
// whole answer (`answer`, when set: it gets the server context and the writer).
struct Tamper {
  std::string name;
  std::string reason;  // expected in the victim's skip reason
  std::function<bool(spes::v1::TensorChunk&, std::uint32_t index, std::uint32_t total)> chunk;
  std::function<grpc::Status(grpc::ServerContext*, grpc::ServerWriter<spes::v1::TensorChunk>*)> answer;
};

class FakePeer final : public spes::v1::SyncService::Service {
 public:
  FakePeer(int real_port, Tamper tamper) : tamper_(std::move(tamper)) {
    stub_ = spes::v1::SyncService::NewStub(
        grpc::CreateChannel(fmt::format("127.0.0.1:{}", real_port), grpc::InsecureChannelCredentials()));
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~FakePeer() override { server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2)); }
  int port() const { return port_; }

  grpc::Status Fetch(grpc::ServerContext* context, const spes::v1::FetchRequest* request,
                     grpc::ServerWriter<spes::v1::TensorChunk>* writer) override {
    if (tamper_.answer) return tamper_.answer(context, writer);
    grpc::ClientContext upstream;
    for (const auto& [key, value] : context->client_metadata())
      if (key == sync_detail::kTokenHeader) upstream.AddMetadata(std::string(key.data(), key.size()), std::string(value.data(), value.size()));
    auto reader = stub_->Fetch(&upstream, *request);
    spes::v1::TensorChunk chunk;
    while (reader->Read(&chunk)) {
      if (tamper_.chunk(chunk, chunk.index(), chunk.total()) && !writer->Write(chunk)) {
        upstream.TryCancel();  // the victim hung up: do not leave node 1 writing into a full window
        break;
      }
    }
    return reader->Finish();
  }

 private:
  Tamper tamper_;
  std::unique_ptr<spes::v1::SyncService::Stub> stub_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

Config node_config(int id, const std::vector<int>& ports, double round_timeout_s) {
  // Uncompressed, so that the tampering below can edit the values in place.
  Config c = parse_config(test::node_yaml(id, ports, "  insecure: true\n  chunk_bytes: 4096\n  compression: none\n"),
                          fmt::format("node{}.yaml", id));
  c.sync.round_timeout_s = round_timeout_s;
  return c;
}

std::vector<Tamper> tampers() {
  auto each = [](std::function<void(spes::v1::TensorChunk&)> f) {
    return [f](spes::v1::TensorChunk& c, std::uint32_t, std::uint32_t) {
      f(c);
      return true;
    };
  };
  std::vector<Tamper> t;
  t.push_back({"wrong shape", "wrong shape", each([](auto& c) {
                 if (c.has_piece()) c.mutable_piece()->set_shape(0, c.piece().shape(0) + 1);
               })});
  t.push_back({"NaN values", "non-finite", each([](auto& c) { edit_floats(c, [](float) { return NAN; }); })});
  t.push_back({"Inf values", "non-finite", each([](auto& c) { edit_floats(c, [](float) { return INFINITY; }); })});
  t.push_back({"update scaled x1000", "more than sync.max_rel_change",
               each([](auto& c) { edit_floats(c, [](float v) { return v * 1000.0f; }); })});
  t.push_back({"corrupt payload", "checksum", each([](auto& c) {
                 if (c.has_piece() && !c.piece().data().empty()) (*c.mutable_piece()->mutable_data())[0] ^= 0x5a;
               })});
  // Compression: the flag on bytes that are no zstd frame, a frame of more bytes than the piece's
  // encoding takes, and a compression this node does not know.
  auto recrc = [](spes::v1::TensorPiece* p) { p->set_crc32(crc32_of(p->data().data(), p->data().size())); };
  t.push_back({"raw bytes marked zstd", "not a zstd frame", each([recrc](auto& c) {
                 if (!c.has_piece()) return;
                 c.mutable_piece()->set_compression(spes::v1::ZSTD);
                 recrc(c.mutable_piece());
               })});
  t.push_back({"zstd frame of another size", "holds a zstd frame of", each([recrc](auto& c) {
                 if (!c.has_piece()) return;
                 std::string data = c.piece().data() + std::string(4096, '\0');  // compressible whatever the values
                 ASSERT_TRUE(sync_detail::compress_payload(data, 1));
                 c.mutable_piece()->set_data(data);
                 c.mutable_piece()->set_compression(spes::v1::ZSTD);
                 recrc(c.mutable_piece());
               })});
  t.push_back({"unknown compression", "unknown compression", each([recrc](auto& c) {
                 if (!c.has_piece()) return;
                 c.mutable_piece()->set_compression(static_cast<spes::v1::Compression>(7));
                 recrc(c.mutable_piece());
               })});
  t.push_back({"wrong encoding header", "uses encoding", each([](auto& c) {
                 if (c.has_piece()) c.mutable_piece()->set_encoding(spes::v1::BF16);
               })});
  t.push_back({"unknown tensor", "was expected", each([](auto& c) {
                 if (c.has_piece()) c.mutable_piece()->set_name("model.evil.weight");
               })});
  t.push_back({"offset out of range", "not the expected next piece", each([](auto& c) {
                 if (c.has_piece()) c.mutable_piece()->set_offset(c.piece().offset() + (1u << 30));
               })});
  t.push_back({"chunk index out of range", "arrived where", each([](auto& c) { c.set_index(c.index() + 1000); })});
  t.push_back({"stale round", "chunk of round", each([](auto& c) { c.set_round(c.round() - 1); })});
  t.push_back({"another run", "chunk of run", each([](auto& c) { c.set_run_id("another-run"); })});
  t.push_back({"impersonating another node", "does not answer the request", each([](auto& c) { c.set_sender(c.sender() + 1); })});
  t.push_back({"truncated stream", "stream ended after",
               [](spes::v1::TensorChunk&, std::uint32_t index, std::uint32_t total) { return index + 1 < total || total == 1; }});
  t.push_back({"oversized message", "(8)", each([](auto& c) {
                 if (c.has_piece()) c.mutable_piece()->mutable_data()->append(std::string(8 << 20, '\0'));
               })});
  Tamper silent;
  silent.name = "never answers";
  silent.reason = "(4)";  // DEADLINE_EXCEEDED
  silent.answer = [](grpc::ServerContext* ctx, grpc::ServerWriter<spes::v1::TensorChunk>*) {
    while (!ctx->IsCancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return grpc::Status::CANCELLED;
  };
  t.push_back(silent);
  Tamper garbage_status;
  garbage_status.name = "refuses with garbage";
  garbage_status.reason = "?? not a peer (13)";  // the chunk fails to parse; control bytes never reach the log
  garbage_status.answer = [](grpc::ServerContext*, grpc::ServerWriter<spes::v1::TensorChunk>* w) {
    spes::v1::TensorChunk junk;
    junk.set_run_id(std::string(100, '\xff'));
    w->Write(junk);
    return grpc::Status(grpc::StatusCode::INTERNAL, "\x01\x02 not a peer");
  };
  t.push_back(garbage_status);
  return t;
}

TEST(SyncHostilePeer, EveryTamperingIsRefusedAndLeavesTheVictimsWeights) {
  for (const Tamper& tamper : tampers()) {
    SCOPED_TRACE(tamper.name);
    const int p0 = test::free_port(), p1 = test::free_port();
    FakeModel victim(test::kLayers, test::kExperts, test::kDim, test::kFf, test::kVocab, 100);
    FakeModel honest(test::kLayers, test::kExperts, test::kDim, test::kFf, test::kVocab, 101);
    const auto before = victim.values();
    SyncEngine real1(node_config(1, {p0, p1}, 20), honest.params);
    FakePeer fake(p1, tamper);
    // The silent peer costs the victim the whole deadline: keep it short there.
    const double timeout = tamper.answer && tamper.reason == "(4)" ? 2 : 20;
    SyncEngine e0(node_config(0, {p0, fake.port()}, timeout), victim.params);
    auto honest_round = std::async(std::launch::async, [&] { return real1.run_round(1, 1); });
    const SyncRoundReport r = e0.run_round(1, 1);
    honest_round.get();
    ASSERT_EQ(r.skipped.size(), 1u);
    EXPECT_EQ(r.skipped[0].peer, 1);
    EXPECT_NE(r.skipped[0].reason.find(tamper.reason), std::string::npos) << r.skipped[0].reason;
    // Nothing from node 1 was taken: the victim's shared mean is over itself alone, node 1's
    // experts keep their value: every weight as before.
    EXPECT_EQ(victim.values(), before);
    EXPECT_EQ(e0.skip_counts()[1], 1u);
  }
}

// A raw TCP connection to 127.0.0.1:port (-1 on failure).
int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

TEST(SyncHostilePeer, GarbageAndHundredsOfIdleConnectionsDoNotStopARound) {
  const int p0 = test::free_port(), p1 = test::free_port();
  FakeModel m0(test::kLayers, test::kExperts, test::kDim, test::kFf, test::kVocab, 100);
  FakeModel m1(test::kLayers, test::kExperts, test::kDim, test::kFf, test::kVocab, 101);
  SyncEngine e0(node_config(0, {p0, p1}, 20), m0.params);
  SyncEngine e1(node_config(1, {p0, p1}, 20), m1.params);
  // 300 connections that never finish the HTTP/2 preface (slow-loris), and 20 that send garbage.
  std::vector<int> held;
  for (int i = 0; i < 300; ++i) {
    const int fd = connect_to(i % 2 ? p1 : p0);
    ASSERT_GE(fd, 0);
    ::send(fd, "PRI * HTTP/2.0\r\n", 16, MSG_NOSIGNAL);  // a third of the preface, then nothing
    held.push_back(fd);
  }
  std::string junk(4096, '\0');
  for (std::size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<char>((i * 131 + 7) & 0xff);
  for (int i = 0; i < 20; ++i) {
    const int fd = connect_to(i % 2 ? p1 : p0);
    ASSERT_GE(fd, 0);
    ::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
    ::close(fd);
  }
  const auto want_shared_from = m0.values();
  auto r1 = std::async(std::launch::async, [&] { return e1.run_round(1, 1); });
  const SyncRoundReport r0 = e0.run_round(1, 1);
  const SyncRoundReport r1r = r1.get();
  for (int fd : held) ::close(fd);
  EXPECT_TRUE(r0.skipped.empty());
  EXPECT_TRUE(r1r.skipped.empty());
  EXPECT_EQ(m0.values(), m1.values());  // both hold the round's result
  EXPECT_NE(m0.values(), want_shared_from);
}

}  // namespace
}  // namespace spes
