#include "identity/pki.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <filesystem>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/c_ptr.h"
#include "common/private_files.h"
#include "common/status_macros.h"

namespace minions::pki {
namespace {

namespace fs = std::filesystem;

using Key = CPtr<EVP_PKEY, EVP_PKEY_free>;
using Cert = CPtr<X509, X509_free>;
using Bio = CPtr<BIO, BIO_free>;

absl::Status OpenSslError(const std::string& what) {
  char buffer[256] = "";
  ERR_error_string_n(ERR_get_error(), buffer, sizeof(buffer));
  return absl::InternalError(absl::StrCat("openssl: ", what, ": ", buffer));
}

bool IsIpAddress(const std::string& host) {
  unsigned char buffer[16];
  return inet_pton(AF_INET, host.c_str(), buffer) == 1 || inet_pton(AF_INET6, host.c_str(), buffer) == 1;
}

absl::Status ValidateHost(const std::string& host) {
  if (IsIpAddress(host)) return absl::OkStatus();
  bool ok = !host.empty() && host.size() <= 253;
  for (char c : host) {
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                c == '.' || c == '*');
  }
  if (!ok) return absl::InvalidArgumentError(absl::StrCat("'", host, "' is neither a host name nor an IP address"));
  return absl::OkStatus();
}

absl::StatusOr<Key> NewKey() {
  Key key(EVP_EC_gen("P-256"));
  if (!key) return OpenSslError("cannot make a P-256 key");
  return key;
}

// A PEM file: the owner's alone (keys: WritePrivateFile) or anyone's (certificates), replaced
// atomically either way.
absl::Status WritePem(const std::string& path, bool secret, const std::function<int(BIO*)>& write) {
  Bio bio(BIO_new(BIO_s_mem()));
  if (!bio || write(bio.get()) != 1) return OpenSslError(absl::StrCat("cannot encode ", path));
  char* data = nullptr;
  long size = BIO_get_mem_data(bio.get(), &data);
  RETURN_IF_ERROR(WritePrivateFile(path, std::string_view(data, static_cast<size_t>(size))));
  if (!secret && chmod(path.c_str(), 0644) != 0) return absl::PermissionDeniedError(absl::StrCat("cannot chmod ", path));
  return absl::OkStatus();
}

// Reads the PEM object in `path` (its kind in words: `what`) with OpenSSL's `read`.
template <typename Ptr, typename Read>
absl::StatusOr<Ptr> ReadPemObject(const std::string& path, const char* what, Read read) {
  Bio bio(BIO_new_file(path.c_str(), "r"));
  if (!bio) return absl::InvalidArgumentError(absl::StrCat("cannot read ", path));
  Ptr object(read(bio.get(), nullptr, nullptr, nullptr));
  if (!object) return OpenSslError(absl::StrCat("cannot read the ", what, " ", path));
  return object;
}

absl::StatusOr<Key> ReadKey(const std::string& path) { return ReadPemObject<Key>(path, "key", PEM_read_bio_PrivateKey); }

absl::StatusOr<Cert> ReadCert(const std::string& path) {
  return ReadPemObject<Cert>(path, "certificate", PEM_read_bio_X509);
}

absl::Status AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_nconf_nid(nullptr, &ctx, nid, value.c_str());
  if (!ext) return OpenSslError(absl::StrCat("bad extension ", value));
  int added = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  if (added != 1) return OpenSslError("cannot add an extension");
  return absl::OkStatus();
}

// A certificate for `key` named `common_name`, valid from `now` for `validity`, with a random
// serial; the caller adds extensions and signs.
absl::StatusOr<Cert> NewCert(EVP_PKEY* key, const std::string& common_name, absl::Time now, absl::Duration validity) {
  Cert cert(X509_new());
  if (!cert) return OpenSslError("X509_new");
  X509_set_version(cert.get(), 2);  // v3
  unsigned char serial[16];
  if (RAND_bytes(serial, sizeof(serial)) != 1) return OpenSslError("no randomness for a serial");
  serial[0] &= 0x7f;  // positive
  BIGNUM* bn = BN_bin2bn(serial, sizeof(serial), nullptr);
  ASN1_INTEGER* asn1_serial = BN_to_ASN1_INTEGER(bn, nullptr);
  X509_set_serialNumber(cert.get(), asn1_serial);
  ASN1_INTEGER_free(asn1_serial);
  BN_free(bn);
  // A minute of slack for clocks that disagree a little.
  const time_t not_before = absl::ToTimeT(now - absl::Minutes(1));
  const time_t not_after = absl::ToTimeT(now + validity);
  if (!ASN1_TIME_set(X509_getm_notBefore(cert.get()), not_before) ||
      !ASN1_TIME_set(X509_getm_notAfter(cert.get()), not_after)) {
    return OpenSslError("cannot set the validity");
  }
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("Minions"), -1, -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(common_name.c_str()),
                             -1, -1, 0);
  if (X509_set_pubkey(cert.get(), key) != 1) return OpenSslError("cannot set the public key");
  return cert;
}

