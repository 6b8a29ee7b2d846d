// Per-node identities from one run CA (docs/security.md). `spes ca` makes the run's CA and a
// certificate per node, one for the coordinator and one for operators; each names the run
// (subject O) and its holder (subject CN: "node-3", "coordinator", "admin"), and carries the DNS
// name "<holder>.spes" that callers check when they connect (TLS target name), besides any real
// host names or addresses. With such certificates a service binds every call to the caller's
// certificate: node 2's certificate cannot ask as node 3. OpenSSL does the cryptography.
#pragma once

#include <string>
#include <vector>

namespace spes {

struct PemPair {
  std::string cert_pem, key_pem;
};

// What a spes certificate says about its holder. Empty (no run) for a certificate that carries no
// spes identity, e.g. one shared certificate for every node (scripts/make_test_ca.sh).
struct CertIdentity {
  std::string run;   // subject O
  std::string name;  // subject CN
  int node = -1;     // the N of "node-N", else -1
  bool empty() const { return run.empty(); }
  bool is_node() const { return node >= 0; }
  std::string describe() const;  // "node 3 of run 'x'", "coordinator of run 'x'", "no spes identity"
};

// Holder names: "node-3", "coordinator", "admin".
std::string node_holder_name(int node_id);
inline constexpr const char* kCoordinatorHolder = "coordinator";
inline constexpr const char* kAdminHolder = "admin";
// The DNS name a caller expects in the certificate of `holder` (TLS target name override).
std::string holder_dns_name(const std::string& holder);

// A fresh run CA (EC P-256, self-signed, CN "spes CA", O = run), valid `days` from now.
PemPair make_run_ca(const std::string& run, int days);
// A certificate for `holder` signed by `ca` (whose O names the run), for server and client use, with
// DNS:<holder>.spes plus `hosts` (IP addresses and DNS names). Valid from now + valid_from_s
// (negative: in the past; tests use it for expired certificates) for `days`.
PemPair issue_certificate(const PemPair& ca, const std::string& holder, const std::vector<std::string>& hosts,
                          int days, long valid_from_s = 0);

// The identity in a PEM certificate; Error(Config) if it is not a readable certificate.
CertIdentity certificate_identity(const std::string& cert_pem);

// Labels for error messages, e.g. "sync.tls.cert ('tls/node-1.pem')".
struct CredentialLabels {
  std::string ca, cert, key;
};
// Checks what a node or coordinator loads before it serves anything: each file parses, the key is
// the certificate's, the certificate is issued by the CA and valid now. Returns the certificate's
// identity; a certificate with one must name the same run as its CA. Error(Config) naming the file.
CertIdentity verify_credentials(const std::string& ca_pem, const std::string& cert_pem, const std::string& key_pem,
                               const CredentialLabels& labels);

}  // namespace spes
