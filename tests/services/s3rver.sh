#!/usr/bin/env bash
# A real S3 server for the tests: s3rver (npm, pinned in tests/js/package.json).
#   s3rver.sh start DIR PORT   start it on 127.0.0.1:PORT (0: any free port), data under DIR/data,
#                              bucket "minions-test" created; waits until it answers. Writes
#                              DIR/endpoint (http://127.0.0.1:PORT), DIR/pid, DIR/s3rver.log.
#   s3rver.sh stop DIR         stop it.
# Access key and secret are both "S3RVER". Virtual-hosted addressing works through
# http://s3.localhost:PORT (buckets as <bucket>.s3.localhost, which resolves to 127.0.0.1).
# Node runs with --openssl-legacy-provider: s3rver encrypts ListObjectsV2 continuation tokens with DES.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
js="$here/../js"
cmd="${1:-}"
dir="${2:-}"
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 start DIR PORT | stop DIR" >&2; exit 2; }

stop() {
  if [ -f "$dir/pid" ]; then
    pid="$(cat "$dir/pid")"
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    rm -f "$dir/pid"
  fi
  rm -f "$dir/endpoint"
}

case "$cmd" in
  start)
    port="${3:-0}"
    command -v node >/dev/null || { echo "s3rver: node is not installed (Node 20 is needed)" >&2; exit 1; }
    # scripts/setup installs these; this is the fallback for a bare build. Several fixtures may
    # start at once: one installs, under a lock, and the others wait for it.
    (
      flock 9
      if [ ! -f "$js/node_modules/.minions-installed" ]; then
        echo "s3rver: installing tests/js packages (npm ci)" >&2
        (cd "$js" && npm ci --no-audit --no-fund >&2) || { echo "s3rver: npm ci in $js failed" >&2; exit 1; }
        touch "$js/node_modules/.minions-installed"
      fi
    ) 9>"$js/.npm-install.lock" || exit 1
    mkdir -p "$dir"
    stop
    rm -rf "$dir/data"
    mkdir -p "$dir/data"
    nohup node --openssl-legacy-provider --input-type=commonjs -e '
      const S3rver = require(process.argv[1]);
      const FilesystemStore = require(process.argv[1] + "/lib/stores/filesystem");
      const fs = require("fs");
      // S3 replaces objects atomically; s3rver rewrites the file in place and its metadata apart,
      // so a GET racing a PUT can mix the two. Model S3: serialise reads and writes of one key
      // (a read holds its key until its body stream closes).
      const tails = new Map();
      function lock(id) {
        const previous = tails.get(id) || Promise.resolve();
        let release;
        const mine = new Promise((resolve) => { let done = false; release = () => { if (!done) { done = true; resolve(); } }; });
        const tail = previous.then(() => mine);
        tails.set(id, tail);
        tail.then(() => { if (tails.get(id) === tail) tails.delete(id); });
        return previous.then(() => release);
      }
      const { putObject, getObject } = FilesystemStore.prototype;
      FilesystemStore.prototype.putObject = async function (object) {
        const release = await lock(object.bucket + "/" + object.key);
        try { return await putObject.call(this, object); } finally { release(); }
      };
      FilesystemStore.prototype.getObject = async function (bucket, key, options) {
        const release = await lock(bucket + "/" + key);
        try {
          const object = await getObject.call(this, bucket, key, options);
          const stream = object && object.content;
          if (stream && typeof stream.on === "function") {
            stream.on("close", release);
            stream.on("error", release);
          } else {
            release();
          }
          return object;
        } catch (e) { release(); throw e; }
      };
      const [dir, port] = [process.argv[2], Number(process.argv[3])];
      new S3rver({ address: "127.0.0.1", port, silent: true, directory: dir + "/data",
                   serviceEndpoint: "localhost", configureBuckets: [{ name: "minions-test" }] })
        .run()
        .then((address) => {
          fs.writeFileSync(dir + "/endpoint.tmp", `http://127.0.0.1:${address.port}\n`);
          fs.renameSync(dir + "/endpoint.tmp", dir + "/endpoint");
        })
        .catch((e) => { console.error("s3rver failed to start:", e); process.exit(1); });
    ' "$js/node_modules/s3rver" "$dir" "$port" >"$dir/s3rver.log" 2>&1 &
    echo $! >"$dir/pid"
    for _ in $(seq 150); do
      if [ -f "$dir/endpoint" ]; then
        endpoint="$(cat "$dir/endpoint")"
        if curl -s -o /dev/null "$endpoint/minions-test?list-type=2" 2>/dev/null; then
          echo "s3rver: $endpoint (bucket minions-test)"
          exit 0
        fi
      fi
      if ! kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
        echo "s3rver: the server exited; its log ($dir/s3rver.log):" >&2
        cat "$dir/s3rver.log" >&2
        exit 1
      fi
      sleep 0.1
    done
    echo "s3rver: no answer after 15 s; log ($dir/s3rver.log):" >&2
    cat "$dir/s3rver.log" >&2
    stop
    exit 1
    ;;
  stop)
    stop
    ;;
  *)
    echo "usage: $0 start DIR PORT | stop DIR" >&2
    exit 2
    ;;
esac
