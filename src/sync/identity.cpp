#include "spes/sync/identity.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <arpa/inet.h>

#include <memory>

#include "spes/util/error.h"

namespace spes {
namespace {

template <typename T, void (*Free)(T*)>
struct Deleter {
  void operator()(T* p) const { Free(p); }
};
using Bio = std::unique_ptr<BIO, Deleter<BIO, BIO_free_all>>;
using Key = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY, EVP_PKEY_free>>;
using Cert = std::unique_ptr<X509, Deleter<X509, X509_free>>;
using Store = std::unique_ptr<X509_STORE, Deleter<X509_STORE, X509_STORE_free>>;
using StoreCtx = std::unique_ptr<X509_STORE_CTX, Deleter<X509_STORE_CTX, X509_STORE_CTX_free>>;

// The reason OpenSSL left in its error queue (cleared), or `fallback`.
std::string openssl_reason(const char* fallback) {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return fallback;
  char text[256];
  ERR_error_string_n(code, text, sizeof text);
  return text;
}

Bio read_bio(const std::string& pem) {
  return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// nullptr when `pem` holds no certificate.
Cert parse_cert(const std::string& pem) {
  auto bio = read_bio(pem);
  Cert c(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  return c;
}

Key parse_key(const std::string& pem) {
  auto bio = read_bio(pem);
  Key k(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  return k;
}

std::string to_pem(X509* cert) {
  Bio bio(BIO_new(BIO_s_mem()));
  PEM_write_bio_X509(bio.get(), cert);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<std::size_t>(n));
}

std::string to_pem(EVP_PKEY* key) {
  Bio bio(BIO_new(BIO_s_mem()));
  PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<std::size_t>(n));
}

Key new_key() {
  Key k(EVP_EC_gen("P-256"));
  if (!k) raise(ErrorKind::Io, "cannot make a key: {}", openssl_reason("EVP_EC_gen failed"));
  return k;
}

std::string name_entry(const X509_NAME* name, int nid) {
  const int i = X509_NAME_get_index_by_NID(name, nid, -1);
  if (i < 0) return {};
  const ASN1_STRING* s = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, i));
  unsigned char* utf8 = nullptr;
  const int n = ASN1_STRING_to_UTF8(&utf8, s);
  if (n < 0) return {};
  std::string out(reinterpret_cast<char*>(utf8), static_cast<std::size_t>(n));
  OPENSSL_free(utf8);
  return out;
}

void add_extension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (!ext) raise(ErrorKind::Config, "bad certificate extension '{}': {}", value, openssl_reason("rejected"));
  X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
}

// A certificate for `key` with subject (cn, run), serial random, valid from now + from_s for days.
Cert new_cert(EVP_PKEY* key, const std::string& cn, const std::string& run, long from_s, int days) {
  Cert cert(X509_new());
  X509_set_version(cert.get(), 2);
  unsigned char serial[16];
  RAND_bytes(serial, sizeof serial);
  serial[0] &= 0x7f;  // positive
  BIGNUM* bn = BN_bin2bn(serial, sizeof serial, nullptr);
  BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get()));
  BN_free(bn);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), from_s);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), from_s + static_cast<long>(days) * 86400);
  X509_set_pubkey(cert.get(), key);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_UTF8, reinterpret_cast<const unsigned char*>(run.c_str()), -1, -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8, reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  return cert;
}

void sign(X509* cert, EVP_PKEY* key) {
  if (X509_sign(cert, key, EVP_sha256()) <= 0)
    raise(ErrorKind::Io, "cannot sign the certificate: {}", openssl_reason("X509_sign failed"));
}

bool is_ip_address(const std::string& host) {
  unsigned char buf[16];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

bool valid_holder(const std::string& h) {
  if (h.empty() || h.size() > 63) return false;
  for (char c : h)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') return false;
  return true;
}

}  // namespace

std::string CertIdentity::describe() const {
  if (empty()) return "no spes identity";
  return (is_node() ? "node " + std::to_string(node) : name) + " of run '" + run + "'";
}

std::string node_holder_name(int node_id) { return "node-" + std::to_string(node_id); }

std::string holder_dns_name(const std::string& holder) { return holder + ".spes"; }

PemPair make_run_ca(const std::string& run, int days) {
  if (run.empty()) raise(ErrorKind::Config, "a run CA needs a run id");
  if (days <= 0) raise(ErrorKind::Config, "a certificate must be valid for at least one day (got {})", days);
  Key key = new_key();
  Cert cert = new_cert(key.get(), "spes CA", run, 0, days);
  X509_set_issuer_name(cert.get(), X509_get_subject_name(cert.get()));
  add_extension(cert.get(), cert.get(), NID_basic_constraints, "critical,CA:TRUE,pathlen:0");
  add_extension(cert.get(), cert.get(), NID_key_usage, "critical,keyCertSign,cRLSign");
  add_extension(cert.get(), cert.get(), NID_subject_key_identifier, "hash");
  sign(cert.get(), key.get());
  return {to_pem(cert.get()), to_pem(key.get())};
}

