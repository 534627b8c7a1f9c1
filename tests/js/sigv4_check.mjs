// Cross-checks Minions' SigV4 (src/blob/s3/sigv4.cc) against the AWS SDK's signer
// (@smithy/signature-v4, pinned in package.json). Reads JSON lines, one request each, with what
// Minions computed; signs the same request with the SDK; prints every disagreement and exits 1 if
// there is one. No network. Used by tests/blob/sigv4_test.cc.
import { readFileSync } from "node:fs";
import { SignatureV4 } from "@smithy/signature-v4";
import { Sha256 } from "@aws-crypto/sha256-js";

// S3's URI encoding: every byte but A-Z a-z 0-9 - . _ ~ percent-encoded (RFC 3986 unreserved).
const s3Encode = (s) =>
  encodeURIComponent(s).replace(/[!'()*]/g, (c) => "%" + c.charCodeAt(0).toString(16).toUpperCase());

const lines = readFileSync(process.argv[2], "utf8").split("\n").filter((l) => l.length > 0);
let mismatches = 0;
for (const line of lines) {
  const r = JSON.parse(line);
  const signer = new SignatureV4({
    credentials: { accessKeyId: r.access_key, secretAccessKey: r.secret_key, sessionToken: r.session_token || undefined },
    region: r.region,
    service: "s3",
    sha256: Sha256,
    uriEscapePath: false, // S3 paths are encoded once (here, by the caller) and never normalised
    applyChecksum: false,
  });
  const encodedPath = r.path.split("/").map(s3Encode).join("/");
  const report = (what, ours, theirs) => {
    if (ours !== theirs) {
      mismatches++;
      console.log(`MISMATCH ${what} for ${JSON.stringify(r.path)}:\n  minions: ${ours}\n  aws sdk: ${theirs}`);
    }
  };
  report("encoded path", r.ours.encoded_path, encodedPath);
  const query = {};
  for (const [k, v] of r.query) query[k] = v;
  const headers = {};
  for (const [k, v] of r.headers) headers[k] = v;
  const request = { method: r.method, protocol: "https:", hostname: r.host, path: encodedPath, query, headers };
  const signed = await signer.sign(structuredClone(request), { signingDate: new Date(r.time_ms) });
  report("authorization", r.ours.authorization, signed.headers["authorization"]);
  // As S3's presigner does it: the payload is UNSIGNED-PAYLOAD, and only host is signed.
  const presignRequest = { method: r.method, protocol: "https:", hostname: r.host, path: encodedPath,
                           query: { ...query }, headers: { host: r.host, "x-amz-content-sha256": "UNSIGNED-PAYLOAD" } };
  const sha = new Set(["x-amz-content-sha256"]);
  const presigned = await signer.presign(presignRequest, {
    signingDate: new Date(r.time_ms), expiresIn: r.expires, unsignableHeaders: sha, unhoistableHeaders: sha });
  report("presigned signature", r.ours.presigned_signature, presigned.query["X-Amz-Signature"]);
  report("presigned credential", r.ours.presigned_credential, presigned.query["X-Amz-Credential"]);
}
console.log(`checked ${lines.length} requests, ${mismatches} mismatches`);
process.exit(mismatches === 0 ? 0 : 1);
