// An independent S3 client (minio) against the test server, for interoperability checks:
// reads an object Minions wrote and writes one for Minions to read. Prints one JSON line:
//   {"read": "<the object's text>", "readBytes": N, "wrote": "<key>", "wroteBytes": N}
// or {"error": "..."} with exit code 1.
//
// node minio_check.mjs --endpoint http://127.0.0.1:PORT --bucket B [--read KEY] [--write KEY --data TEXT]
// Credentials: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, default S3RVER/S3RVER. Path-style, no TLS.
import { args, minioClient } from "./minio_client.mjs";

async function readAll(stream) {
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  return Buffer.concat(chunks);
}

try {
  const a = args(process.argv.slice(2));
  const client = minioClient(a.endpoint, a.region);
  const result = {};
  if (a.read) {
    const bytes = await readAll(await client.getObject(a.bucket, a.read));
    result.read = bytes.toString("utf8");
    result.readBytes = bytes.length;
  }
  if (a.write) {
    const data = Buffer.from(a.data ?? "", "utf8");
    await client.putObject(a.bucket, a.write, data, data.length);
    result.wrote = a.write;
    result.wroteBytes = data.length;
  }
  console.log(JSON.stringify(result));
} catch (e) {
  console.log(JSON.stringify({ error: String(e && e.message ? e.message : e) }));
  process.exit(1);
}
