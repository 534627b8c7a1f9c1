// An S3 server that checks SigV4 signatures (@20minutes/s3rver, a maintained fork of s3rver whose
// signature check is implemented; s3rver 3.7, the tests' main S3 server, checks none), for the
// tests that need a signature refused (tests/blob/sigv4_test.cc, docs/security.md 40.5c).
//   node s3_strict_server.mjs DIR   serves DIR on 127.0.0.1 at a free port, bucket "minions-test",
//                                   keys "S3RVER"/"S3RVER"; prints its endpoint, then runs until
//                                   its stdin closes (the test that started it ends).
import S3rver from '@20minutes/s3rver';

const server = new S3rver({
  port: 0,
  address: '127.0.0.1',
  silent: true,
  directory: process.argv[2],
  configureBuckets: [{ name: 'minions-test' }],
});
const { port } = await server.run();
console.log(`http://127.0.0.1:${port}`);
process.stdin.resume();
process.stdin.on('end', () => process.exit(0));