PemPair issue_certificate(const PemPair& ca, const std::string& holder, const std::vector<std::string>& hosts,
                          int days, long valid_from_s) {
  if (!valid_holder(holder))
    raise(ErrorKind::Config, "'{}' is not a holder name (letters, digits and '-', e.g. node-3)", holder);
  if (days <= 0) raise(ErrorKind::Config, "a certificate must be valid for at least one day (got {})", days);
  Cert ca_cert = parse_cert(ca.cert_pem);
  Key ca_key = parse_key(ca.key_pem);
  if (!ca_cert) raise(ErrorKind::Config, "the CA certificate is not a PEM certificate");
  if (!ca_key) raise(ErrorKind::Config, "the CA key is not a PEM private key");
  if (X509_check_private_key(ca_cert.get(), ca_key.get()) != 1) {
    ERR_clear_error();
    raise(ErrorKind::Config, "the CA key does not belong to the CA certificate");
  }
  const std::string run = name_entry(X509_get_subject_name(ca_cert.get()), NID_organizationName);
  if (run.empty()) raise(ErrorKind::Config, "the CA names no run (subject O): make it with `spes ca init`");
  Key key = new_key();
  Cert cert = new_cert(key.get(), holder, run, valid_from_s, days);
  X509_set_issuer_name(cert.get(), X509_get_subject_name(ca_cert.get()));
  std::string san = "DNS:" + holder_dns_name(holder);
  for (const auto& h : hosts) {
    if (h.empty() || h.find_first_of(", \t") != std::string::npos)
      raise(ErrorKind::Config, "'{}' is not a host name or address", h);
    san += (is_ip_address(h) ? ",IP:" : ",DNS:") + h;
  }
  add_extension(cert.get(), ca_cert.get(), NID_basic_constraints, "critical,CA:FALSE");
  add_extension(cert.get(), ca_cert.get(), NID_key_usage, "critical,digitalSignature,keyAgreement");
  add_extension(cert.get(), ca_cert.get(), NID_ext_key_usage, "serverAuth,clientAuth");
  add_extension(cert.get(), ca_cert.get(), NID_subject_alt_name, san);
  add_extension(cert.get(), ca_cert.get(), NID_authority_key_identifier, "keyid:always");
  sign(cert.get(), ca_key.get());
  return {to_pem(cert.get()), to_pem(key.get())};
}

namespace {

CertIdentity identity_of(X509* cert) {
  CertIdentity id;
  const X509_NAME* subject = X509_get_subject_name(cert);
  id.run = name_entry(subject, NID_organizationName);
  id.name = name_entry(subject, NID_commonName);
  if (id.run.empty() || !valid_holder(id.name)) return {};
  if (id.name.rfind("node-", 0) == 0) {
    const std::string digits = id.name.substr(5);
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) return {};
    id.node = std::stoi(digits);
  }
  return id;
}

}  // namespace

CertIdentity certificate_identity(const std::string& cert_pem) {
  Cert cert = parse_cert(cert_pem);
  if (!cert) raise(ErrorKind::Config, "not a PEM certificate");
  return identity_of(cert.get());
}

CertIdentity verify_credentials(const std::string& ca_pem, const std::string& cert_pem, const std::string& key_pem,
                               const CredentialLabels& labels) {
  Cert ca = parse_cert(ca_pem);
  if (!ca) raise(ErrorKind::Config, "{} is not a PEM certificate", labels.ca);
  Cert cert = parse_cert(cert_pem);
  if (!cert) raise(ErrorKind::Config, "{} is not a PEM certificate", labels.cert);
  Key key = parse_key(key_pem);
  if (!key) raise(ErrorKind::Config, "{} is not a PEM private key (or it is encrypted)", labels.key);
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    raise(ErrorKind::Config, "{} is not the key of the certificate {}", labels.key, labels.cert);
  }
  Store store(X509_STORE_new());
  X509_STORE_add_cert(store.get(), ca.get());
  StoreCtx ctx(X509_STORE_CTX_new());
  X509_STORE_CTX_init(ctx.get(), store.get(), cert.get(), nullptr);
  X509_STORE_CTX_set_purpose(ctx.get(), X509_PURPOSE_ANY);
  if (X509_verify_cert(ctx.get()) != 1) {
    const int err = X509_STORE_CTX_get_error(ctx.get());
    ERR_clear_error();
    raise(ErrorKind::Config, "{} does not verify against the CA {}: {}", labels.cert, labels.ca,
          X509_verify_cert_error_string(err));
  }
  CertIdentity id = identity_of(cert.get());
  if (!id.empty()) {
    const std::string ca_run = name_entry(X509_get_subject_name(ca.get()), NID_organizationName);
    if (ca_run != id.run)
      raise(ErrorKind::Config, "{} names run '{}', but its CA {} is for run '{}'", labels.cert, id.run, labels.ca, ca_run);
  }
  return id;
}

}  // namespace spes