std::string HostName() {
  char name[256] = "";
  if (gethostname(name, sizeof(name) - 1) != 0) return "";
  return name;
}

}  // namespace

std::vector<std::string> ServerNames(const std::vector<std::string>& hosts) {
  std::vector<std::string> names;
  auto add = [&](const std::string& name) {
    if (!name.empty() && std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  };
  for (const auto& host : hosts) add(host);
  add("localhost");
  add("127.0.0.1");
  add("::1");
  add(HostName());
  return names;
}

absl::StatusOr<Files> Init(const InitOptions& options, absl::Time now) {
  if (options.dir.empty()) return absl::InvalidArgumentError("say where the certificates go (--dir)");
  const std::vector<std::string> names = ServerNames(options.hosts);
  for (const auto& name : names) {
    if (auto valid = ValidateHost(name); !valid.ok()) return valid;
  }
  RETURN_IF_ERROR(MakePrivateDirectories(options.dir));
  Files files{options.dir + "/ca.pem", options.dir + "/ca-key.pem", options.dir + "/server.pem",
              options.dir + "/server-key.pem", false};

  Key ca_key;
  Cert ca_cert;
  if (fs::exists(files.ca_cert) && fs::exists(files.ca_key)) {
    auto key = ReadKey(files.ca_key);
    if (!key.ok()) return key.status();
    auto cert = ReadCert(files.ca_cert);
    if (!cert.ok()) return cert.status();
    ca_key = std::move(*key);
    ca_cert = std::move(*cert);
    if (X509_check_private_key(ca_cert.get(), ca_key.get()) != 1) {
      return absl::FailedPreconditionError(absl::StrCat(files.ca_key, " is not the key of ", files.ca_cert));
    }
  } else {
    auto key = NewKey();
    if (!key.ok()) return key.status();
    ca_key = std::move(*key);
    unsigned char tag[4];
    RAND_bytes(tag, sizeof(tag));
    const std::string common_name =
        absl::StrCat("Minions pool CA ", absl::StrFormat("%02x%02x%02x%02x", tag[0], tag[1], tag[2], tag[3]));
    auto cert = NewCert(ca_key.get(), common_name, now, options.ca_validity);
    if (!cert.ok()) return cert.status();
    ca_cert = std::move(*cert);
    X509_set_issuer_name(ca_cert.get(), X509_get_subject_name(ca_cert.get()));
    for (auto [nid, value] : {std::pair{NID_basic_constraints, "critical,CA:TRUE,pathlen:0"},
                              std::pair{NID_key_usage, "critical,keyCertSign,cRLSign"},
                              std::pair{NID_subject_key_identifier, "hash"}}) {
      if (auto added = AddExtension(ca_cert.get(), ca_cert.get(), nid, value); !added.ok()) return added;
    }
    if (X509_sign(ca_cert.get(), ca_key.get(), EVP_sha256()) == 0) return OpenSslError("cannot sign the CA");
    if (auto s = WritePem(files.ca_key, true,
                          [&](BIO* b) { return PEM_write_bio_PrivateKey(b, ca_key.get(), nullptr, nullptr, 0, nullptr, nullptr); });
        !s.ok()) {
      return s;
    }
    if (auto s = WritePem(files.ca_cert, false, [&](BIO* b) { return PEM_write_bio_X509(b, ca_cert.get()); }); !s.ok()) {
      return s;
    }
    files.ca_created = true;
  }

  auto server_key = NewKey();
  if (!server_key.ok()) return server_key.status();
  auto server_cert = NewCert(server_key->get(), names.front(), now, options.server_validity);
  if (!server_cert.ok()) return server_cert.status();
  X509_set_issuer_name(server_cert->get(), X509_get_subject_name(ca_cert.get()));
  std::vector<std::string> alt_names;
  for (const auto& name : names) alt_names.push_back(absl::StrCat(IsIpAddress(name) ? "IP:" : "DNS:", name));
  for (auto [nid, value] : {std::pair{NID_basic_constraints, std::string("critical,CA:FALSE")},
                            std::pair{NID_key_usage, std::string("critical,digitalSignature,keyEncipherment")},
                            std::pair{NID_ext_key_usage, std::string("serverAuth")},
                            std::pair{NID_authority_key_identifier, std::string("keyid")},
                            std::pair{NID_subject_alt_name, absl::StrJoin(alt_names, ",")}}) {
    if (auto added = AddExtension(server_cert->get(), ca_cert.get(), nid, value); !added.ok()) return added;
  }
  if (X509_sign(server_cert->get(), ca_key.get(), EVP_sha256()) == 0) return OpenSslError("cannot sign");
  if (auto s = WritePem(files.server_key, true,
                        [&](BIO* b) {
                          return PEM_write_bio_PrivateKey(b, server_key->get(), nullptr, nullptr, 0, nullptr, nullptr);
                        });
      !s.ok()) {
    return s;
  }
  if (auto s = WritePem(files.server_cert, false, [&](BIO* b) { return PEM_write_bio_X509(b, server_cert->get()); });
      !s.ok()) {
    return s;
  }
  return files;
}

}  // namespace minions::pki
