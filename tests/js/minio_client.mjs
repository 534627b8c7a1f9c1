// What the scripts that talk to the test S3 server with an independent client (minio) share: their
// `--name value` arguments, and a minio client for an endpoint URL.
// Credentials: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, default S3RVER/S3RVER. Path-style.
import * as Minio from "minio";

// `--name value` pairs as {name: value}; throws on anything else.
export function args(argv) {
  const out = {};
  for (let i = 0; i < argv.length; i += 2) {
    if (!argv[i].startsWith("--") || i + 1 >= argv.length) throw new Error(`bad argument ${argv[i]}`);
    out[argv[i].slice(2)] = argv[i + 1];
  }
  return out;
}

// A client of the S3 server at `endpoint` (http://HOST:PORT or https://...); `extra` adds options.
export function minioClient(endpoint, region, extra = {}) {
  const url = new URL(endpoint);
  return new Minio.Client({
    endPoint: url.hostname,
    port: Number(url.port || (url.protocol === "https:" ? 443 : 80)),
    useSSL: url.protocol === "https:",
    accessKey: process.env.AWS_ACCESS_KEY_ID || "S3RVER",
    secretKey: process.env.AWS_SECRET_ACCESS_KEY || "S3RVER",
    region: region || "us-east-1",
    pathStyle: true,
    ...extra,
  });
}
