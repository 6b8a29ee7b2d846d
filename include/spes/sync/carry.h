// What a node keeps across a restart, besides its weights, to continue a run with lossy wire
// encodings (bf16, int8 deltas) bit-exactly: the senders' error-feedback residuals and the rounds
// the int8 baselines come from. The baselines themselves are the weights right after `round`, so
// a carry is only valid together with weights saved at that moment (a shard written right after
// the round) — except where the weights also hold sparse residuals (sync.sparse.local_*): there
// the carry holds the baseline values themselves ("base.experts", "base.raw.K"). A plain struct,
// so that checkpoint code can store it without the sync engine.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace spes {

struct SyncCarry {
  std::uint64_t round = 0;                               // the round whose result the weights hold
  std::vector<std::uint64_t> base_slice, base_experts;   // per peer (position in sync.peers)
  std::map<std::string, std::vector<float>> residuals;   // "experts", "average", "raw.K"; "base.…" (see above)
};

}  // namespace spes
