// Copies one file to and from an S3 server with the minio client, timing each way: the side of
// bench/openai_files_bench.sh that talks to S3 directly. Prints {"put_ms": N, "get_ms": N, "bytes": N}.
//   node minio_copy.mjs ENDPOINT BUCKET KEY FILE
// Credentials: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (default S3RVER). Path-style, no TLS.
import fs from "node:fs";
import { minioClient } from "./minio_client.mjs";

const [endpoint, bucket, key, file] = process.argv.slice(2);
const client = minioClient(endpoint, "us-east-1", {
  // One PUT for the whole file: s3rver lacks ListMultipartUploads, which minio's multipart path
  // asks first.
  partSize: 5 * 1024 * 1024 * 1024,
});
const bytes = fs.statSync(file).size;
let start = process.hrtime.bigint();
await client.fPutObject(bucket, key, file);
const putMs = Number(process.hrtime.bigint() - start) / 1e6;
start = process.hrtime.bigint();
let got = 0;
for await (const chunk of await client.getObject(bucket, key)) got += chunk.length;
const getMs = Number(process.hrtime.bigint() - start) / 1e6;
if (got !== bytes) throw new Error(`read back ${got} bytes of ${bytes}`);
await client.removeObject(bucket, key);
console.log(JSON.stringify({ put_ms: putMs, get_ms: getMs, bytes }));
