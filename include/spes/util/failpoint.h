// Fault-injection points for the reliability tests (tests/integration/phase_faults.sh, the soak
// script): with SPES_FAILPOINT=NAME[@N][:SECONDS] in the environment, the N-th time (default the
// first) the process reaches the point NAME it logs "failpoint NAME reached: holding S s" and holds there S seconds
// (default 10) or until a stop signal arrives, so that a test can signal or kill the process in
// exactly that phase. Without the variable a point costs a branch on a value read once.
//
// Points: step (mid-step: gradients computed, optimizer not yet stepped), serve (half of a
// stream sent to a peer), pull (the first chunk of a stream from a peer received), checkpoint (a
// shard's model file written, its optimizer state and manifest not yet).
#pragma once

#include <cstdint>
#include <string_view>

namespace spes {

void failpoint(std::string_view name);

// A dishonest node for the robust-merge experiments (docs/security.md): with
// SPES_POISON=experts:F[@NODE] the node (only node NODE, when given) scales the experts it
// publishes by F more every round (F^(r-R+1) in round r: a drift that compounds, while the node
// itself trains honest weights); with SPES_POISON=shared:F its contributions to the shared average
// by F; SPES_POISON_FROM=R starts at round R (default 1). Returns the factor for that part in that
// round, 1 when not armed.
double poison_factor(std::string_view part, int node_id, std::uint64_t round);

}  // namespace spes
