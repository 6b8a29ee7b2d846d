// Bytes per sync round by count: SPES peer-to-peer against the reference star protocol (every
// node uploads fp32 shared + its own experts to one server, which sends every node the full fp32
// model). S = shared values, X = values of one expert over all layers, N nodes, E experts.
#pragma once

namespace spes {

struct Traffic {
  double total = 0;    // bytes moved by all nodes in one round
  double busiest = 0;  // the most bytes through one link in one direction
};

Traffic reference_star_traffic(double S, double X, int N, int E);
// SPES: per node in = out = 2·S·(N−1)/N (slice reduce + fetch) + (E − E/N) experts, at the
// given bytes per value of the shared and expert encodings; the averaged slices (the fetch) at
// `averaged_bytes_per_value` where given (>= 0: sparse averages have their own density).
Traffic spes_traffic(double S, double X, int N, int E, double shared_bytes_per_value, double expert_bytes_per_value,
                     double averaged_bytes_per_value = -1);

}  // namespace spes
