#include "spes/sync/traffic.h"

namespace spes {

Traffic reference_star_traffic(double S, double X, int N, int E) {
  const double m = static_cast<double>(E) / N, up = 4 * (S + m * X), down = 4 * (S + E * X);
  return {N * (up + down), N * down};  // the server's downlink carries every download
}

Traffic spes_traffic(double S, double X, int N, int E, double shared_bpv, double expert_bpv, double averaged_bpv) {
  const double m = static_cast<double>(E) / N;
  if (averaged_bpv < 0) averaged_bpv = shared_bpv;
  const double per_node = (shared_bpv + averaged_bpv) * S * (N - 1) / N + expert_bpv * (E - m) * X;
  return {N * per_node, per_node};
}

}  // namespace spes
