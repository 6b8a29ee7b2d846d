// One node's side of SPES synchronization: its SyncService (serving its snapshots) and the round
// protocol (see docs/protocol.md). Torch-free: it reads and writes the model through a ParamSet.
//
// Round r on every node, in lock-step:
//   1. publish snapshot r: own experts and the node's copy of every shared slice, encoded once;
//   2. reduce: fetch this node's slice of the shared parameters from every peer and average them
//      in fp32 in node-id order; publish the average;
//   3. gather: fetch every other averaged slice from its aggregator and every other expert from
//      its owner, validating each tensor before use;
//   4. load into the model (optimizer state is never touched), then the merge warm-up if due.
// A peer that does not answer in time, or whose payload fails validation, is skipped for the
// round: its experts keep their last synced value and the shared mean is over those who answered.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "spes/config/config.h"
#include "spes/sync/carry.h"
#include "spes/sync/params.h"

namespace spes {

struct PeerSkip {
  int peer = 0;
  std::string reason;
};

struct PeerBytes {
  int peer = 0;                 // node id
  std::uint64_t in = 0;         // payload bytes received from it this round
  std::uint64_t out_total = 0;  // payload bytes this node's service has sent it so far
};

// The fragment argument of a round that carries the whole model.
inline constexpr int kWholeModel = -1;

struct SyncRoundReport {
  std::uint64_t round = 0;
  std::int64_t step = 0;
  int fragment = kWholeModel;     // what the round carried (sync.fragments)
  double seconds = 0;
  double deadline_s = 0;          // the deadline it ran under (docs/protocol.md, "Round deadline")
  std::uint64_t resumed_streams = 0;  // transfers that broke off and resumed at the chunk reached
  double encode_s = 0;            // of `seconds`: encoding this node's payloads (selection, quantization)
  std::uint64_t bytes_in = 0;     // payload bytes this node received this round
  std::uint64_t bytes_out = 0;    // payload bytes its service has sent so far (all rounds)
  std::vector<PeerSkip> skipped;  // peers skipped this round and why
  std::vector<PeerBytes> by_peer; // every other member
  bool merged = false;
  double merge_alpha = 0;
};

// Where a SyncEngine stands in the coordinator's membership (all defaults: static peers).
struct SyncMembership {
  std::uint64_t plan = 0;         // plan version, checked on every call (0 = static peers)
  std::uint64_t first_round = 1;  // the plan's first round (effective_round): earlier ones are not served
  std::vector<int> observers;     // ids of the nodes catching up from first_round (see finish())
  // The plan's first round as every member sees it (effective_round; 0 = none): with fragments
  // it carries the whole model, so that a node catching up from it gets everything.
  std::uint64_t whole_round = 0;
};

class SyncEngine {
 public:
  // Reads the run token and TLS files, binds the sync service (Error(Io) if the port is taken).
  // The peers are config.sync.peers (any ids); a node not among them is an observer: it serves
  // nothing and its run_round() fetches the members' result of that round (catching up).
  SyncEngine(const Config& config, ParamSet params, SyncMembership membership = {});
  ~SyncEngine();
  SyncEngine(const SyncEngine&) = delete;
  SyncEngine& operator=(const SyncEngine&) = delete;

  // Runs round `round` (1, 2, ...) at optimizer step `step`; returns when this node holds the
  // round's result. Throws only on internal errors: peers' failures become skips. `timeout_s`:
  // the round's deadline from now (0 = adaptive: sync.deadline_factor × the slowest recent clean
  // round, within [sync.min_round_timeout_s, sync.round_timeout_s]). `fragment`: what it carries,
  // as fragment_of() says (every node must pass the same); kWholeModel = every parameter.
  SyncRoundReport run_round(std::uint64_t round, std::int64_t step, double timeout_s = 0,
                            int fragment = kWholeModel);

  // sync.fragments (docs/protocol.md, "Fragments"): 1 = every round carries the whole model.
  int fragments() const;
  // What round `round` carries: fragment (round - 1) % fragments, or kWholeModel when there is
  // one fragment, for the plan's first round (SyncMembership::whole_round) and for the run's
  // last round (`last`), which leaves every node with the same weights.
  int fragment_of(std::uint64_t round, bool last) const;
  // The tensors (ParamSet indices, ascending) a round of `fragment` reads and writes.
  const std::vector<std::size_t>& tensors_of(int fragment) const;

  // Before leaving: waits (up to timeout_s) until every peer, and every observer, has fetched its
  // part of the last round from this node, so that a node finishing (or switching plans) first
  // does not make the others skip it or leave an observer without the round it catches up from.
  void finish(double timeout_s);

  // The residuals and baseline rounds after the last round (nullopt with fp32 encodings, which
  // carry nothing). Save it only with the weights of right after that round.
  std::optional<SyncCarry> carry() const;
  // Before the first round of a resumed run whose weights are those right after carry.round:
  // takes the residuals and baseline rounds back. Returns false, changing nothing, when the carry
  // does not fit this engine (other peers, encodings or sizes) or it is an observer.
  bool restore(const SyncCarry& carry);
  int port() const;
  std::uint64_t bytes_sent() const;
  std::uint64_t bytes_received() const;
  // Payload bytes received / sent (by this node's service) so far, by the encoding they travelled
  // in (fp32, bf16, int8_delta).
  std::map<std::string, std::uint64_t> bytes_received_by_encoding() const;
  std::map<std::string, std::uint64_t> bytes_sent_by_encoding() const;
  std::uint64_t calls_refused() const;
  // Of those, the calls only a hostile or misconfigured caller provokes (token, run, arguments),
  // and the last one's reason ("" before the first).
  std::uint64_t suspicious_calls() const;
  std::string last_suspicious_call() const;
  // Peer id → rounds it was skipped in.
  std::vector<std::uint64_t> skip_counts() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace spes
