// Copies a file into and out of an S3 server with an independent client (minio), timing each way:
// the baseline of the model cold-start benchmark (bench/pool_bench.cc --mode cold-model).
// Prints one JSON line {"put_seconds": P, "get_seconds": G, "bytes": N} or {"error": "..."}.
//
// node minio_model_copy.mjs --endpoint http://127.0.0.1:PORT --bucket B --key K --file PATH --out PATH
// Credentials: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, default S3RVER/S3RVER. Path-style, no TLS.
import { statSync } from "node:fs";
import { args, minioClient } from "./minio_client.mjs";

try {
  const a = args(process.argv.slice(2));
  const client = minioClient(a.endpoint, a.region, {
    // One PUT for files up to 5 GiB: s3rver refuses the multipart form minio uses for large ones.
    partSize: 5 * 1024 * 1024 * 1024,
  });
  let t = process.hrtime.bigint();
  await client.fPutObject(a.bucket, a.key, a.file);
  const put = Number(process.hrtime.bigint() - t) / 1e9;
  t = process.hrtime.bigint();
  await client.fGetObject(a.bucket, a.key, a.out);
  const get = Number(process.hrtime.bigint() - t) / 1e9;
  console.log(JSON.stringify({ put_seconds: put, get_seconds: get, bytes: statSync(a.out).size }));
} catch (e) {
  console.log(JSON.stringify({ error: String(e && e.message ? e.message : e) }));
  process.exit(1);
}
